#!/usr/bin/env bash
# -r RATE_LIMIT of convert and commit, as qemu-img takes it: the source's
# data is read no faster than the rate (bytes per second, with k/M/G
# suffixes), holes cost nothing, the output is the one qemu-img writes, and
# a bad rate is refused before anything is made.
#   1. convert -r 4M of a 1 GiB raw source holding 12 MiB of random data in
#      three runs: at least 2.5 s (the first 2 MiB read goes at once, the
#      other five wait 0.5 s each), well under what 1 GiB at 4 MiB/s would
#      take (256 s), and the same bytes as qemu-img convert -r 4M (qemu-img
#      compare) for raw, qcow2 and compressed (-c) outputs.
#   2. -r 0 is no limit; bad rates exit 1 naming the value and leave no
#      destination.
#   3. commit -r 4M of an overlay holding 8 MiB: at least 1.5 s, and the
#      base then reads as the overlay did, as after qemu-img commit -r.
source "$(dirname "$0")/lib.sh"
require_tool "$QEMU_IMG" "$QEMU_IO"
require_thindisk

M=$((1 << 20))
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# elapsed_ms CMD...: runs CMD (it must pass) and prints how long it took.
elapsed_ms() {
  local t0 rc=0
  t0=$(now_ms)
  "$@" >cmd.out 2>&1 || rc=$?
  ((rc == 0)) || { cat cmd.out >&2; fail "$* exited $rc"; }
  echo $(($(now_ms) - t0))
}

log "convert -r: paced, holes free, the same output as qemu-img"
truncate -s 1G src.raw
for at in 0 300 900; do
  head -c $((4 * M)) /dev/urandom | dd of=src.raw bs=1M seek=$at conv=notrunc status=none
done
"$QEMU_IMG" convert -f raw -O raw -r 4M src.raw expect.raw
for out in raw qcow2 qcow2-c; do
  fmt=${out%-c} extra=()
  [[ $out == *-c ]] && extra=(-c)
  ms=$(elapsed_ms "$TD" convert -f raw -O "$fmt" "${extra[@]}" -r 4M src.raw "out.$out")
  log "  $out: ${ms} ms"
  ((ms >= 2500)) || fail "convert -r 4M ($out) of 12 MiB of data took ${ms} ms: the rate allows 2500 at least"
  ((ms < 60000)) || fail "convert -r 4M ($out) took ${ms} ms: 1 GiB of holes must cost nothing"
  ok "$QEMU_IMG" compare -f raw -F "$fmt" expect.raw "out.$out"
done
"$QEMU_IMG" check -q out.qcow2 || fail "the -r qcow2 output does not pass qemu-img check"

log "-r 0 is no limit; bad rates are refused before anything is made"
td convert -q -f raw -O raw -r 0 src.raw zero.raw
assert_same_bytes src.raw zero.raw "convert -r 0"
for bad in abc -1 4Q 1.5.2; do
  rm -f bad.raw
  td_fails "invalid rate limit '$bad'" "convert -r '$bad'" \
    convert -q -f raw -O raw -r "$bad" src.raw bad.raw
  assert_absent bad.raw "convert -r '$bad'"
done

log "commit -r: paced, and the base reads as the overlay did"
"$QEMU_IMG" create -q -f qcow2 base.qcow2 64M
"$QEMU_IO" -f qcow2 -c "write -P 0x11 0 16M" base.qcow2 >/dev/null
"$QEMU_IMG" create -q -f qcow2 -b base.qcow2 -F qcow2 top.qcow2
"$QEMU_IO" -f qcow2 -c "write -P 0x22 1M 4M" -c "write -P 0x33 40M 4M" \
  -c "write -z 20M 2M" top.qcow2 >/dev/null
"$QEMU_IMG" convert -O raw top.qcow2 view.raw
cp base.qcow2 qbase.qcow2
cp top.qcow2 qtop.qcow2
"$QEMU_IMG" rebase -u -f qcow2 -b qbase.qcow2 -F qcow2 qtop.qcow2
"$QEMU_IMG" commit -q -r 4M qtop.qcow2
ms=$(elapsed_ms "$TD" commit -q -r 4M top.qcow2)
log "  commit: ${ms} ms"
((ms >= 1500)) || fail "commit -r 4M of 8 MiB of data took ${ms} ms: the rate allows 1500 at least"
ok "$QEMU_IMG" compare -f raw -F qcow2 view.raw base.qcow2
ok "$QEMU_IMG" compare -f qcow2 -F qcow2 qbase.qcow2 base.qcow2
td_fails "invalid rate limit 'xyz'" "commit -r xyz" commit -q -r xyz top.qcow2

echo PASS

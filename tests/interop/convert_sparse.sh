#!/usr/bin/env bash
# thindisk convert -S (qemu-img convert's sparse size), judged against
# qemu-img convert with the same -S on the same source:
#   1. Raw output, -S default, 0, 512, 64k and 16M: the same bytes and the
#      same allocation map (qemu-img map of each output) as qemu-img's;
#      -S 0 allocates every byte.
#   2. qcow2 output with -S 0, plain and compressed: every cluster
#      allocated (qemu-img check), the source's bytes.
#   3. -S 0 with -B: the top layer's clusters only, as qemu-img leaves them.
#   4. -n -S 0 into an existing sparse raw file: no hole left.
#   5. Refusals, one line each, no destination made: not a multiple of 512,
#      over 16M, negative, not a number.
source "$(dirname "$0")/lib.sh"
require_tool "$QEMU_IMG" "$QEMU_IO" jq
require_thindisk

SIZE=$((8 << 20))
log "the source: data with zero runs of 8k and 128k inside it, and holes"
ok "$QEMU_IMG" create -q -f raw src.raw $SIZE
io_ok qemu-io-raw src.raw "write -P 1 0 512" "write -P 2 1M 64k" "write -P 0 1M 8k" \
  "write -P 3 3M 1M" "write -P 0 3M 128k" "write -P 4 6M 3000"

# allocated FILE: bytes the file system holds for FILE.
allocated() { echo $(($(stat -c %b "$1") * 512)); }
# data_map FILE: the data extents of a raw FILE, one "start length" a line.
data_map() {
  "$QEMU_IMG" map --output=json -f raw "$1" | jq -r '.[] | select(.data) | "\(.start) \(.length)"'
}

log "1. raw output: the same bytes and allocation as qemu-img's"
for s in "" 0 512 64k 16M; do
  flag=(${s:+-S "$s"})
  td convert "${flag[@]}" -O raw src.raw "td$s.raw"
  ok "$QEMU_IMG" convert "${flag[@]}" -f raw -O raw src.raw "qemu$s.raw"
  assert_same_bytes "td$s.raw" "qemu$s.raw" "convert ${flag[*]}"
  assert_eq "$(data_map "qemu$s.raw")" "$(data_map "td$s.raw")" "the data map with ${flag[*]:-no -S}"
  echo "ok: -S ${s:-(default)}: $(allocated "td$s.raw") bytes allocated, as qemu-img"
done
assert_eq $SIZE "$(allocated td0.raw)" "bytes allocated with -S 0"
(($(allocated td.raw) < SIZE / 4)) || fail "the default -S left $(allocated td.raw) bytes allocated"
(($(allocated td64k.raw) > $(allocated td.raw))) ||
  fail "-S 64k should write the 8k zero run inside data that the default skips"

log "2. qcow2 output with -S 0: every cluster allocated"
for c in "" -c; do
  rm -f full.qcow2
  td convert $c -S 0 -O qcow2 src.raw full.qcow2
  ok "$QEMU_IMG" compare -f raw -F qcow2 src.raw full.qcow2
  capture "$QEMU_IMG" check full.qcow2
  assert_eq 0 "$RC" "qemu-img check of -S 0 ${c:-plain}"
  grep -q " = 100.00% allocated" "$OUT" || fail "-S 0 ${c:-plain}: not fully allocated: $(cat "$OUT")"
  if [[ $c == -c ]]; then
    grep -q "100.00% compressed clusters" "$OUT" || fail "-c -S 0: $(cat "$OUT")"
  fi
done

log "3. -S 0 with -B: only the top layer"
ok "$QEMU_IMG" create -q -f qcow2 base.qcow2 $SIZE
io_ok qemu-io base.qcow2 "write -P 7 0 2M"
ok "$QEMU_IMG" create -q -f qcow2 -b base.qcow2 -F qcow2 top.qcow2
io_ok qemu-io top.qcow2 "write -P 1 4M 64k" "write -z 5M 64k"
# top_map FILE: the guest ranges FILE itself holds (not its backing file).
top_map() {
  "$QEMU_IMG" map --output=json "$1" | jq -r '.[] | select(.depth == 0 and .data) | "\(.start) \(.length)"'
}
for tool in td qemu; do
  if [[ $tool == td ]]; then
    td convert -S 0 -B base.qcow2 -F qcow2 -O qcow2 -o cluster_size=65536 top.qcow2 "$tool-top.qcow2"
  else
    ok "$QEMU_IMG" convert -S 0 -B base.qcow2 -F qcow2 -O qcow2 top.qcow2 "$tool-top.qcow2"
  fi
  ok "$QEMU_IMG" compare top.qcow2 "$tool-top.qcow2"
done
assert_eq "$(top_map qemu-top.qcow2)" "$(top_map td-top.qcow2)" "the top layer's ranges with -B -S 0"

log "4. -n -S 0 into an existing sparse file"
truncate -s $SIZE existing.raw
td convert -n -S 0 src.raw existing.raw
assert_same_bytes existing.raw src.raw "convert -n -S 0"
assert_eq $SIZE "$(allocated existing.raw)" "bytes allocated after -n -S 0"

log "5. refusals"
for bad in 1000 32M 1.1k x; do
  td_fails "invalid -S '$bad': a sparse size is a multiple of 512 bytes up to 16M, or 0" \
    "convert -S $bad" convert -S "$bad" src.raw bad.raw
  [[ $(grep -c . "$ERR") == 1 ]] || fail "convert -S $bad: more than one line: $(cat "$ERR")"
  assert_absent bad.raw "convert -S $bad"
done
log "convert_sparse: ok"

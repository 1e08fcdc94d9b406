#!/usr/bin/env bash
# Space comes back (DESIGN P3): a 256 MiB image written full of random data
# has 90% of it discarded in a guest-like pattern (thousands of ranges, most
# of them smaller than a cluster), half through `thindisk serve
# --discard=unmap` by qemu-io over NBD and half by `thindisk io`; the host
# file's allocated blocks must shrink by >= 85% of what was discarded.
# Then `thindisk compact` rewrites it (content unchanged per qemu-img
# compare, qemu-img check clean, file size close to `measure`'s required
# size), survives being killed at random moments, keeps qemu's internal
# snapshots and refuses an image qemu-nbd holds. Last, `thindisk measure`
# against real conversions (exact) and against qemu-img measure.
source "$(dirname "$0")/lib.sh"
require_tool "$QEMU_IMG" "$QEMU_IO" qemu-nbd jq stat
require_thindisk

M=$((1 << 20))
K=1024
SIZE=$((256 * M))

allocated() { echo $(($(stat -c %b "$1") * $(stat -c %B "$1"))); }

log "write 256 MiB of random data"
head -c $SIZE /dev/urandom >rand.raw
td convert -O qcow2 rand.raw img.qcow2
before=$(allocated img.qcow2)

# The pattern: per 40 KiB unit, keep the first 4 KiB and discard 36 KiB
# (4 KiB aligned: whole subclusters of the default 128 KiB cluster with
# 4 KiB subclusters); every 64th unit instead discards in 512-byte-aligned
# pieces that are smaller than a subcluster.
UNIT=$((40 * K))
UNITS=$((SIZE / UNIT))
discard_cmds() {  # FIRST_UNIT END_UNIT
  local u off
  for ((u = $1; u < $2; u++)); do
    off=$((u * UNIT))
    if ((u % 64 == 63)); then
      echo "discard $((off + 4 * K)) $((18 * K + 512))"
      echo "discard $((off + 22 * K + 512)) $((17 * K + 512))"
    else
      echo "discard $((off + 4 * K)) $((36 * K))"
    fi
  done
}
discarded=$((UNITS * 36 * K))
half=$((UNITS / 2))

log "discard units [0, $half) through thindisk serve --discard=unmap (qemu-io over NBD)"
serve_unix serve "$TMP/nbd.sock" -q --discard=unmap -f qcow2 img.qcow2
mapfile -t cmds < <(discard_cmds 0 $half)
args=()
for c in "${cmds[@]}"; do args+=(-c "$c"); done
ok "$QEMU_IO" -f raw "${args[@]}" -c flush "nbd+unix:///?socket=$TMP/nbd.sock"
grep -qiE "error|failed" "$OUT" "$ERR" && fail "qemu-io reported a failure: $(head -3 "$ERR")"
stop_server "$SERVER_PID" serve
mid=$(allocated img.qcow2)

log "discard units [$half, $UNITS) with thindisk io"
mapfile -t cmds < <(discard_cmds $half $UNITS)
io_ok thindisk img.qcow2 "${cmds[@]}"
after=$(allocated img.qcow2)
ok "$QEMU_IMG" check img.qcow2
freed=$((before - after))
echo "space: allocated before $before, after NBD half $mid, after all $after bytes;" \
  "discarded $discarded, freed $freed ($((freed * 100 / discarded))% of discarded)"
((freed * 100 >= discarded * 85)) || fail "freed only $freed of $discarded discarded bytes"

# The content the rest must keep: a raw copy, and a sparse copy of the image.
ok "$QEMU_IMG" convert -O raw img.qcow2 expect.raw
cp --sparse=always img.qcow2 aged.qcow2

log "measure vs real conversions (exact) and vs qemu-img measure"
# Each row: -o options; thindisk's required size must equal the file
# `thindisk convert` writes; qemu-img (which counts metadata for the whole
# virtual size) may only report more.
head -c $((3 * M)) /dev/urandom >sparse.raw
truncate -s $((100 * M)) sparse.raw
dd if=/dev/urandom of=sparse.raw bs=64K seek=700 count=5 conv=notrunc status=none
ok "$QEMU_IMG" create -q -f qcow2 qemu-made.qcow2 1G
io_ok qemu-io qemu-made.qcow2 "write -P 1 0 1M" "write -P 2 100M 70k" "write -z 200M 1M" \
  "write -P 3 900M 4k"
ROWS=("" "cluster_size=65536,extended_l2=off" "cluster_size=4096,extended_l2=off"
  "cluster_size=2M,refcount_bits=64" "compat=0.10" "cluster_size=512,extended_l2=off")
for src in aged.qcow2 sparse.raw qemu-made.qcow2; do
  rows=("${ROWS[@]}")
  [[ $src == aged.qcow2 ]] && rows=("${ROWS[@]:0:2}")  # 256 MiB: keep it short
  for opts in "${rows[@]}"; do
    capture "$TD" measure -O qcow2 ${opts:+-o "$opts"} --output=json "$src"
    [[ $RC -eq 0 ]] || fail "measure $src ($opts): $(cat "$ERR")"
    req=$(jq .required "$OUT")
    full=$(jq '."fully-allocated"' "$OUT")
    td_keys=$(jq -c 'keys' "$OUT")
    rm -f conv.qcow2
    td convert -O qcow2 ${opts:+-o "$opts"} "$src" conv.qcow2
    real=$(stat -c %s conv.qcow2)
    ok "$QEMU_IMG" measure -O qcow2 ${opts:+-o "$opts"} --output=json "$src"
    qreq=$(jq .required "$OUT")
    qfull=$(jq '."fully-allocated"' "$OUT")
    echo "measure $src [${opts:-defaults}]: thindisk required $req, convert wrote $real;" \
      "qemu-img required $qreq; fully allocated thindisk $full, qemu-img $qfull"
    assert_eq "$real" "$req" "$src [$opts]: measure required vs converted size"
    # qemu-img counts metadata for the whole virtual size but in bytes, not
    # whole clusters: thindisk may exceed it only by that rounding.
    cs=$(jq '."cluster-size"' <("$QEMU_IMG" info --output=json conv.qcow2))
    ((req <= qreq + 3 * cs)) || fail "$src [$opts]: thindisk requires $req, qemu-img $qreq"
    assert_eq "$(jq -c keys "$OUT")" "$td_keys" "$src [$opts]: JSON keys vs qemu-img"
    # Fully allocated: the same layout, counted apart (0.1% + 8 MiB slack).
    diff=$((full > qfull ? full - qfull : qfull - full))
    ((diff <= qfull / 1000 + 3 * cs)) || fail "$src [$opts]: fully allocated $full vs $qfull"
  done
done
# --size and raw output, human format as qemu-img prints it.
td measure -O qcow2 --size 1G
ok "$TD" create -q -f qcow2 empty.qcow2 1G
grep -qx "required size: $(stat -c %s empty.qcow2)" <("$TD" measure -O qcow2 --size 1G) ||
  fail "measure --size 1G does not match an empty image"
assert_eq "$("$QEMU_IMG" measure -O raw sparse.raw)" "$("$TD" measure -O raw sparse.raw)" \
  "measure -O raw"
td_fails "" "measure without input" measure
td_fails "" "measure with --size and a file" measure --size 1G sparse.raw

log "compact"
capture "$TD" measure -O qcow2 --output=json img.qcow2
required=$(jq .required "$OUT")
td compact img.qcow2
ok "$QEMU_IMG" check img.qcow2
ok "$QEMU_IMG" compare expect.raw img.qcow2
compacted=$(stat -c %s img.qcow2)
echo "compact: file $(stat -c %s aged.qcow2) -> $compacted bytes (measure required $required)," \
  "allocated $after -> $(allocated img.qcow2)"
slack=$((required / 50 + 4 * 128 * K))
((compacted <= required + slack && compacted + slack >= required)) ||
  fail "compacted size $compacted is not close to measure's $required"

log "compact killed at random moments leaves the old or the new image"
for delay in 0.01 0.05 0.1 0.2 0.4 0.8; do
  cp --sparse=always aged.qcow2 victim.qcow2
  "$TD" compact -q victim.qcow2 &
  pid=$!
  sleep "$delay"
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  ok "$QEMU_IMG" check victim.qcow2
  ok "$QEMU_IMG" compare expect.raw victim.qcow2
  echo "killed after ${delay}s: image size $(stat -c %s victim.qcow2), intact"
done

log "compact keeps qemu's internal snapshots"
ok "$QEMU_IMG" create -q -f qcow2 -o cluster_size=65536 snap.qcow2 64M
io_ok qemu-io snap.qcow2 "write -P 0x41 0 32M"
ok "$QEMU_IMG" snapshot -c first snap.qcow2
io_ok qemu-io snap.qcow2 "write -P 0x42 8M 8M" "discard 20M 8M" "write -c -P 0x43 40M 1M"
cp snap.qcow2 snap-before.qcow2
td compact snap.qcow2
ok "$QEMU_IMG" check snap.qcow2
ok "$QEMU_IMG" compare snap-before.qcow2 snap.qcow2
assert_eq "$("$QEMU_IMG" snapshot -l snap-before.qcow2 | awk 'NR>2 {print $2}')" \
  "$("$QEMU_IMG" snapshot -l snap.qcow2 | awk 'NR>2 {print $2}')" "snapshot list"
ok "$QEMU_IMG" snapshot -a first snap.qcow2
ok "$QEMU_IMG" snapshot -a first snap-before.qcow2
ok "$QEMU_IMG" compare snap-before.qcow2 snap.qcow2
ok "$QEMU_IMG" check snap.qcow2

log "compact refuses an image in use"
qemu_nbd_unix qemu-nbd "$TMP/q.sock" -f qcow2 snap.qcow2
td_fails "in use" "compact of a busy image" compact snap.qcow2
kill_server "$SERVER_PID" KILL
td_fails "" "compact of a raw file" compact rand.raw
echo "PASS [$TEST_NAME]"

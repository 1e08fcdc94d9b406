#!/usr/bin/env bash
# thindisk convert SRC1 SRC2 ... DST concatenates its sources, as qemu-img
# convert does, judged against qemu-img's output for the same sources:
#   1. a raw file of 3 MiB, a raw file of 1000 bytes (it takes 1024: each
#      source's size is rounded up to whole sectors, as in qemu-img), a
#      qcow2 of 2 MiB with one written range and holes, and a
#      streamOptimized vmdk: raw, qcow2 and compressed outputs equal
#      qemu-img's byte for byte (raw) or by qemu-img compare; the qcow2
#      outputs pass qemu-img check; holes stay holes.
#   2. -n into an existing raw file of 0xff bytes: the same bytes as
#      qemu-img convert -n leaves.
#   3. refusals, exit 1 and no destination: -B, -l and --bitmaps with
#      several sources, a missing source (named), a destination that is one
#      of the sources (left as it was), a single name.
source "$(dirname "$0")/lib.sh"
require_tool "$QEMU_IMG" "$QEMU_IO" md5sum
require_thindisk

M=$((1 << 20))
head -c $((3 * M)) /dev/urandom >a.raw
head -c 1000 /dev/urandom >b.raw
"$QEMU_IMG" create -q -f qcow2 c.qcow2 2M
"$QEMU_IO" -f qcow2 -c "write -P 0x7c 1M 4k" c.qcow2 >/dev/null
truncate -s 3M d.raw
"$QEMU_IO" -f raw -c "write -P 0x3d 0 64k" -c "write -P 0x4e 2M 1M" d.raw >/dev/null
"$QEMU_IMG" convert -O vmdk -o subformat=streamOptimized d.raw d.vmdk
SOURCES=(a.raw b.raw c.qcow2 d.vmdk)
TOTAL=$((3 * M + 1024 + 2 * M + 3 * M))

log "raw, qcow2 and compressed outputs against qemu-img's"
"$QEMU_IMG" convert -O raw "${SOURCES[@]}" q.raw
assert_eq $TOTAL "$(stat -c %s q.raw)" "qemu-img's concatenated size"
td convert -O raw "${SOURCES[@]}" t.raw
assert_same_bytes q.raw t.raw "the raw concatenation"
for extra in "" -c; do
  td convert -O qcow2 $extra "${SOURCES[@]}" "t$extra.qcow2"
  ok "$QEMU_IMG" compare -f raw -F qcow2 q.raw "t$extra.qcow2"
  qemu_check "t$extra.qcow2"
done
# Holes: a.raw's 3 MiB, b's sector, c's 4 KiB and d's 1 MiB + 64 KiB of data
# (4.1 MiB); a copy that wrote c's and d's holes would allocate 8 MiB.
alloc=$(($(stat -c %b t.raw) * $(stat -c %B t.raw)))
((alloc <= 5 * M)) || fail "the raw concatenation allocates $alloc bytes: holes were written"

log "-n into an existing file"
head -c $TOTAL /dev/zero | tr '\0' '\377' >qn.raw
cp qn.raw tn.raw
"$QEMU_IMG" convert -n -O raw "${SOURCES[@]}" qn.raw
td convert -n -O raw "${SOURCES[@]}" tn.raw
assert_same_bytes qn.raw tn.raw "convert -n of several sources"

log "refusals"
"$QEMU_IMG" snapshot -c s1 c.qcow2
td_fails "-B: a backing file for the target makes no sense" "-B with several sources" \
  convert -O qcow2 -B a.raw -F raw a.raw b.raw x.qcow2
td_fails "-l: one snapshot of one source" "-l with several sources" \
  convert -l s1 -O raw c.qcow2 c.qcow2 x.qcow2
td_fails "--bitmaps copies one source's bitmaps" "--bitmaps with several sources" \
  convert --bitmaps -O qcow2 c.qcow2 c.qcow2 x.qcow2
td_fails "missing.raw" "a missing source" convert -O raw a.raw missing.raw x.qcow2
before=$(md5sum <b.raw)
td_fails "source and destination are the same file: b.raw" "the last source as destination" \
  convert -O raw a.raw b.raw b.raw
td_fails "source and destination are the same file: b.raw" "the first source as destination" \
  convert -O raw b.raw a.raw b.raw
assert_eq "$before" "$(md5sum <b.raw)" "the source named as destination"
td_fails "give the source image and then the destination" "one name" convert a.raw
assert_absent x.qcow2 "the refused conversions"

echo PASS

#!/usr/bin/env bash
# thindisk dd against qemu-img dd: the same operands (if= of= bs= skip=
# count=) give the same bytes, holes stay holes, and bad operands are
# refused before anything is made.
#   1. a qcow2 input of 64 MiB (data runs, a zeroed range, holes, a backing
#      file's data under a clone) copied with eight operand sets, into raw
#      and qcow2: qemu-img compare finds each output equal to qemu-img dd's
#      (qemu-img rounds a raw output up to 512 bytes; thindisk keeps the
#      exact size); the qcow2 outputs pass qemu-img check; a raw copy of
#      the whole input allocates only its data (qemu-img dd allocates all).
#   2. a streamOptimized vmdk input (compressed grains) into raw.
#   3. refusals, exit 1 and no output: skip= past the input's end, the
#      output being the input (which stays as it was), an unknown, repeated
#      or malformed operand, bs=0, no of=.
source "$(dirname "$0")/lib.sh"
require_tool "$QEMU_IMG" "$QEMU_IO" md5sum
require_thindisk

M=$((1 << 20))
"$QEMU_IMG" create -q -f qcow2 base.qcow2 64M
"$QEMU_IO" -f qcow2 -c "write -P 0x61 40M 6M" base.qcow2 >/dev/null
"$QEMU_IMG" create -q -f qcow2 -b base.qcow2 -F qcow2 in.qcow2
"$QEMU_IO" -f qcow2 -c "write -P 0x11 0 3M" -c "write -P 0x22 5000k 1500k" \
  -c "write -z 41M 1M" -c "write -P 0x33 63M 1M" in.qcow2 >/dev/null

# alloc FILE: bytes the file allocates.
alloc() { echo $(($(stat -c %b "$1") * $(stat -c %B "$1"))); }

log "qemu-img dd's operands, raw and qcow2 outputs"
i=0
for ops in "bs=1M count=20 skip=3" "bs=4k skip=100" "bs=512 count=77777" \
  "bs=1000 count=1500 skip=7" "" "bs=64k count=1024" "bs=1M skip=40 count=48" \
  "bs=3M skip=13"; do
  i=$((i + 1))
  read -ra operands <<<"$ops"
  for fmt in raw qcow2; do
    rm -f "t$i.$fmt" "q$i.$fmt"
    "$QEMU_IMG" dd -f qcow2 -O "$fmt" "${operands[@]}" if=in.qcow2 of="q$i.$fmt"
    td dd -f qcow2 -O "$fmt" "${operands[@]}" if=in.qcow2 of="t$i.$fmt"
    ok "$QEMU_IMG" compare -f "$fmt" -F "$fmt" "t$i.$fmt" "q$i.$fmt"
  done
  qemu_check "t$i.qcow2"
done
# Holes stay holes: the whole input holds 10.5 MiB of data (the clone's
# 5.5 MiB and what of the base's 6 MiB is not zeroed); qemu-img dd writes
# all 64 MiB.
(($(alloc t5.raw) <= 12 * M)) ||
  fail "thindisk dd's raw copy of the whole input allocates $(alloc t5.raw) bytes: holes were written"
# Sizes: what qemu-img dd counts (count= includes the skipped blocks).
assert_eq $((17 * M)) "$(stat -c %s t1.raw)" "size of dd bs=1M count=20 skip=3"
assert_eq $((1500000 - 7000)) "$(stat -c %s t4.raw)" "size of dd bs=1000 count=1500 skip=7 (raw keeps the exact size)"
assert_eq $((64 * M)) "$(stat -c %s t5.raw)" "size of dd with no bs, skip or count"

log "a streamOptimized vmdk input"
"$QEMU_IMG" convert -O vmdk -o subformat=streamOptimized in.qcow2 in.vmdk
"$QEMU_IMG" dd -f vmdk -O raw bs=1M skip=2 count=50 if=in.vmdk of=qv.raw
td dd -O raw bs=1M skip=2 count=50 if=in.vmdk of=tv.raw
ok "$QEMU_IMG" compare -f raw -F raw tv.raw qv.raw

log "refusals"
before=$(md5sum <in.qcow2)
td_fails "cannot skip to byte 68157440: the input ends at byte 67108864" "skip past the end" \
  dd bs=1M skip=65 if=in.qcow2 of=past.raw
assert_absent past.raw "dd skip= past the end"
td_fails "cannot skip to byte .*count=" "skip past count" \
  dd bs=1M skip=10 count=5 if=in.qcow2 of=past.raw
assert_absent past.raw "dd skip= past count="
td_fails "the output is the input" "of= the input" dd if=in.qcow2 of=in.qcow2
ln -s in.qcow2 link.qcow2
td_fails "the output is the input" "of= a link to the input" dd if=in.qcow2 of=link.qcow2
assert_eq "$before" "$(md5sum <in.qcow2)" "the input after the refused dd"
td_fails "unrecognized operand 'conv=notrunc'" "conv=" dd if=in.qcow2 of=x.raw conv=notrunc
td_fails "unrecognized operand 'in.qcow2'" "a bare name" dd in.qcow2 of=x.raw
td_fails "operand bs= given twice" "bs twice" dd bs=1 bs=2 if=in.qcow2 of=x.raw
td_fails "invalid bs=0" "bs=0" dd bs=0 if=in.qcow2 of=x.raw
td_fails "invalid count='-3'" "count=-3" dd count=-3 if=in.qcow2 of=x.raw
td_fails "give the output image: of=OUTPUT" "no of=" dd if=in.qcow2
assert_absent x.raw "the refused dd commands"

echo PASS

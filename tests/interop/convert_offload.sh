#!/usr/bin/env bash
# convert -C (copy offloading), judged against qemu-img convert -C and by
# what the kernel was asked (strace) and did (filefrag):
#   1. a sparse raw file and a qcow2 clone (data, a zeroed range, holes, a
#      backing file's data) into raw: the kernel copies the data file to
#      file (copy_file_range calls), the output equals qemu-img convert -C's
#      byte for byte, and the holes stay holes; -n -C into a file of 0xff
#      bytes leaves what qemu-img convert -n -C leaves.
#   2. -C into qcow2 goes through this process (no copy_file_range): the
#      same content as qemu-img's.
#   3. on XFS (a loop-mounted file), the copy's extents are shared with the
#      source (a reflink, FIEMAP's "shared" flag), and writing the copy
#      leaves the source as it was; without -C nothing is shared.
#   4. -C with -c, -S or --salvage is refused as qemu-img refuses it, and
#      nothing is made.
source "$(dirname "$0")/lib.sh"
require_tool "$QEMU_IMG" "$QEMU_IO" strace filefrag md5sum
require_thindisk

M=$((1 << 20))
MNT=''
offload_cleanup() {
  local status=$?
  if [[ -n $MNT ]] && mountpoint -q "$MNT"; then umount "$MNT" || umount -l "$MNT"; fi
  cleanup "$status"
}
trap offload_cleanup EXIT

# traced CMD...: runs CMD under strace (copy_file_range) into trace.txt;
# sets RC.
traced() { capture_traced copy_file_range trace.txt "$@"; }

# copies TRACE: how many copy_file_range calls copied something.
copies() { grep -cE 'copy_file_range\(.*\) = [1-9]' "$1" || true; }
alloc() { echo $(($(stat -c %b "$1") * $(stat -c %B "$1"))); }

log "raw and qcow2 sources into raw"
truncate -s 64M sp.raw
head -c $((5 * M)) /dev/urandom | dd of=sp.raw bs=1M seek=10 conv=notrunc status=none
head -c $((3 * M)) /dev/urandom | dd of=sp.raw bs=1M seek=50 conv=notrunc status=none
traced "$TD" convert -C -O raw sp.raw t1.raw
[[ $RC == 0 ]] || fail "convert -C of a raw file: exit $RC, $(cat "$ERR")"
(($(copies trace.txt) >= 2)) || fail "convert -C of a raw file made no copy_file_range call: $(cat trace.txt)"
"$QEMU_IMG" convert -C -O raw sp.raw q1.raw
assert_same_bytes q1.raw t1.raw "convert -C of a raw file"
assert_same_bytes sp.raw t1.raw "convert -C of a raw file, against its source"
(($(alloc t1.raw) <= 9 * M)) || fail "convert -C wrote the source's holes: $(alloc t1.raw) bytes allocated"

"$QEMU_IMG" create -q -f qcow2 base.qcow2 64M
"$QEMU_IO" -f qcow2 -c "write -P 0x61 30M 2M" base.qcow2 >/dev/null
"$QEMU_IMG" create -q -f qcow2 -b base.qcow2 -F qcow2 top.qcow2
"$QEMU_IO" -f qcow2 -c "write -P 0x11 1M 3M" -c "write -z 8M 1M" -c "write -P 0x22 40M 100k" \
  -c "write -P 0x33 31M 4k" top.qcow2 >/dev/null
traced "$TD" convert -C -O raw top.qcow2 t2.raw
[[ $RC == 0 ]] || fail "convert -C of a qcow2 clone: exit $RC, $(cat "$ERR")"
(($(copies trace.txt) >= 1)) || fail "convert -C of a qcow2 clone made no copy_file_range call"
"$QEMU_IMG" convert -C -O raw top.qcow2 q2.raw
assert_same_bytes q2.raw t2.raw "convert -C of a qcow2 clone"

head -c $((64 * M)) /dev/zero | tr '\0' '\377' >qn.raw
cp qn.raw tn.raw
"$QEMU_IMG" convert -n -C -O raw top.qcow2 qn.raw
td convert -n -C -O raw top.qcow2 tn.raw
assert_same_bytes qn.raw tn.raw "convert -n -C"

log "-C into qcow2 goes through this process"
traced "$TD" convert -C -O qcow2 top.qcow2 t3.qcow2
[[ $RC == 0 ]] || fail "convert -C -O qcow2: exit $RC, $(cat "$ERR")"
assert_eq 0 "$(copies trace.txt)" "copy_file_range calls of convert -C -O qcow2"
ok "$QEMU_IMG" compare q2.raw t3.qcow2
qemu_check t3.qcow2

log "on XFS the copy shares the source's extents"
if [[ $EUID == 0 ]] && command -v mkfs.xfs >/dev/null && command -v losetup >/dev/null; then
  truncate -s 512M xfs.img
  mkfs.xfs -q -m reflink=1 xfs.img || fail "mkfs.xfs -m reflink=1 failed"
  MNT=$TMP/mnt
  mkdir "$MNT"
  mount -o loop xfs.img "$MNT" || fail "could not mount the XFS image"
  cp sp.raw "$MNT/src.raw"
  sync -f "$MNT/src.raw"
  before=$(md5sum <"$MNT/src.raw")
  td convert -C -O raw "$MNT/src.raw" "$MNT/copy.raw"
  assert_same_bytes "$MNT/src.raw" "$MNT/copy.raw" "convert -C on XFS"
  sync -f "$MNT/copy.raw"
  filefrag -v "$MNT/copy.raw" >frag.txt
  grep -q shared frag.txt || fail "convert -C on XFS shares no extent with its source: $(cat frag.txt)"
  td convert -O raw "$MNT/src.raw" "$MNT/plain.raw"
  sync -f "$MNT/plain.raw"
  filefrag -v "$MNT/plain.raw" >frag.txt
  ! grep -q shared frag.txt || fail "convert without -C shares extents on XFS: $(cat frag.txt)"
  io_ok qemu-io-raw "$MNT/copy.raw" "write -P 0x77 10M 1M"
  assert_eq "$before" "$(md5sum <"$MNT/src.raw")" "the source after writing its reflinked copy"
else
  skip_or_fail "no root, mkfs.xfs or losetup: the XFS reflink check needs them"
fi

log "refusals"
td_fails "Cannot enable copy offloading when -c is used" "-C -c" convert -C -c -O qcow2 sp.raw x.qcow2
td_fails "Cannot enable copy offloading when -S is used" "-C -S 0" convert -C -S 0 sp.raw x.raw
td_fails "Cannot use copy offloading in salvaging mode" "-C --salvage" convert -C --salvage sp.raw x.raw
assert_absent x.raw "the refused conversions"
assert_absent x.qcow2 "the refused conversions"

echo PASS

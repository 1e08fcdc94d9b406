#!/usr/bin/env bash
# A real filesystem on a served disk: `thindisk serve` -> nbdfuse -> a loop
# device -> ext4, as a VM's guest would use it, judged by tools no one here
# wrote (mkfs.ext4, e2fsck, fstrim, diff, and qemu's own qcow2 driver).
#
# 1. mkfs.ext4 on a fresh thin image, a tree of files copied in (large and
#    small random files, a sparse one, a symlink, an empty file), fio
#    --verify writing files at once with direct I/O, unmounted,
#    e2fsck clean; the image passes qemu-img check.
# 2. fstrim after deleting the large files gives their host space back (the
#    image file's allocation shrinks by most of what was deleted).
# 3. qemu-nbd, read-only, exports the same image: the filesystem it shows is
#    clean and holds exactly the tree.
# 4. A clone over that image (thindisk create -b): files changed, added and
#    deleted through the clone, fstrim; the base file is not touched, and
#    qemu-nbd of the clone shows exactly the changed tree.
# 5. The clone grown to 1 GiB and ext4 with it (resize2fs), files
#    added; then ext4 shrunk to 400 MiB and the clone with it (resize
#    --shrink, --force when ext4 left data past the end): clean, same tree.
# Needs root, /dev/fuse and loop devices (the CI machine has them).
source "$(dirname "$0")/lib.sh"
require_tool fstrim resize2fs qemu-img qemu-nbd fio jq
# shellcheck source=fs_lib.sh source-path=SCRIPTDIR
source "$SERVE_DIR/fs_lib.sh"

SIZE=$((512 << 20))

# allocated FILE: bytes the host file system holds for FILE.
allocated() { echo $(($(stat -c %b "$1") * $(stat -c %B "$1"))); }

# qemu_shows TREE IMAGE WHAT: qemu-nbd exports IMAGE read-only; the
# filesystem on it is clean and its data/ is exactly TREE.
qemu_shows() {
  qemu_nbd_unix qemu "$PWD/q.sock" -t -r -f qcow2 "$2"
  local qpid=$SERVER_PID
  attach "nbd+unix:///?socket=$PWD/q.sock" ro
  fs_check "$3 (through qemu-nbd)"
  mount -o ro "$LOOP" mnt || fail "$3: mount through qemu-nbd failed"
  same_tree "$1" mnt/data "$3 through qemu-nbd"
  detach
  kill_server "$qpid"
}

log "the tree"
mkdir -p src/big src/small/a/b
for i in 1 2 3 4 5 6; do head -c $((4 << 20)) /dev/urandom >src/big/f$i; done
for i in $(seq 300); do head -c $((RANDOM % 65536 + 1)) /dev/urandom >src/small/s$i; done
for i in $(seq 40); do head -c $((RANDOM % 8192)) /dev/urandom >src/small/a/b/t$i; done
truncate -s 32M src/sparse
printf 'in the middle\n' | dd of=src/sparse bs=1M seek=17 conv=notrunc status=none
: >src/empty
ln -s small/s1 src/link
big_bytes=$((6 * (4 << 20)))

log "1. mkfs.ext4 and a copy through thindisk serve"
"$TD" create -q -f qcow2 base.qcow2 $SIZE
serve_attached base.qcow2
fs_make_and_fill src 4

log "2. fstrim gives deleted files' space back"
fs_trim
before=$(allocated base.qcow2)
rm -r mnt/data/big
fs_trim
after=$(allocated base.qcow2)
echo "image allocation: $before bytes, $after after deleting $big_bytes and fstrim"
(((before - after) * 4 >= big_bytes * 3)) ||
  fail "fstrim freed $((before - after)) bytes of the image; the deleted files held $big_bytes"
rm -r src/big
umount mnt
fs_check "after the copy and fstrim"
detach
stop_server "$SRV" td
check_clean base.qcow2

log "3. qemu-nbd reads the same filesystem"
qemu_shows src base.qcow2 "the base"

log "4. a clone: changes go to it, the base stays as it was"
base_sum=$(sha256sum <base.qcow2)
"$TD" create -q -f qcow2 -b base.qcow2 -F qcow2 clone.qcow2
cp -a src want
serve_attached clone.qcow2
mount "$LOOP" mnt || fail "mount through the clone failed"
same_tree want mnt/data "the fresh clone"
head -c $((6 << 20)) /dev/urandom >want/new
cp want/new mnt/data/new
for i in $(seq 1 3 300); do rm want/small/s$i mnt/data/small/s$i; done
for i in $(seq 2 5 300); do
  head -c 3000 /dev/urandom | tee -a want/small/s$i >>mnt/data/small/s$i
done
printf 'changed\n' | dd of=want/sparse bs=1M seek=3 conv=notrunc status=none
printf 'changed\n' | dd of=mnt/data/sparse bs=1M seek=3 conv=notrunc status=none
fs_trim
same_tree want mnt/data "the clone after its changes"
umount mnt
fs_check "the clone"
detach
stop_server "$SRV" td
check_clean clone.qcow2
[[ $(sha256sum <base.qcow2) == "$base_sum" ]] || fail "serving the clone changed its base"
qemu_shows want clone.qcow2 "the clone"
qemu_shows src base.qcow2 "the base after the clone"

log "5. the clone grown and ext4 with it, then both shrunk (resize2fs, resize --shrink)"
"$TD" resize -q clone.qcow2 1G || fail "growing the clone failed"
serve_attached clone.qcow2
# Offline: an online resize needs CAP_SYS_RESOURCE, which containers drop.
timeout 120 e2fsck -fp "$LOOP" >fsck.out 2>&1 || { cat fsck.out >&2; fail "e2fsck of the grown clone"; }
timeout 120 resize2fs "$LOOP" >resize.out 2>&1 || { cat resize.out >&2; fail "resize2fs to 1G failed"; }
mount "$LOOP" mnt || fail "mount of the grown clone failed"
fs_bytes=$(df -B1 --output=size mnt | tail -1)
((fs_bytes > (900 << 20))) || fail "the grown filesystem holds $fs_bytes bytes"
mkdir mnt/data/grown want/grown
for i in $(seq 8); do head -c $((1 << 20)) /dev/urandom | tee want/grown/g$i >mnt/data/grown/g$i; done
sync -f mnt
umount mnt
timeout 120 e2fsck -fp "$LOOP" >fsck.out 2>&1 || { cat fsck.out >&2; fail "e2fsck of the grown clone"; }
timeout 120 resize2fs "$LOOP" 400M >resize.out 2>&1 || { cat resize.out >&2; fail "resize2fs to 400M failed"; }
detach
stop_server "$SRV" td
# Space past the new end may still hold what ext4 moved away: refused, with
# the range named, unless forced.
if ! "$TD" resize -q --shrink clone.qcow2 400M 2>shrink.err; then
  grep -q "past" shrink.err || fail "a refused shrink does not say why: $(cat shrink.err)"
  echo "shrink refused: $(cat shrink.err)"
  "$TD" resize -q --shrink --force clone.qcow2 400M 2>shrink.err ||
    fail "resize --shrink --force failed: $(cat shrink.err)"
fi
[[ $("$TD" info --output=json clone.qcow2 | jq '.["virtual-size"]') == $((400 << 20)) ]] ||
  fail "the clone is not 400 MiB after the shrink"
check_clean clone.qcow2
serve_attached clone.qcow2
fs_check "the shrunk clone"
detach
stop_server "$SRV" td
qemu_shows want clone.qcow2 "the shrunk clone"
log "filesystem: ok"

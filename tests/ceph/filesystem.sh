#!/usr/bin/env bash
# ext4 on a rados:// image that `thindisk serve` exports (issue 14), through
# nbdfuse and a loop device (tests/serve/fs_lib.sh), on the test cluster:
#   1. mkfs.ext4, a tree of files copied in, fio --verify with direct I/O,
#      e2fsck clean.
#   2. fstrim after deleting the large files removes their objects from the
#      pool: the image's disk size (`thindisk info -U`) shrinks.
#   3. The image copied out of the pool (`thindisk convert`), served by
#      qemu-nbd: qemu-img check of the copy, e2fsck clean, the same tree.
#   4. kill -9 of the server under the busy filesystem, 3 rounds (fs_lib.sh's
#      kill_rounds), the dead holder's lock broken (`lock break --force`,
#      which fences it) before the next server: check passes, the journal
#      replays, every fsynced file reads back.
# Needs root, /dev/fuse, loop devices and the test cluster (CEPH_CONF; ctest
# starts it: tests/ceph/fixture.sh).
# shellcheck source=../serve/lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/../serve/lib.sh"
# shellcheck source=lib.sh
source "$SERVE_DIR/../ceph/lib.sh"

require_tool qemu-img qemu-nbd rados fio fstrim jq
require_test_cluster
# shellcheck source=../serve/fs_lib.sh
source "$SERVE_DIR/fs_lib.sh"

random_seed
RANDOM=$((SEED & 0x7fffffff))
POOL=thindisk
IMG=rados://$POOL/fs$$ # a name no other run uses: the pool outlives a failed run

# disk_size: the image's disk size in the pool, read beside its server.
disk_size() { "$TD" info -U --output=json "$IMG" | jq '.["actual-size"]'; }

# break_lock: the killed server's lock goes, fenced.
break_lock() {
  "$TD" lock break --force "$IMG" >break.out 2>&1 || fail "lock break: $(cat break.out)"
}

log "the tree"
mkdir -p src/big src/small
for i in 1 2 3 4; do head -c $((4 << 20)) /dev/urandom >src/big/f$i; done
for i in $(seq 150); do head -c $((RANDOM % 65536 + 1)) /dev/urandom >src/small/s$i; done
ln -s small/s1 src/link
big_bytes=$((4 * (4 << 20)))

log "1. mkfs.ext4 and a copy through thindisk serve $IMG"
"$TD" create -q -f qcow2 "$IMG" $((512 << 20))
serve_attached "$IMG"
fs_make_and_fill src 2

log "2. fstrim removes the deleted files' objects"
fs_trim
before=$(disk_size)
rm -r mnt/data/big src/big
fs_trim
after=$(disk_size)
echo "disk size in the pool: $before bytes, $after after deleting $big_bytes and fstrim"
# Whole objects (4 MiB) go; what the files shared with others stays.
(((before - after) * 2 >= big_bytes)) ||
  fail "fstrim freed $((before - after)) bytes in the pool; the deleted files held $big_bytes"
umount mnt
fs_check "after the copy and fstrim"
detach
stop_server "$SRV" td

log "3. copied out of the pool, read by qemu-nbd"
"$TD" convert -O qcow2 "$IMG" copy.qcow2 >convert.out 2>&1 || fail "convert out: $(cat convert.out)"
check_clean copy.qcow2
qemu_nbd_unix qemu "$PWD/q.sock" -t -r -f qcow2 copy.qcow2
qpid=$SERVER_PID
attach "nbd+unix:///?socket=$PWD/q.sock" ro
fs_check "the copy, through qemu-nbd"
mount -o ro "$LOOP" mnt || fail "mount of the copy through qemu-nbd failed"
same_tree src mnt/data "the copy through qemu-nbd"
detach
kill_server "$qpid"

log "4. kill -9 under the busy filesystem"
serve_attached "$IMG"
mount "$LOOP" mnt || fail "mount through a new server failed"
mkdir mnt/d
sync -f mnt
kill_rounds 3 "$IMG" break_lock
same_tree src mnt/data "the tree after the kills"
umount mnt
detach
stop_server "$SRV" td
"$TD" check -r leaks "$IMG" >repair.out 2>&1 || { cat repair.out >&2; fail "check -r leaks failed"; }
"$TD" rm "$IMG" >/dev/null || fail "rm $IMG failed"
log "filesystem (RADOS): ok"

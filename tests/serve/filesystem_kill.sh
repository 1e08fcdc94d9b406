#!/usr/bin/env bash
# kill -9 of `thindisk serve` under a mounted filesystem that is busy
# (fs_lib.sh: nbdfuse and a loop device), 5 times on one qcow2 file: ext4,
# or XFS with FS_TYPE=xfs (serve.filesystem_kill_xfs), whose log writes
# lean on flushes in an order of their own. Two writers create files and
# fsync each one, and now and then remove an older one; the server is
# killed at a random moment. After each kill: `thindisk check` finds no
# corruption (leaks allowed), the filesystem replays its journal and its
# checker (e2fsck, xfs_repair) finds it clean, and every file whose fsync
# returned reads back exactly: a flush thindisk acknowledged survives the
# crash (fs_lib.sh's kill_rounds). At the end `check -r leaks` leaves the
# image clean for qemu-img check. tests/ceph/filesystem.sh does the same on
# RADOS.
source "$(dirname "$0")/lib.sh"
require_tool qemu-img
# shellcheck source=fs_lib.sh source-path=SCRIPTDIR
source "$SERVE_DIR/fs_lib.sh"

random_seed
RANDOM=$SEED

log "a fresh filesystem"
size=$((256 << 20))
[[ $FS_TYPE == xfs ]] && size=$((512 << 20)) # mkfs.xfs wants 300 MiB
"$TD" create -q -f qcow2 disk.qcow2 $size
serve_attached disk.qcow2
fs_make
mkdir mnt/d
sync -f mnt

kill_rounds 5 disk.qcow2

umount mnt
detach
stop_server "$SRV" td
"$TD" check -r leaks disk.qcow2 >repair.out 2>&1 ||
  { cat repair.out >&2; fail "check -r leaks failed"; }
check_clean disk.qcow2
log "filesystem_kill: ok"

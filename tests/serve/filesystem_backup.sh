#!/usr/bin/env bash
# Backups of a served disk with a live ext4 on it (fs_lib.sh: nbdfuse and a
# loop device), taken as docs/backup.md says: the filesystem frozen
# (fsfreeze), `thindisk backup` through the export, thawed.
#   1. A full backup, then changes (files added, removed, appended to),
#      then an incremental one over it, each of a frozen filesystem.
#   2. Each restored (`thindisk convert -O raw` of its chain) and mounted
#      from a plain loop device of the raw file, no NBD in between: it holds
#      exactly the tree of its moment, and e2fsck is clean.
#   3. The incremental holds less than half of what the full one does (the
#      bitmap marked the changes, not the disk), and both pass qemu-img check.
source "$(dirname "$0")/lib.sh"
require_tool fsfreeze qemu-img jq
# shellcheck source=fs_lib.sh source-path=SCRIPTDIR
source "$SERVE_DIR/fs_lib.sh"

CTL=$PWD/ctl.sock
URI="nbd+unix:///?socket=$PWD/td.sock"

# frozen_backup OUT [ARGS...]: thindisk backup of the export into OUT with
# the filesystem frozen, thawed whatever happens.
frozen_backup() {
  local out=$1 rc=0
  shift
  fsfreeze -f mnt || fail "fsfreeze of the mounted filesystem failed"
  timeout 120 "$TD" backup --bitmap daily "$@" --control "$CTL" "$URI" "$out" \
    >backup.out 2>&1 || rc=$?
  fsfreeze -u mnt || fail "fsfreeze -u failed"
  ((rc == 0)) || { cat backup.out >&2; fail "backup into $out exited $rc"; }
}

# restored_holds BACKUP TREE: BACKUP's chain as a raw file, mounted through
# a plain loop device, holds exactly TREE, and e2fsck is clean after.
restored_holds() {
  local raw=${1%.qcow2}.raw dev
  "$TD" convert -O raw "$1" "$raw" >convert.out 2>&1 || fail "convert of $1: $(cat convert.out)"
  dev=$(losetup -f --show "$raw") || fail "losetup of $raw failed"
  LOCAL_LOOP=$dev # unmount_all detaches it at exit
  mkdir -p restored
  # A frozen ext4 is consistent on disk; mounting replays what its journal holds.
  mount "$dev" restored || fail "the restored $1 does not mount"
  same_tree "$2" restored/data "the restored $1"
  umount restored
  fs_check "the restored $1" "$dev"
  losetup -d "$dev"
  LOCAL_LOOP=""
}

# own_data BACKUP: bytes of data BACKUP's own layer holds (qemu-img map).
own_data() {
  qemu-img map --output=json "$1" | jq '[.[] | select(.depth == 0 and .data) | .length] | add // 0'
}

log "a served disk with a bitmap, and a filesystem with a tree on it"
"$TD" create -q -f qcow2 disk.qcow2 $((512 << 20))
"$TD" bitmap --add disk.qcow2 daily >/dev/null || fail "bitmap --add failed"
serve_attached disk.qcow2 -B daily --control "$CTL"
fs_make
mkdir -p mnt/data/big mnt/data/small
for i in 1 2 3 4; do head -c $((4 << 20)) /dev/urandom >mnt/data/big/f$i; done
for i in $(seq 200); do head -c $((RANDOM % 65536 + 1)) /dev/urandom >mnt/data/small/s$i; done
sync -f mnt

log "1. a full backup of the frozen filesystem"
frozen_backup b0.qcow2
cp -a mnt/data want0

log "   changes, then an incremental backup"
head -c $((2 << 20)) /dev/urandom >mnt/data/big/new
for i in $(seq 1 4 200); do rm mnt/data/small/s$i; done
for i in $(seq 2 9 200); do head -c 5000 /dev/urandom >>mnt/data/small/s$i; done
rm mnt/data/big/f2
sync -f mnt
frozen_backup b1.qcow2 --incremental b0.qcow2
cp -a mnt/data want1

log "2. each restored and mounted without NBD"
restored_holds b0.qcow2 want0
restored_holds b1.qcow2 want1

log "3. the incremental holds the changes, not the disk"
check_clean b0.qcow2
check_clean b1.qcow2
full=$(own_data b0.qcow2)
inc=$(own_data b1.qcow2)
echo "backup data: full $full bytes, incremental $inc"
((inc > 0 && inc * 2 < full)) || fail "the incremental holds $inc bytes against the full backup's $full"
umount mnt
fs_check "the served disk after the backups"
detach
stop_server "$SRV" td
check_clean disk.qcow2
log "filesystem_backup: ok"

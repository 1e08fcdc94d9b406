# shellcheck shell=bash
# A served disk as a block device with a filesystem on it, for the scripts
# that judge `thindisk serve` the way a guest uses it (filesystem.sh,
# filesystem_kill.sh): the export through nbdfuse, a loop device on the
# FUSE file, ext4 on that. Source it after lib.sh; it checks the tools and
# rights, makes fuse/ and mnt/ in the temp dir, and unmounts everything at
# exit before lib.sh's cleanup kills the servers.
require_tool nbdfuse losetup mkfs.ext4 e2fsck mount umount
[[ $(id -u) == 0 && -c /dev/fuse && -e /dev/loop-control ]] ||
  skip_or_fail "needs root, /dev/fuse and /dev/loop-control"

LOOP=""
FUSE_PID=""

# mounted DIR: DIR (in the temp dir) is a mount point. From the mount
# table: a FUSE mount whose daemon died fails every stat (ENOTCONN).
mounted() { grep -q " $PWD/$1 " /proc/self/mounts; }

# unmount_all: what is mounted goes, innermost first; lazily when busy, so
# a dead server cannot hang the cleanup.
unmount_all() {
  if mounted mnt; then umount mnt 2>/dev/null || umount -l mnt; fi
  if [[ -n $LOOP ]]; then
    losetup -d "$LOOP" 2>/dev/null || true
    LOOP=""
  fi
  if mounted fuse; then umount fuse 2>/dev/null || umount -l fuse; fi
  return 0
}
trap 'unmount_all; cleanup' EXIT
mkdir fuse mnt

# attach URI [ro]: the export as /dev/loopN ($LOOP), through nbdfuse.
attach() {
  local ro=() i
  [[ ${2:-} == ro ]] && ro=(-r)
  spawn nbdfuse nbdfuse "${ro[@]}" fuse/disk "$1"
  FUSE_PID=$SERVER_PID
  for ((i = 0; i < 200; i++)); do
    [[ -e fuse/disk ]] && break
    kill -0 "$FUSE_PID" 2>/dev/null || { cat nbdfuse.err >&2; fail "nbdfuse exited"; }
    sleep 0.05
  done
  [[ -e fuse/disk ]] || fail "nbdfuse did not show the export within 10 s"
  LOOP=$(losetup -f --show "${ro[@]}" fuse/disk) || fail "losetup on the nbdfuse file failed"
}

# detach: unmounts, and nbdfuse must exit (it hangs up on the server).
detach() {
  unmount_all
  wait_exit "$FUSE_PID" nbdfuse "the FUSE unmount"
}

# fs_check WHAT: e2fsck -fn of the (unmounted) loop device must be clean.
fs_check() {
  timeout 120 e2fsck -fn "$LOOP" >fsck.out 2>&1 || { cat fsck.out >&2; fail "e2fsck: $1"; }
}

# shellcheck shell=bash
# A served disk as a block device with a filesystem on it, for the scripts
# that judge `thindisk serve` the way a guest uses it (filesystem*.sh here,
# tests/ceph/filesystem.sh): the export through nbdfuse, a loop device on the
# FUSE file, ext4 on that (or XFS: FS_TYPE=xfs, for fs_make, fs_check and
# the kill rounds). Source it after lib.sh; it checks the tools and rights,
# makes fuse/ and mnt/ in the temp dir, and unmounts everything at exit
# before lib.sh's cleanup kills the servers.
FS_TYPE=${FS_TYPE:-ext4}
case $FS_TYPE in
  ext4) require_tool nbdfuse losetup mkfs.ext4 e2fsck mount umount ;;
  xfs) require_tool nbdfuse losetup mkfs.xfs xfs_repair mount umount ;;
  *) fail "FS_TYPE=$FS_TYPE: ext4 or xfs" ;;
esac
[[ $(id -u) == 0 && -c /dev/fuse && -e /dev/loop-control ]] ||
  skip_or_fail "needs root, /dev/fuse and /dev/loop-control"

LOOP=""
FUSE_PID=""
LOCAL_LOOP="" # a loop device on a local file (a restored backup), on restored/

# mounted DIR: DIR (in the temp dir) is a mount point. From the mount
# table: a FUSE mount whose daemon died fails every stat (ENOTCONN).
mounted() { grep -q " $PWD/$1 " /proc/self/mounts; }

# unmount_all: what is mounted goes, innermost first; lazily when busy, so
# a dead server cannot hang the cleanup.
unmount_all() {
  if mounted restored; then umount restored 2>/dev/null || umount -l restored; fi
  if [[ -n $LOCAL_LOOP ]]; then
    losetup -d "$LOCAL_LOOP" 2>/dev/null || true
    LOCAL_LOOP=""
  fi
  if mounted mnt; then umount mnt 2>/dev/null || umount -l mnt; fi
  if [[ -n $LOOP ]]; then
    losetup -d "$LOOP" 2>/dev/null || true
    LOOP=""
  fi
  if mounted fuse; then umount fuse 2>/dev/null || umount -l fuse; fi
  return 0
}
fs_cleanup() {
  local status=$?
  unmount_all
  cleanup "$status"
}
trap fs_cleanup EXIT
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

# fs_check WHAT [DEVICE]: the (unmounted) DEVICE, the served disk's loop
# device by default, must be clean: e2fsck -fn, or xfs_repair -n (which
# also fails on a log not yet replayed: mount once after a crash).
fs_check() {
  local dev=${2:-$LOOP}
  case $FS_TYPE in
    ext4) timeout 120 e2fsck -fn "$dev" >fsck.out 2>&1 ;;
    xfs) timeout 120 xfs_repair -n "$dev" >fsck.out 2>&1 ;;
  esac || { cat fsck.out >&2; fail "fsck of $FS_TYPE: $1"; }
}

# fs_make: mkfs.$FS_TYPE on the served disk ($LOOP), mounted at mnt/.
# (XFS wants at least 300 MiB.)
fs_make() {
  timeout 120 "mkfs.$FS_TYPE" -q "$LOOP" || fail "mkfs.$FS_TYPE on the served disk failed"
  mount "$LOOP" mnt || fail "mount of the new filesystem failed"
}

# same_tree WANT DIR WHAT: DIR holds exactly the tree WANT (names, bytes,
# symlinks as links).
same_tree() {
  diff -r --no-dereference "$1" "$2" >diff.out 2>&1 ||
    { head -20 diff.out >&2; fail "$3: another tree than expected"; }
}

# fs_make_and_fill TREE JOBS: fs_make, TREE copied to mnt/data and
# compared; then fio --verify, JOBS writers of 4 KiB random direct I/O in
# files of their own (8 MiB each), every block checked; their files removed.
fs_make_and_fill() {
  fs_make
  cp -a "$1" mnt/data || fail "copy into the filesystem failed"
  sync -f mnt
  same_tree "$1" mnt/data "the copy in the new filesystem"
  timeout 120 fio --name=fs --directory=mnt --numjobs="$2" --size=8M --rw=randwrite --bs=4k \
    --ioengine=libaio --iodepth=8 --direct=1 --verify=crc32c --verify_fatal=1 \
    --randseed=$RANDOM --output=fio.out >/dev/null 2>fio.err ||
    { cat fio.err fio.out >&2; fail "fio --verify in the filesystem failed"; }
  rm -f mnt/fs.*
}

# fs_trim: fstrim of mnt/, after a sync: blocks of deleted files are free
# for fstrim only once the deletion commits.
fs_trim() {
  sync -f mnt
  timeout 120 fstrim mnt >/dev/null || fail "fstrim failed"
  sync -f mnt
}

# serve_attached IMAGE [ARGS...]: `thindisk serve ARGS IMAGE` on td.sock
# (SRV), attached.
serve_attached() {
  local image=$1
  shift
  rm -f td.sock # a killed server leaves its socket file
  start_server td -k td.sock "$@" "$image"
  SRV=$SERVER_PID
  wait_accepting "nbd+unix:///?socket=$PWD/td.sock"
  attach "nbd+unix:///?socket=$PWD/td.sock"
}

# ---- kill -9 under a busy filesystem ------------------------------------
# kill_rounds N IMAGE [AFTER_KILL...]: IMAGE is served (serve_attached) and
# its filesystem mounted at mnt/ with a directory d/. N times: two writers create
# files in d/, each fsynced before it is logged (dd conv=fsync), and now and
# then remove an older one (logged before the rm); the server is killed
# (SIGKILL) at a random moment (RANDOM: seed it first). Then AFTER_KILL runs
# (e.g. a RADOS image's lock broken), `thindisk check` must find no
# corruption (leaks allowed), the image is served again, the filesystem
# replays its journal (log), fs_check must be clean, and every file whose fsync returned must
# read back exactly. Leaves the image served and mounted.
FS_POOL=16 # the files' contents: host copies to compare with

kill_rounds() {
  local rounds=$1 image=$2 round w1 w2 p rc
  shift 2
  mkdir -p host
  for ((p = 0; p < FS_POOL; p++)); do
    [[ -e host/p$p ]] || head -c $(((p + 1) * 16384)) /dev/urandom >host/p$p
  done
  for ((round = 1; round <= rounds; round++)); do
    log "round $round: write and fsync, then kill -9"
    fs_writer 1 "$round" &
    w1=$!
    fs_writer 2 "$round" &
    w2=$!
    sleep "0.$((RANDOM % 8 + 2))"
    kill -KILL "$SRV"
    wait "$SRV" 2>/dev/null || true
    forget_server "$SRV"
    timeout 60 bash -c "while kill -0 $w1 2>/dev/null || kill -0 $w2 2>/dev/null; do sleep 0.05; done" ||
      fail "the writers did not stop within 60 s of the kill"
    wait "$w1" "$w2" || true
    # The dead server's filesystem cannot be unmounted cleanly: lazily.
    # nbdfuse (libnbd 1.14) often aborts on its own when the server dies,
    # on an assertion about its commands in flight; killed here otherwise.
    unmount_all
    kill -KILL "$FUSE_PID" 2>/dev/null || true
    wait "$FUSE_PID" 2>/dev/null || true
    forget_server "$FUSE_PID"
    (($# == 0)) || "$@"

    rc=0
    "$TD" check "$image" >check.out 2>&1 || rc=$?
    ((rc == 0 || rc == 3)) || { cat check.out >&2; fail "round $round: thindisk check exit $rc"; }
    serve_attached "$image"
    mount "$LOOP" mnt || fail "round $round: the filesystem does not mount after the kill"
    umount mnt
    fs_check "round $round, after the journal replay"
    mount "$LOOP" mnt || fail "round $round: the filesystem does not mount again"
    fs_verify "round $round"
  done
}

# fs_verify WHAT: every file in the writers' logs whose fsync returned, and
# which no writer had begun to remove, holds its pool file's bytes.
fs_verify() {
  local n=0 name pool
  while read -r name pool; do
    grep -qx "rm $name" removed.log 2>/dev/null && continue
    cmp -s "host/$pool" "mnt/d/$name" || fail "$1: $name (fsync returned) does not read back"
    n=$((n + 1))
  done < <(cat done.*.log 2>/dev/null)
  echo "$1: $n fsynced files intact"
}

# fs_writer W ROUND: files rROUND_wW_I of kill_rounds. Stops at the first
# error (the kill).
fs_writer() {
  local w=$1 r=$2 i p name
  for ((i = 1; i <= 300; i++)); do
    p=$(((i * 7 + w * 3 + r) % FS_POOL))
    name=r${r}_w${w}_$i
    dd if="host/p$p" of="mnt/d/$name" bs=64k conv=fsync status=none 2>/dev/null || return 0
    echo "$name p$p" >>"done.$w.log"
    if ((i % 7 == 0 && i > 5)); then
      echo "rm r${r}_w${w}_$((i - 5))" >>removed.log
      rm -f "mnt/d/r${r}_w${w}_$((i - 5))" 2>/dev/null || return 0
    fi
  done
}

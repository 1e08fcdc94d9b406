#!/usr/bin/env bash
# kill -9 of `thindisk serve` under a mounted ext4 that is busy (fs_lib.sh:
# nbdfuse and a loop device), ROUNDS times on one image. Two writers create
# files and fsync each one (dd conv=fsync), and now and then remove an
# older one; the server is killed at a random moment. After each kill:
# `thindisk check` finds no corruption (leaks allowed), ext4 replays its
# journal and e2fsck is clean, and every file whose fsync returned reads
# back exactly: a flush thindisk acknowledged survives the crash. At the
# end `check -r leaks` leaves the image clean for qemu-img check.
source "$(dirname "$0")/lib.sh"
require_tool qemu-img
# shellcheck source=fs_lib.sh
source "$SERVE_DIR/fs_lib.sh"

random_seed
RANDOM=$SEED
ROUNDS=5
POOL=16  # the files' contents: host copies to compare with

mkdir host
for ((p = 0; p < POOL; p++)); do head -c $(((p + 1) * 16384)) /dev/urandom >host/p$p; done

# up: serve disk.qcow2, attach it, and mount (ext4 replays its journal).
up() {
  rm -f td.sock  # a killed server leaves its socket file
  start_server td -k td.sock disk.qcow2
  SRV=$SERVER_PID
  wait_accepting "nbd+unix:///?socket=$PWD/td.sock"
  attach "nbd+unix:///?socket=$PWD/td.sock"
}

# verify WHAT: every file in the writers' logs whose fsync returned, and
# which no writer had begun to remove, holds its pool file's bytes.
verify() {
  local n=0 name pool
  while read -r name pool; do
    grep -qx "rm $name" removed.log 2>/dev/null && continue
    cmp -s "host/$pool" "mnt/d/$name" || fail "$1: $name (fsync returned) does not read back"
    n=$((n + 1))
  done < <(cat done.*.log 2>/dev/null)
  echo "$1: $n fsynced files intact"
}

# writer W ROUND: files rROUND_wW_I, each one of the pool files, each
# fsynced before it is logged; every 7th step removes its own file five
# steps back (logged before the rm). Stops at the first error (the kill).
writer() {
  local w=$1 r=$2 i p name
  for ((i = 1; i <= 300; i++)); do
    p=$(((i * 7 + w * 3 + r) % POOL))
    name=r${r}_w${w}_$i
    dd if="host/p$p" of="mnt/d/$name" bs=64k conv=fsync status=none 2>/dev/null || return 0
    echo "$name p$p" >>"done.$w.log"
    if ((i % 7 == 0 && i > 5)); then
      echo "rm r${r}_w${w}_$((i - 5))" >>removed.log
      rm -f "mnt/d/r${r}_w${w}_$((i - 5))" 2>/dev/null || return 0
    fi
  done
}

log "a fresh filesystem"
"$TD" create -q -f qcow2 disk.qcow2 $((256 << 20))
up
timeout 120 mkfs.ext4 -q "$LOOP" || fail "mkfs.ext4 on the served disk failed"
mount "$LOOP" mnt || fail "mount of the new filesystem failed"
mkdir mnt/d
sync -f mnt

for ((round = 1; round <= ROUNDS; round++)); do
  log "round $round: write and fsync, then kill -9"
  writer 1 "$round" &
  w1=$!
  writer 2 "$round" &
  w2=$!
  sleep "0.$((RANDOM % 8 + 2))"
  kill -KILL "$SRV"
  wait "$SRV" 2>/dev/null || true
  forget_server "$SRV"
  timeout 60 bash -c "while kill -0 $w1 2>/dev/null || kill -0 $w2 2>/dev/null; do sleep 0.05; done" ||
    fail "the writers did not stop within 60 s of the kill"
  wait "$w1" "$w2" || true
  # The dead server's filesystem cannot be unmounted cleanly: lazily. nbdfuse
  # (libnbd 1.14) often aborts on its own when the server dies, on an
  # assertion about its commands in flight; killed here otherwise.
  unmount_all
  kill -KILL "$FUSE_PID" 2>/dev/null || true
  wait "$FUSE_PID" 2>/dev/null || true
  forget_server "$FUSE_PID"

  rc=0
  "$TD" check disk.qcow2 >check.out 2>&1 || rc=$?
  ((rc == 0 || rc == 3)) || { cat check.out >&2; fail "round $round: thindisk check exit $rc"; }

  up
  mount "$LOOP" mnt || fail "round $round: the filesystem does not mount after the kill"
  umount mnt
  fs_check "round $round, after the journal replay"
  mount "$LOOP" mnt || fail "round $round: the filesystem does not mount again"
  verify "round $round"
done

umount mnt
detach
stop_server "$SRV" td
"$TD" check -r leaks disk.qcow2 >repair.out 2>&1 ||
  { cat repair.out >&2; fail "check -r leaks failed"; }
check_clean disk.qcow2
log "filesystem_kill: ok"

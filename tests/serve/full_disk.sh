#!/usr/bin/env bash
# A full host filesystem under a running `thindisk serve`: the image lives on
# a 64 MiB tmpfs nearly filled by a filler file. A client writes until the
# server answers ENOSPC (the NBD error, not EIO); the server must stay up
# (new connections, reads), the image must stay consistent (`qemu-img check`
# on the live image, leaks allowed), and once the filler is deleted the SAME
# server must take writes and flushes again, with every acknowledged write
# that a flush covered reading back (crash_client.c's model). Runs with the
# default cache (reads through the ring), with --cache=none (O_DIRECT) plus
# --aio=threads (worker threads only), and on a clone. Every client run has a
# time limit, so a request left unanswered fails instead of hanging.
#
# Needs root (mount -t tmpfs); skips otherwise unless CI is set.
source "$(dirname "$0")/lib.sh"
require_tool qemu-img nbdinfo mount umount fallocate
require_client CRASH_CLIENT

random_seed

MNT=$TMP/mnt
mkdir "$MNT"
mount -t tmpfs -o size=64m tmpfs "$MNT" 2>mount.err ||
  skip_or_fail "cannot mount a tmpfs here: $(cat mount.err)"
unmount_and_cleanup() {
  kill_servers # nothing may hold the tmpfs
  umount "$MNT" 2>/dev/null || umount -l "$MNT" || true
  cleanup
}
trap unmount_and_cleanup EXIT

# The virtual disk: 4 GiB, written in three zones (48 MiB in all, more than
# the free space) so L2 tables are allocated at 0, 1 GiB and 3 GiB.
M=$((1 << 20)) G=$((1 << 30))
ZONES="0+$((16 * M)),$((G + 5 * M))+$((16 * M)),$((3 * G))+$((16 * M))"
EXTRA_ZONE="$((2 * G))+$((8 * M))" # written only by step 5
ALL_ZONES="$ZONES,$EXTRA_ZONE"
FREE=$((20 * M)) # left beside the filler

avail() { df --output=avail -B1 "$MNT" | tail -1; }
live_check() { # IMAGE: qemu-img's view of the live image, leaks allowed
  local rc=0
  qemu-img check -U -f qcow2 "$1" >qcheck.out 2>&1 || rc=$?
  [[ $rc == 0 || $rc == 3 ]] || { cat qcheck.out >&2; fail "qemu-img check -U $1 exited $rc ($2)"; }
}
verify() { crash_verify "$1" "$2" "$ALL_ZONES" "verify $3"; } # SOCKET LOG WHEN
# client MODE ARGS...: crash_client.c under a time limit (a few seconds are
# enough for any step here), so a request the server never answers fails
# the test with this message instead of hanging it until the ctest timeout.
CLIENT_LIMIT=120
client() {
  local rc=0
  timeout "$CLIENT_LIMIT" "$CRASH_CLIENT" "$@" || rc=$?
  ((rc != 124)) || fail "crash_client $1 did not finish within ${CLIENT_LIMIT}s (a request left unanswered?)"
  return $rc
}

# cycle NAME SERVER_OPTIONS...: one fill-fail-recover cycle on a fresh image
# (a clone of $BACKING when that is set).
BACKING=
cycle() {
  local name=$1 img=$MNT/$1.qcow2 hlog=$TMP/$1.log out rc
  shift
  log "$name: serve ${*:-(defaults)} on a nearly full tmpfs${BACKING:+ (a clone)}"
  fallocate -l $(($(avail) - FREE)) "$MNT/filler"
  if [[ -n $BACKING ]]; then
    "$TD" create -q -b "$BACKING" -F qcow2 "$img"
    cp base.log "$hlog" # the base's data is the clone's durable start
  else
    "$TD" create -q "$img" $((4 * G))
  fi
  serve_unix "$name" "$name.sock" "$@" "$img"
  local pid=$SERVER_PID

  # 1. Write until the disk is full: the first error must be ENOSPC (28).
  rc=0
  out=$(client seq "$(uri "$name.sock")" "$hlog" "$SEED" "$ZONES" $((256 << 10))) || rc=$?
  [[ $rc == 0 ]] || fail "$name: the connection died while the disk filled (client exit $rc)"
  [[ $out == first_error=28\ * ]] ||
    fail "$name: writes on a full disk: $out (want ENOSPC=28 first)"
  # Random writes, write_zeroes and flushes while full (partial-cluster
  # copy-on-write, new L2 tables): each fails with ENOSPC or succeeds.
  rc=0
  CRASH_CLIENT_SAME_SERVER=1 client run "$(uri "$name.sock")" "$hlog" "$SEED" \
    "$ZONES" 300 8 2>client.err || rc=$?
  [[ $rc == 0 || $rc == 4 ]] || fail "$name: random writes on a full disk: client exit $rc"
  if grep -E '^F?E ' "$hlog" | grep -v ' 28$' >errors.out; then
    fail "$name: errors other than ENOSPC on a full disk: $(head -3 errors.out)"
  fi
  echo "full: $out, $(grep -c '^A' "$hlog") writes acknowledged, $(grep -c '^E' "$hlog") failed"

  # 2. The server is alive: a new connection, reads of everything, and a
  # consistent image on disk.
  kill -0 "$pid" 2>/dev/null || fail "$name: the server exited on ENOSPC: $(cat "$name.err")"
  [[ $* == *threads* ]] && expect_no_uring "$pid" "$name"
  nbdinfo "$(uri "$TMP/$name.sock")" >info.out 2>&1 || { cat info.out >&2; fail "$name: nbdinfo"; }
  verify "$name.sock" "$hlog" "$name: after ENOSPC"
  live_check "$img" "after ENOSPC"

  # 3. Space comes back: the same server takes random writes (and flushes),
  # and a rewrite of every zone, then everything reads back.
  rm -f "$MNT/filler"
  CRASH_CLIENT_SAME_SERVER=1 client run "$(uri "$name.sock")" "$hlog" "$SEED" "$ZONES" \
    400 8 || fail "$name: writes after freeing space (client exit $?)"
  out=$(CRASH_CLIENT_SAME_SERVER=1 client seq "$(uri "$name.sock")" "$hlog" "$SEED" \
    "$ZONES" $((1 << 20)))
  expect_eq "$name: rewriting every zone after freeing space" "$out" "first_error=0 flush=0"
  verify "$name.sock" "$hlog" "$name: after freeing space"
  live_check "$img" "after freeing space"

  # 4. A clean stop, then the image on its own: no errors and no leaks.
  # While serving, the engine held a reserve of clusters allocated ahead
  # (their refcounts raised, the space not yet written) and wrote into it
  # when the disk filled; a clean stop gives back what it did not use.
  stop_server "$pid" "$name"
  rc=0
  "$TD" check "$img" >tcheck.out 2>&1 || rc=$?
  [[ $rc == 0 ]] || { cat tcheck.out >&2; fail "$name: thindisk check exited $rc after a clean stop"; }
  check_clean "$img"
  serve_unix "$name-ro" "$name-ro.sock" -r "$img"
  verify "$name-ro.sock" "$hlog" "$name: after a restart"
  stop_server "$SERVER_PID" "$name-ro"

  # 5. Stopping while full: the final flush fails, the server says so and
  # exits anyway; the image stays consistent and what was flushed before
  # still reads back.
  serve_unix "$name-stop" "$name-stop.sock" "$@" "$img"
  pid=$SERVER_PID
  fallocate -l $(($(avail) - 4 * M)) "$MNT/filler"
  out=$(client seq "$(uri "$name-stop.sock")" "$hlog" "$SEED" "$EXTRA_ZONE" $((256 << 10)))
  [[ $out == first_error=28\ * ]] || fail "$name: filling the disk again: $out"
  terminate "$pid" "$name-stop (on a full disk)"
  rc=$STOP_RC
  [[ $rc == 0 ]] || grep -q "No space left" "$name-stop.err" ||
    fail "$name: exited $rc on a full disk without saying why: $(cat "$name-stop.err")"
  live_check "$img" "after stopping on a full disk"
  rm -f "$MNT/filler"
  serve_unix "$name-ro2" "$name-ro2.sock" -r "$img"
  verify "$name-ro2.sock" "$hlog" "$name: after stopping on a full disk"
  stop_server "$SERVER_PID" "$name-ro2"
  rm -f "$img"
}

cycle default
cycle direct --cache=none --aio=threads
# A clone whose base (outside the full filesystem) holds data in the first
# 4 MiB of each zone: partial writes copy from it while the disk is full.
"$TD" create -q base.qcow2 $((4 * G))
serve_unix base base.sock base.qcow2
BASE_ZONES="0+$((4 * M)),$((G + 5 * M))+$((4 * M)),$((3 * G))+$((4 * M))"
out=$(client seq "$(uri base.sock)" base.log "$SEED" "$BASE_ZONES" $((1 << 20)))
expect_eq "filling the base" "$out" "first_error=0 flush=0"
stop_server "$SERVER_PID" base
BACKING=$TMP/base.qcow2
cycle clone
log "full_disk: ok (seed $SEED)"

#!/usr/bin/env bash
# The ctest fixture of the RADOS suites (src/io/CMakeLists.txt): starts the
# one-node test cluster of scripts/ceph-cluster.sh in DIR before them and
# stops it after them, whether they passed or not (FIXTURES_SETUP and
# FIXTURES_CLEANUP).
#
# Usage: fixture.sh start|stop DIR
# Without the ceph tools, start skips (exit 77) locally and fails with CI or
# THINDISK_REQUIRE_TOOLS set (tests/lib/common.sh); the suites then skip or
# fail themselves by the same rule (they find no cluster).
#
# One cluster per build directory, owned by the ctest run that started it
# (DIR.owner holds that ctest's pid: this script's parent). A second ctest
# run in the same build directory while the first is alive fails its start
# with a message instead of taking the cluster away, and its stop leaves the
# first run's cluster alone. A cluster whose ctest is gone is a leftover:
# start replaces it, stop stops it.
source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

[[ $# == 2 ]] || fail "usage: $0 start|stop DIR"
CLUSTER=$(dirname "${BASH_SOURCE[0]}")/../../scripts/ceph-cluster.sh
DIR=$2
OWNER_FILE=$DIR.owner

# owner_alive: the pid in OWNER_FILE is a live ctest other than our parent.
other_owner_alive() {
  local pid
  [[ -f $OWNER_FILE ]] || return 1
  pid=$(<"$OWNER_FILE")
  [[ $pid =~ ^[0-9]+$ && $pid != "$PPID" && -r /proc/$pid/cmdline ]] || return 1
  tr '\0' '\n' <"/proc/$pid/cmdline" | head -1 | grep -q 'ctest$'
}

case $1 in
start)
  [[ ,${THINDISK_TEST_DENY:-}, != *,ceph,* ]] || skip_or_fail "ceph denied by THINDISK_TEST_DENY"
  require_tool ceph ceph-mon ceph-osd monmaptool rados
  if other_owner_alive; then
    fail "the cluster in $DIR belongs to another ctest run (pid $(<"$OWNER_FILE")) in this build directory: wait for it to finish"
  fi
  bash "$CLUSTER" stop "$DIR" 2>/dev/null || true # a leftover of a run that died
  echo "$PPID" >"$OWNER_FILE"
  exec bash "$CLUSTER" start "$DIR"
  ;;
stop)
  # Nothing to stop when start skipped (no tools, no directory).
  [[ -d $DIR ]] || exit 0
  if other_owner_alive; then
    echo "not stopping $DIR: it belongs to another ctest run (pid $(<"$OWNER_FILE"))"
    exit 0
  fi
  rm -f "$OWNER_FILE"
  exec bash "$CLUSTER" stop "$DIR"
  ;;
*) fail "usage: $0 start|stop DIR" ;;
esac

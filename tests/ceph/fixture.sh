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
source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

[[ $# == 2 ]] || fail "usage: $0 start|stop DIR"
CLUSTER=$(dirname "${BASH_SOURCE[0]}")/../../scripts/ceph-cluster.sh
case $1 in
start)
  require_tool ceph ceph-mon ceph-osd monmaptool rados
  exec bash "$CLUSTER" start "$2"
  ;;
stop)
  # Nothing to stop when start skipped (no tools, no directory).
  [[ -d $2 ]] || exit 0
  exec bash "$CLUSTER" stop "$2"
  ;;
*) fail "usage: $0 start|stop DIR" ;;
esac

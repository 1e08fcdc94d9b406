# shellcheck shell=bash
# Helpers the RADOS scripts share (tests/ceph/*.sh), sourced after their own
# lib (tests/interop/lib.sh or tests/serve/lib.sh, for fail). POOL is the
# pool they work in.

# require_test_cluster: CEPH_CONF names the test cluster (ctest starts it:
# tests/ceph/fixture.sh), or the suite skips (fails in CI); `ceph` in
# THINDISK_TEST_DENY skips it too. A cluster an earlier test found stalled
# (the `stalled` mark in its directory: src/io/rados_test_util.h's
# ClusterAnswersAfterFailure, or probe_test_cluster below) fails the suite
# at once instead of letting it wait out every request's timeout. If the
# suite fails, probe_test_cluster runs before its cleanup.
require_test_cluster() {
  [[ ,${THINDISK_TEST_DENY:-}, != *,ceph,* ]] || skip_or_fail "ceph denied by THINDISK_TEST_DENY"
  [[ -n ${CEPH_CONF:-} && -r ${CEPH_CONF:-} ]] ||
    skip_or_fail "no test cluster: CEPH_CONF='${CEPH_CONF:-}' (ctest -R rados starts one)"
  TEST_CLUSTER_DIR=$(cd "$(dirname "$CEPH_CONF")" && pwd)
  [[ ! -e $TEST_CLUSTER_DIR/stalled ]] ||
    fail "the test cluster stopped answering in an earlier test ($TEST_CLUSTER_DIR/stalled): not waiting on it again"
  FAILURE_HOOKS+=(probe_test_cluster)
}

# probe_test_cluster: after a failure, is the test cluster still answering
# (a write and a read, 10 s each)? If not, prints its report
# (scripts/ceph-cluster.sh report) and leaves the `stalled` mark for the
# later suites. The cluster of require_test_cluster, even when the suite
# pointed CEPH_CONF at one of its own since.
probe_test_cluster() {
  local dir=${TEST_CLUSTER_DIR:-} object=td-probe-$$ report
  [[ -n $dir && -d $dir && ! -e $dir/stalled ]] || return 0
  local -a probe=(timeout 20 rados -c "$dir/ceph.conf" -p thindisk --rados-osd-op-timeout 10)
  if "${probe[@]}" put "$object" "$dir/ceph.conf" >/dev/null 2>&1 &&
    "${probe[@]}" stat "$object" >/dev/null 2>&1; then
    "${probe[@]}" rm "$object" >/dev/null 2>&1 || true
    return 0
  fi
  report=$(timeout 60 bash "$(dirname "${BASH_SOURCE[0]}")/../../scripts/ceph-cluster.sh" report "$dir" 2>&1 || true)
  printf '%s\n' "$report" >"$dir/stalled"
  echo "the test cluster stopped answering (a write and a read of $object within 10 s each failed):" >&2
  printf '%s\n' "$report" >&2
}

# rados_ ARGS...: the `rados` CLI on POOL, bounded.
rados_() { timeout 60 rados -p "$POOL" "$@"; }

# watched HEADER: the header object has a watcher (a rados error fails).
watched() {
  local w
  w=$(rados_ listwatchers "$1" 2>&1) || fail "rados listwatchers $1: $w"
  [[ $w == *watcher* ]]
}

# wait_watch_gone HEADER: the header object has no watcher left, within
# 60 s (the test cluster's watch timeout is 5 s; the OSD checks it every few
# seconds), after its holder was stopped or killed.
wait_watch_gone() {
  local i
  for ((i = 0; i < 240; i++)); do
    watched "$1" || return 0
    sleep 0.25
  done
  fail "the watch on $1 is still registered 60 s after its holder stopped"
}

# shellcheck shell=bash
# Helpers the RADOS scripts share (tests/ceph/*.sh), sourced after their own
# lib (tests/interop/lib.sh or tests/serve/lib.sh, for fail). POOL is the
# pool they work in.

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

# shellcheck shell=bash
# What every test script shares; tests/interop/lib.sh and tests/serve/lib.sh
# source it first and add their own helpers. Sourcing it sets
# `set -euo pipefail`, TEST_NAME (the script's name without .sh) and TD (the
# thindisk binary: $THINDISK, else thindisk on PATH; made absolute when it
# is a path). The suite's lib then calls enter_temp_dir.
#
# Exit codes: 0 pass, 1 fail, 77 skipped (ctest SKIP_RETURN_CODE). A missing
# tool skips locally; with CI or THINDISK_REQUIRE_TOOLS set it fails.
set -euo pipefail

TEST_NAME=$(basename "$0" .sh)
TD=${THINDISK:-thindisk}
[[ $TD == */* ]] && TD=$(realpath "$TD")

# fail MESSAGE: prints it (and FAIL_NOTE, when the script set one, e.g. the
# seed that reproduces a run) and exits 1.
fail() {
  echo "FAIL [$TEST_NAME]: $*" >&2
  [[ -z ${FAIL_NOTE:-} ]] || echo "$FAIL_NOTE" >&2
  exit 1
}

log() { echo "--- $*"; }

# capabilities_required: true when CI or THINDISK_REQUIRE_TOOLS is set, i.e.
# a missing tool or capability (io_uring, a tmpfs mount) must fail the test
# rather than skip it (the gtests' rule too: src/util/capability_test_util.h).
capabilities_required() { [[ -n ${CI:-} || -n ${THINDISK_REQUIRE_TOOLS:-} ]]; }

# skip_or_fail REASON: a missing prerequisite skips locally, fails in CI.
skip_or_fail() {
  if capabilities_required; then
    fail "$* (CI/THINDISK_REQUIRE_TOOLS set: missing tools are failures)"
  fi
  echo "SKIP [$TEST_NAME]: $*" >&2
  exit 77
}

# require_tool NAME...: each must be an executable path or on PATH.
require_tool() {
  local t
  for t in "$@"; do
    command -v "$t" >/dev/null 2>&1 || skip_or_fail "required tool not found: $t"
  done
}

require_thindisk() {
  [[ -x $TD ]] || command -v "$TD" >/dev/null 2>&1 || skip_or_fail "thindisk binary not built: $TD"
}

# assert_eq EXPECTED ACTUAL WHAT
assert_eq() {
  [[ $1 == "$2" ]] || fail "$3: expected '$1', got '$2'"
}

# ---- The temp dir and background servers --------------------------------

# Background processes (spawn) that the exit cleanup kills.
SERVER_PIDS=()

# kill_servers: SIGKILL to every spawned process still running, then reaps.
kill_servers() {
  local p
  for p in "${SERVER_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${SERVER_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}

# Functions the exit cleanup calls first when the script fails (any exit
# status but 0 and 77), e.g. tests/ceph/lib.sh's probe of the shared test
# cluster. Each is bounded; what it returns is ignored.
FAILURE_HOOKS=()

# cleanup [STATUS]: the EXIT trap; STATUS is the script's exit status ($?
# when the trap calls it directly). A script that needs more (an unmount)
# sets its own trap that keeps $?, does its part and then calls cleanup with
# that status.
cleanup() {
  local status=${1:-$?} hook
  if [[ $status != 0 && $status != 77 ]]; then
    for hook in "${FAILURE_HOOKS[@]}"; do "$hook" || true; done
  fi
  kill_servers
  cd /
  rm -rf "$TMP"
}

# enter_temp_dir PREFIX: TMP becomes a fresh directory
# PREFIX-$TEST_NAME-XXXXXX under $TMPDIR (/tmp), the working directory; at
# exit the spawned servers are killed and the directory removed.
enter_temp_dir() {
  TMP=$(mktemp -d "${TMPDIR:-/tmp}/$1-$TEST_NAME-XXXXXX")
  trap cleanup EXIT
  cd "$TMP"
}

# wait_for_socket PATH [SECONDS]: until a Unix socket exists there (10 s).
wait_for_socket() {
  local path=$1 limit=${2:-10} i
  for ((i = 0; i < limit * 20; i++)); do
    [[ -S $path ]] && return 0
    sleep 0.05
  done
  fail "no socket at $path after ${limit}s"
}

# wait_accepting URI: until an NBD server answers a handshake there (10 s):
# a Unix socket appears at bind(), before the server listens.
wait_accepting() {
  local i
  for ((i = 0; i < 200; i++)); do
    timeout 5 nbdinfo --size "$1" >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  fail "no NBD server answers at $1 after 10 s"
}

# spawn NAME CMD...: runs CMD in the background with its stdout/stderr in
# NAME.out/NAME.err; sets SERVER_PID and registers it for the cleanup.
spawn() {
  local name=$1
  shift
  "$@" >"$name.out" 2>"$name.err" &
  SERVER_PID=$!
  SERVER_PIDS+=("$SERVER_PID")
}

# start_server NAME ARGS...: `thindisk serve ARGS` through spawn. The caller
# passes -k SOCKET and waits for it with wait_for_socket (or uses serve_unix).
start_server() {
  local name=$1
  shift
  spawn "$name" "$TD" serve "$@"
}

# serve_unix NAME SOCKET ARGS...: start_server with -k SOCKET, then waits.
serve_unix() {
  local name=$1 sock=$2
  shift 2
  start_server "$name" -k "$sock" "$@"
  wait_for_socket "$sock"
}

# qemu_nbd_unix NAME SOCKET ARGS...: `qemu-nbd -k SOCKET ARGS` through
# spawn, then waits for the socket.
qemu_nbd_unix() {
  local name=$1 sock=$2
  shift 2
  spawn "$name" qemu-nbd -k "$sock" "$@"
  wait_for_socket "$sock"
}

# forget_server PID: the cleanup no longer kills PID (it was reaped; the
# number may be reused).
forget_server() {
  local p keep=()
  for p in "${SERVER_PIDS[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
  SERVER_PIDS=("${keep[@]}")
}

# kill_server PID [SIGNAL]: sends SIGNAL (TERM) to a server that must still
# be running, and reaps it whatever its exit status.
kill_server() {
  kill -s "${2:-TERM}" "$1" 2>/dev/null || fail "server (pid $1) exited before it was stopped"
  wait "$1" 2>/dev/null || true
  forget_server "$1"
}

# wait_exit PID NAME WHY: the server must exit within 30 s (WHY says after
# what, for the message); reaps it and sets STOP_RC to its exit status.
wait_exit() {
  local pid=$1 name=$2 i
  for ((i = 0; i < 600; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  kill -0 "$pid" 2>/dev/null && fail "$name did not exit within 30s of $3"
  STOP_RC=0
  wait "$pid" || STOP_RC=$?
  forget_server "$pid"
}

# terminate PID NAME: SIGTERM, then the server must exit within 30 s; sets
# STOP_RC to its exit status.
terminate() {
  kill -TERM "$1" 2>/dev/null || fail "$2 (pid $1) already gone"
  wait_exit "$1" "$2" SIGTERM
}

# stop_server PID [NAME]: terminate, and the server must exit 0 (it drains,
# flushes and closes its images first); on failure NAME.err is shown.
stop_server() {
  local name=${2:-server}
  terminate "$1" "$name"
  [[ $STOP_RC == 0 ]] ||
    { cat "$name.err" >&2 2>/dev/null || true; fail "$name exited $STOP_RC after SIGTERM"; }
}

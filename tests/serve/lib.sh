# Helpers for the `thindisk serve` scripts. Source it first:
#   source "$(dirname "$0")/lib.sh"
#
# Environment (set by tests/serve/CMakeLists.txt; defaults for running by hand):
#   THINDISK        the thindisk binary (the real one: the tests start it)
#   HOSTILE_CLIENT  the libnbd hostile client (hostile.sh only)
#   CI or THINDISK_REQUIRE_TOOLS   a missing tool fails instead of skipping
#
# Exit codes: 0 pass, 1 fail, 77 skipped. Servers listen on Unix sockets in
# the test's temp dir (or 127.0.0.1) and are killed when the script exits.
set -euo pipefail

TD=${THINDISK:-thindisk}
TEST_NAME=$(basename "$0" .sh)
SERVE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

fail() {
  echo "FAIL [$TEST_NAME]: $*" >&2
  exit 1
}
log() { echo "--- $*"; }

skip_or_fail() {
  if [[ -n ${CI:-} || -n ${THINDISK_REQUIRE_TOOLS:-} ]]; then
    fail "$* (CI/THINDISK_REQUIRE_TOOLS set: missing tools are failures)"
  fi
  echo "SKIP [$TEST_NAME]: $*" >&2
  exit 77
}

require_tool() {
  local t
  for t in "$@"; do
    command -v "$t" >/dev/null 2>&1 || skip_or_fail "required tool not found: $t"
  done
}

[[ $TD == */* ]] && TD=$(realpath "$TD")
[[ -x $TD ]] || command -v "$TD" >/dev/null 2>&1 || skip_or_fail "thindisk binary not built: $TD"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/td-serve-$TEST_NAME-XXXXXX")
SERVER_PIDS=()
cleanup() {
  local p
  for p in "${SERVER_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  cd /
  rm -rf "$TMP"
}
trap cleanup EXIT
cd "$TMP"

# wait_for_socket PATH [SECONDS]: until a Unix socket exists there.
wait_for_socket() {
  local path=$1 limit=${2:-10} i
  for ((i = 0; i < limit * 20; i++)); do
    [[ -S $path ]] && return 0
    sleep 0.05
  done
  fail "no socket at $path after ${limit}s"
}

# start_server NAME ARGS...: runs `thindisk serve ARGS` in the background
# with its stdout/stderr in NAME.out/NAME.err; sets SERVER_PID. The caller
# passes -k SOCKET and waits for it with wait_for_socket (or use serve_unix).
start_server() {
  local name=$1
  shift
  "$TD" serve "$@" >"$name.out" 2>"$name.err" &
  SERVER_PID=$!
  SERVER_PIDS+=("$SERVER_PID")
}

# serve_unix NAME SOCKET ARGS...: start_server with -k SOCKET, then wait.
serve_unix() {
  local name=$1 sock=$2
  shift 2
  start_server "$name" -k "$sock" "$@"
  wait_for_socket "$sock"
}

# stop_server PID [NAME]: SIGTERM, then the server must exit 0 within 30s
# (it drains, flushes and closes its images first).
stop_server() {
  local pid=$1 name=${2:-server} i rc
  kill -TERM "$pid" 2>/dev/null || fail "$name (pid $pid) already gone"
  for ((i = 0; i < 600; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  kill -0 "$pid" 2>/dev/null && fail "$name did not exit within 30s of SIGTERM"
  rc=0
  wait "$pid" || rc=$?
  [[ $rc == 0 ]] || { cat "$name.err" >&2 2>/dev/null || true; fail "$name exited $rc after SIGTERM"; }
}

# uri SOCKET [EXPORT]: the NBD URI of an export on a Unix socket.
uri() { echo "nbd+unix:///${2:-}?socket=$1"; }

# expect_eq WHAT GOT WANT
expect_eq() {
  [[ $2 == "$3" ]] || fail "$1: got '$2', want '$3'"
}

# check_clean IMAGE: qemu-img check finds no errors and no leaks.
check_clean() {
  qemu-img check -f qcow2 "$1" >check.out 2>&1 || { cat check.out >&2; fail "qemu-img check $1 failed"; }
  grep -q "No errors were found" check.out || { cat check.out >&2; fail "qemu-img check $1 not clean"; }
}

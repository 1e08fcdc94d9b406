# shellcheck shell=bash
# Helpers for the `thindisk serve` scripts. Source it first:
#   source "$(dirname "$0")/lib.sh"
# It sources tests/lib/common.sh (fail, log, skip_or_fail, require_tool,
# assert_eq, the temp dir and serve_unix/start_server/stop_server/
# qemu_nbd_unix/kill_server) and adds what only these scripts use.
#
# Environment (set by tests/serve/CMakeLists.txt; defaults for running by hand):
#   THINDISK        the thindisk binary (the real one: the tests start it)
#   HOSTILE_CLIENT, STRESS_CLIENT, HOSTILE_SCALE_CLIENT, CRASH_CLIENT
#                   the C clients of this folder (require_client)
#   CI or THINDISK_REQUIRE_TOOLS   a missing tool fails instead of skipping
#
# Exit codes: 0 pass, 1 fail, 77 skipped. Servers listen on Unix sockets in
# the test's temp dir (or 127.0.0.1) and are killed when the script exits.
SERVE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib/common.sh
source "$SERVE_DIR/../lib/common.sh"

require_thindisk
enter_temp_dir td-serve

# require_client VAR: the C client named by environment variable VAR (set by
# CMake when libnbd-dev was found) must be built.
require_client() {
  local path=${!1:-}
  [[ -n $path && -x $path ]] || skip_or_fail "$1 not built (libnbd-dev missing?)"
}

# random_seed: SEED is THINDISK_SEED, or a fresh random one; it is printed,
# and a failure prints how to reproduce the run.
random_seed() {
  SEED=${THINDISK_SEED:-$(((RANDOM << 30) ^ (RANDOM << 15) ^ RANDOM))}
  # shellcheck disable=SC2034 # read by fail() (common.sh)
  FAIL_NOTE="reproduce with THINDISK_SEED=$SEED"
  echo "seed: THINDISK_SEED=$SEED"
}

# crash_verify SOCKET LOG ZONES WHAT: crash_client.c's verify of ZONES
# through the server on SOCKET, against the history in LOG (seed $SEED);
# a mismatch fails with WHAT.
crash_verify() {
  "$CRASH_CLIENT" verify "$(uri "$1")" "$2" "$SEED" "$3" >verify.out 2>verify.err ||
    { cat verify.err >&2; fail "$4"; }
}

# uri SOCKET [EXPORT]: the NBD URI of an export on a Unix socket.
uri() { echo "nbd+unix:///${2:-}?socket=$1"; }

# expect_eq WHAT GOT WANT (assert_eq with the description first).
expect_eq() { assert_eq "$3" "$2" "$1"; }

# check_clean IMAGE: qemu-img check finds no errors and no leaks.
check_clean() {
  qemu-img check -f qcow2 "$1" >check.out 2>&1 || { cat check.out >&2; fail "qemu-img check $1 failed"; }
  grep -q "No errors were found" check.out || { cat check.out >&2; fail "qemu-img check $1 not clean"; }
}

# uring_rings PID: how many io_uring rings process PID holds (its
# anon_inode:[io_uring] descriptors).
uring_rings() {
  local fd n=0
  for fd in /proc/"$1"/fd/*; do
    [[ $(readlink "$fd" 2>/dev/null) == "anon_inode:[io_uring]" ]] && n=$((n + 1))
  done
  echo "$n"
}

# expect_no_uring PID WHAT: the server PID, run with --aio=threads, holds
# no io_uring ring: its reads go through worker threads only.
expect_no_uring() {
  local n
  n=$(uring_rings "$1")
  ((n == 0)) || fail "$2: $n io_uring ring(s) under --aio=threads"
}

# expect_rings_at_most PID N WHAT: the server PID holds at most N rings
# (one per client connection reading through it, none left by one gone).
expect_rings_at_most() {
  local n
  n=$(uring_rings "$1")
  ((n <= $2)) || fail "$3: $n io_uring ring(s) for at most $2 connection(s)"
}

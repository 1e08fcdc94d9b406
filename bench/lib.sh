# bench/lib.sh: what the benchmark scripts share. Each sets BENCH (its name,
# the prefix of its messages) and sources this file right after `set -euo
# pipefail`; it defines here and src_root.
# shellcheck shell=bash

here=$(cd "$(dirname "$0")" && pwd)
src_root=$(dirname "$here")

say() { echo "$BENCH: $*" >&2; }
die() { say "$@"; exit 2; }  # a setup problem: exit 2, nothing measured

# usage: the script's header comment, from its second line to the first
# line that is not a comment.
usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | sed 's/^# \{0,1\}//'; }

# bench_args "$@": --quick (sets quick=1), -h/--help, and an optional build
# directory (build_dir) where thindisk is built when THINDISK is not set.
bench_args() {
  # shellcheck disable=SC2034  # the scripts read quick
  quick=0
  build_dir=""
  # shellcheck disable=SC2034  # the scripts read quick
  while (($#)); do
    case $1 in
      --quick) quick=1 ;;
      -h | --help) usage; exit 0 ;;
      -*) say "unknown option $1"; usage >&2; exit 2 ;;
      *) build_dir=$1 ;;
    esac
    shift
  done
}

require_tools() {  # require_tools TOOL...
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || die "$tool is required"
  done
}

# bench_thindisk: sets TD to $THINDISK, or builds thindisk (RelWithDebInfo)
# in build_dir (default build-compare in the source tree).
bench_thindisk() {
  if [[ -n ${THINDISK:-} ]]; then
    TD=$(realpath "$THINDISK")
  else
    build_dir=${build_dir:-$src_root/build-compare}
    say "building thindisk (RelWithDebInfo) in $build_dir"
    cmake -S "$src_root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build "$build_dir" --target thindisk >/dev/null
    TD=$build_dir/thindisk
  fi
  [[ -x $TD ]] || die "no thindisk binary at '$TD'"
}

# Cold phases start from synced files and an empty page cache (root only;
# DROP_CACHES=0 measures warm instead, and the tables say so).
DROP_CACHES=${DROP_CACHES:-1}
require_drop_caches() {
  if ((DROP_CACHES)) && ! { : >/proc/sys/vm/drop_caches; } 2>/dev/null; then
    die "cannot drop the page cache (run as root, or DROP_CACHES=0 for warm figures)"
  fi
}
settle() {
  sync
  if ((DROP_CACHES)); then echo 3 >/proc/sys/vm/drop_caches; fi
}

# Raw results, one figure a line, in $RESULTS; fio's JSON figures.
record() { echo "$1 $2 $3 $4" >>"$RESULTS"; }  # run target metric value
iops() { jq ".jobs[0].$2.iops" "$1"; }
mbps() { jq ".jobs[0].$2.bw_bytes / 1e6" "$1"; }

# together JSON RUNTIME: the time-based jobs of one fio run ran at the same
# time, not one after another. A server that takes one connection at a time
# (qemu-nbd without -e) makes fio's other jobs wait their turn, and the sum
# of their figures then measures each job alone.
together() {
  local wall
  wall=$(jq '[.jobs[].elapsed] | max' "$1")
  ((wall <= 2 * $2 + 10)) ||
    die "fio's jobs took ${wall}s for ${2}s each: they ran one after another (does the server take one connection at a time?)"
}

# nbd_ready SOCKET [EXPORT]: a server answers a handshake there. The socket
# file appears at bind(), before listen(): qemu-nbd refused fio's connection
# in that window once (CI, 2026-12-03), so the file alone does not do.
nbd_ready() {
  [[ -S $1 ]] && timeout 5 nbdinfo --size "nbd+unix:///${2:-}?socket=$1" >/dev/null 2>&1
}

# wait_server NAME PID LOG PROBE...: until PROBE succeeds (10 s at most);
# exits naming NAME, with LOG (the server's stderr), when the server dies
# or the time runs out.
wait_server() {
  local name=$1 pid=$2 log=$3 i
  shift 3
  for ((i = 0; i < 400; i++)); do
    "$@" && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.025
  done
  say "$name did not start${log:+: $(cat "$log" 2>/dev/null)}"
  exit 1
}

# stop_server: ends the server SERVER_PID names (SIGTERM: it drains) and
# waits for it; nothing when none runs.
SERVER_PID=""
stop_server() {
  [[ -z $SERVER_PID ]] && return 0
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
}

# The EXIT trap's parts: end_server ends a server still running (never
# failing: the script may be exiting on an error), end_work removes WORK
# (KEEP=1 keeps it, and says where).
end_server() {
  [[ -z $SERVER_PID ]] && return 0
  kill "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
}
end_work() {
  if [[ ${KEEP:-0} == 1 ]]; then say "kept $WORK"; else rm -rf "$WORK"; fi
}

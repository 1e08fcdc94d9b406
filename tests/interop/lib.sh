# shellcheck shell=bash
# Common helpers for the interop scripts. Source it first:
#   source "$(dirname "$0")/lib.sh"
#
# Environment (set by tests/CMakeLists.txt; defaults for running by hand):
#   THINDISK   path of the thindisk binary
#   QEMU_IMG, QEMU_IO   qemu tools (default: from PATH)
#   CI or THINDISK_REQUIRE_TOOLS   a missing tool fails instead of skipping
#
# Exit codes: 0 pass, 1 fail, 77 skipped (ctest SKIP_RETURN_CODE).

# This directory, for sourcing siblings after we cd into the temp dir.
export INTEROP_DIR
INTEROP_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# fail, log, skip_or_fail, require_tool, require_thindisk, assert_eq, the
# temp dir and the background-server helpers (serve_unix, qemu_nbd_unix,
# stop_server, kill_server).
# shellcheck source=../lib/common.sh
source "$INTEROP_DIR/../lib/common.sh"

QEMU_IMG=${QEMU_IMG:-qemu-img}
QEMU_IO=${QEMU_IO:-qemu-io}

# Scripts run inside a fresh temporary directory, removed on exit.
enter_temp_dir thindisk

# Last command's captured output, for assertions and messages.
OUT=$TMP/.out
ERR=$TMP/.err

# capture CMD...: runs CMD with stdout/stderr in $OUT/$ERR; sets RC. Never
# exits on the command's failure. A sanitizer report is always a failure.
capture() {
  set +e
  "$@" >"$OUT" 2>"$ERR"
  RC=$?
  set -e
  if grep -qE 'Sanitizer|runtime error:' "$ERR"; then
    cat "$ERR" >&2
    fail "sanitizer report from: $*"
  fi
}

# capture_traced EVENTS TRACE CMD...: capture CMD under `strace -f -e
# trace=EVENTS -o TRACE`. LeakSanitizer cannot run under ptrace, so an ASan
# build's leak check is off for the traced command.
capture_traced() {
  local events=$1 trace=$2
  shift 2
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
    capture strace -f -e trace="$events" -o "$trace" "$@"
}

# direct_fds TRACE FILE: how many descriptors of FILE were switched to
# O_DIRECT in an strace log of openat and fcntl (capture_traced openat,fcntl).
direct_fds() {
  python3 - "$1" "$2" <<'EOF'
import re, sys
fds, direct = set(), 0
for line in open(sys.argv[1]):
    m = re.search(r'openat\(AT_FDCWD, "([^"]*)", .*\) = (\d+)$', line)
    if m:
        if m.group(1).endswith(sys.argv[2]):
            fds.add(m.group(2))
        else:
            fds.discard(m.group(2))
        continue
    m = re.search(r'fcntl\((\d+), F_SETFL, .*O_DIRECT', line)
    if m and m.group(1) in fds:
        direct += 1
print(direct)
EOF
}

# ok CMD...: CMD must exit 0; on failure prints its output and the command.
ok() {
  capture "$@"
  if [[ $RC -ne 0 ]]; then
    sed 's/^/  stdout: /' "$OUT" >&2
    sed 's/^/  stderr: /' "$ERR" >&2
    fail "exit $RC from: $*"
  fi
}

# td ARGS...: runs thindisk, must succeed.
td() { ok "$TD" "$@"; }

# io_ok TOOL FILE CMDS...: runs a qemu-io-style tool (qemu-io, qemu-io-raw
# for qemu-io -f raw, or thindisk for thindisk io) with one -c per command;
# every command must succeed and no pattern verification may fail (the tool's output is checked as well as its exit).
io_ok() {
  local tool=$1 file=$2
  shift 2
  local args=() c
  for c in "$@"; do args+=(-c "$c"); done
  if [[ $tool == thindisk ]]; then
    ok "$TD" io "${args[@]}" "$file"
  elif [[ $tool == qemu-io-raw ]]; then
    ok "$QEMU_IO" -f raw "${args[@]}" "$file"
  else
    ok "$QEMU_IO" "${args[@]}" "$file"
  fi
  if grep -qiE 'verification failed|mismatch|error|failed' "$OUT" "$ERR"; then
    sed 's/^/  stdout: /' "$OUT" >&2
    sed 's/^/  stderr: /' "$ERR" >&2
    fail "$tool reported a failure on $file"
  fi
}

# td_fails PATTERN WHAT ARGS...: `thindisk ARGS` must exit 1 with PATTERN
# (grep -E; "" for any message) on stderr.
td_fails() {
  local pattern=$1 what=$2
  shift 2
  capture "$TD" "$@"
  if [[ $RC -ne 1 ]] || { [[ -n $pattern ]] && ! grep -qE -- "$pattern" "$ERR"; }; then
    fail "$what: exit $RC, $(cat "$ERR")"
  fi
}

# qemu_check IMAGE...: `qemu-img check` exits 0 on each (no corruption, no
# leaks).
qemu_check() {
  local f
  for f in "$@"; do ok "$QEMU_IMG" check "$f"; done
}

assert_same_bytes() {  # assert_same_bytes A B WHAT
  cmp "$1" "$2" >&2 || fail "$3: $1 and $2 differ"
}

assert_absent() {  # assert_absent PATH WHAT
  [[ ! -e $1 ]] || fail "$2: $1 exists"
}

# count_byte FILE HEXBYTE: how many bytes of FILE equal HEXBYTE (e.g. aa).
count_byte() {
  LC_ALL=C tr -cd "\\$(printf '%03o' "0x$2")" <"$1" | wc -c
}

# qcow2_opts CLUSTER EXT COMPAT REFBITS COMPRESSION: a qcow2 -o string that
# both qemu-img and thindisk accept.
qcow2_opts() {
  local o="cluster_size=$1,compat=$3,refcount_bits=$4"
  if [[ $3 == 1.1 ]]; then
    o+=",extended_l2=$2,compression_type=$5"
  fi
  echo "$o"
}

# assert_info_agrees IMAGE [OPTION...]: `qemu-img info` and `thindisk info`
# (JSON, both given the same OPTIONs, e.g. -f vpc) must give the same value
# for every field both report (leaf by leaf). Its file system is synced
# first (syncfs): qemu-img convert writes its target in cache mode unsafe
# (no fsync), and while the kernel's delayed allocation is still settling,
# the allocated size (actual-size) can move by a block between the two
# reads. The whole file system, not the one file: an image's actual-size
# may add up several files (a monolithicFlat vmdk's descriptor and extent;
# flat.vmdk moved by 4 KiB once with only the descriptor synced).
assert_info_agrees() {
  local img=$1
  sync -f -- "$img"
  ok "$QEMU_IMG" info "${@:2}" --output=json "$img"
  cp "$OUT" "$TMP/.qemu-info.json"
  td info "${@:2}" --output=json "$img"
  cp "$OUT" "$TMP/.td-info.json"
  local diffs common
  diffs=$(jq -n -c --slurpfile q "$TMP/.qemu-info.json" --slurpfile t "$TMP/.td-info.json" '
    ($q[0]) as $q | ($t[0]) as $t
    | [$t | paths(scalars)]
    | map(. as $p | try {path: $p, thindisk: ($t | getpath($p)), qemu: ($q | getpath($p))}
                    catch empty)
    | map(select(.qemu != null and .qemu != .thindisk))') ||
    fail "$img: info output is not JSON"
  common=$(jq -n --slurpfile q "$TMP/.qemu-info.json" --slurpfile t "$TMP/.td-info.json" '
    ($q[0]) as $q | ($t[0]) as $t
    | [$t | paths(scalars) | . as $p | select((try ($q | getpath($p)) catch null) != null)]
    | length')
  [[ $diffs == "[]" ]] || fail "$img: thindisk info disagrees with qemu-img info: $diffs"
  ((common >= 3)) || fail "$img: thindisk info shares only $common fields with qemu-img info"
}

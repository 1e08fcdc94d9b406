#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) into build-fuzz/
# and runs them side by side, each for the given number of seconds (default
# 60), starting from fuzz/corpus/<target>/ (new inputs go to
# build-fuzz/corpus/<target>/).
# Crashers land in build-fuzz/crashers/<target>/; commit each one under
# fuzz/regressions/<target>/ once fixed (ctest -L fuzz replays them).
#
#   fuzz/run.sh [seconds] [target...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
secs="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(qcow2_open_fuzz nbd_session_fuzz import_image_fuzz)
build="$root/build-fuzz"

cc="$(command -v clang-14 || command -v clang)"
cxx="$(command -v clang++-14 || command -v clang++)"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link" -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link" \
  -DTHINDISK_SANITIZE=address,undefined >/dev/null
cmake --build "$build" -j2 --target "${targets[@]}"

# The targets run side by side, one per CPU (the CI machine has two): each
# still gets the full time, and the second CPU does not sit idle. Each one's
# output goes to build-fuzz/<target>.log, and its end is printed in order.
pids=()
for t in "${targets[@]}"; do
  mkdir -p "$build/corpus/$t" "$build/crashers/$t"
  (cd "$build/crashers/$t" && "$build/fuzz/$t" -max_total_time="$secs" -timeout=10 \
     -rss_limit_mb=2048 -print_final_stats=1 \
     "$build/corpus/$t" "$here/corpus/$t" >"$build/$t.log" 2>&1) &
  pids+=($!)
done
status=0
for i in "${!targets[@]}"; do
  t=${targets[$i]}
  rc=0
  wait "${pids[$i]}" || rc=$?
  echo "== $t for ${secs}s (exit $rc)"
  tail -n 25 "$build/$t.log"
  ((rc == 0)) || status=1
done
exit $status

#!/usr/bin/env bash
# The one test command: install dependencies, then build and run every ctest
# suite twice, once optimized (build/) and once under ASan+UBSan (build-asan/).
# Exits non-zero on any failure. Sized for 2 cores in under 60 minutes (51.6-57 measured on 2026-12-03).
#
# Environment:
#   THINDISK_SKIP_DEPS=1   skip scripts/install-deps.sh (developer machines)
#   THINDISK_JOBS=N        build and test parallelism (default 2)
#   THINDISK_SKIP_ASAN=1   skip the ASan+UBSan pass (quick local iteration)
#   THINDISK_SKIP_TSAN=1   skip the ThreadSanitizer pass (server and engine threads)
#   THINDISK_SKIP_FUZZ=1   skip the libFuzzer pass (clang, ASan+UBSan)
#   THINDISK_FUZZ_SECONDS=N  time per fuzz target (default 60)
#   THINDISK_BUILD_DIR, THINDISK_ASAN_BUILD_DIR   build directories (default
#                          build, build-asan)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
BUILD=${THINDISK_BUILD_DIR:-build}
BUILD_ASAN=${THINDISK_ASAN_BUILD_DIR:-build-asan}
JOBS=${THINDISK_JOBS:-2}

# Missing tools (qemu-img, nbdinfo, ...) fail the run instead of skipping tests.
export THINDISK_REQUIRE_TOOLS=1
export CI=${CI:-true}
# Sanitizer reports must fail the test that triggered them, with a stack.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

step() { printf '\n=== %s [%s]\n' "$*" "$(date -u +%H:%M:%S)"; }

if [[ ${THINDISK_SKIP_DEPS:-0} != 1 ]]; then
  step "install dependencies"
  bash scripts/install-deps.sh
fi

# build_and_test DIR TEST_JOBS CMAKE_ARGS...
build_and_test() {
  local dir=$1 test_jobs=$2
  shift 2
  step "configure $dir"
  cmake -S "$ROOT" -B "$ROOT/$dir" -G Ninja -DTHINDISK_WERROR=ON "$@"
  step "build $dir"
  cmake --build "$ROOT/$dir" -j"$JOBS"
  step "test $dir"
  # A failing suite does not stop the run: the sanitized pass still runs, so
  # one CI run reports everything. The exit status says whether all passed.
  if ! (cd "$ROOT/$dir" && ctest --output-on-failure -j"$test_jobs" --timeout 600); then
    FAILED+=("$dir")
  fi
}
FAILED=()

# The optimized pass: -g1 (line tables) instead of RelWithDebInfo's -g, 23%
# less compile time for a heavy source (src/cli's unity_cli_1: 34.6 -> 26.6
# s), and what a failure's stack needs. Its tests wait on disks, sockets and
# the cluster as much as they compute (63% of 2 CPUs busy at -j2): one more
# in flight took them from 8.1 to 5.2 min here (2026-12-03, all passing).
build_and_test "$BUILD" $((JOBS + 1)) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"
if [[ ${THINDISK_SKIP_ASAN:-0} != 1 ]]; then
  # Debug at -O1 -g1: compiles faster than -O2 -g (the build is most of the
  # budget on 2 cores), still runs the sanitized suites quickly, and -g1
  # line tables are all the sanitizer stack traces need.
  # Its tests keep 2 CPUs busy (ASan's cost): -j3 was no faster (12.3 min).
  build_and_test "$BUILD_ASAN" "$JOBS" -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1" \
    -DTHINDISK_SANITIZE=address,undefined
fi
if [[ ${THINDISK_SKIP_TSAN:-0} != 1 ]]; then
  # ThreadSanitizer for everything that runs threads of its own: the NBD
  # server (its unit and real-socket tests, and the fio/qemu-io/stress
  # suites through the real binary), the engine's multi-threaded tests and
  # its range lock, the NBD client's connections, the storage backends' and
  # the codecs' concurrency tests, the bench runner, `convert -c`'s parallel
  # compression and the crash suite's concurrent workloads. Only these targets are built: the
  # rest of the suite has no threads of its own.
  BUILD_TSAN=${THINDISK_TSAN_BUILD_DIR:-build-tsan}
  step "configure $BUILD_TSAN"
  cmake -S "$ROOT" -B "$ROOT/$BUILD_TSAN" -G Ninja -DTHINDISK_WERROR=ON \
    -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1" -DTHINDISK_SANITIZE=thread
  step "build $BUILD_TSAN"
  TSAN_TARGETS=(nbd_server_test nbd_run_server_test nbd_negotiation_test nbd_filter_device_test
                qcow2_engine_test qcow2_bitmaps_test compress_test io_test bench_test nbdclient_test
                io_rados_test crash_test thindisk)
  cmake --build "$ROOT/$BUILD_TSAN" -j"$JOBS" --target "${TSAN_TARGETS[@]}"
  step "test $BUILD_TSAN"
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
  tsan_ok=1
  TSAN_BIN=$ROOT/$BUILD_TSAN
  # Whole binaries: each runs in seconds under TSan.
  for t in nbd/nbd_server_test nbd/nbd_run_server_test nbd/nbd_negotiation_test \
           nbd/nbd_filter_device_test io/io_test bench/bench_test \
           nbdclient/nbdclient_test; do
    "$TSAN_BIN/src/$t" --gtest_brief=1 || tsan_ok=0
  done
  # Only the threaded cases of these (the rest is single-threaded and slow).
  "$TSAN_BIN/src/qcow2/qcow2_engine_test" --gtest_brief=1 \
    --gtest_filter='*Concurrency*:*FlushOrdering*:RangeLock*:*FaultIsolation*:TableWrite*' || tsan_ok=0
  "$TSAN_BIN/src/util/compress_test" --gtest_brief=1 --gtest_filter='*Concurrent*' || tsan_ok=0
  # Writers marking bitmaps at once (group-committed marks), live clears beside them.
  "$TSAN_BIN/src/qcow2/qcow2_bitmaps_test" --gtest_brief=1 --gtest_filter='BitmapConcurrency*' ||
    tsan_ok=0
  # The RADOS suite (concurrent writers, the lock's watch thread, librados
  # calling back on its own threads) on a cluster of its own, stopped
  # whatever the result. librados is not built with TSan: what it reports
  # from inside it is suppressed (src/io/rados_tsan.supp says what is lost).
  # Bounded (it takes ~15 s): a cluster that stops answering fails the run
  # with its report instead of hanging it (it hung a landing CI once, the
  # osd answering reads but no writes).
  if bash scripts/ceph-cluster.sh start "$TSAN_BIN/ceph"; then
    if ! CEPH_CONF=$TSAN_BIN/ceph/ceph.conf \
      TSAN_OPTIONS="$TSAN_OPTIONS:suppressions=$ROOT/src/io/rados_tsan.supp" \
      timeout -k 10 900 "$TSAN_BIN/src/io/io_rados_test" --gtest_brief=1; then
      tsan_ok=0
      bash scripts/ceph-cluster.sh report "$TSAN_BIN/ceph"
    fi
  else
    tsan_ok=0
  fi
  bash scripts/ceph-cluster.sh stop "$TSAN_BIN/ceph" || tsan_ok=0
  # The bench runner's workers (QD 4) on the real engine, and convert -c's
  # compression threads, at tiny sizes.
  tsan_tmp=$(mktemp -d)
  "$TSAN_BIN/thindisk" bench "$tsan_tmp" --size 4M --qd 4 -q >/dev/null || tsan_ok=0
  { "$TSAN_BIN/thindisk" create -q -f raw "$tsan_tmp/src.raw" 8M &&
    "$TSAN_BIN/thindisk" io -f raw -c 'write -P 0x5a 0 4M' -c 'write -P 0x33 5M 3M' \
      "$tsan_tmp/src.raw" >/dev/null &&
    "$TSAN_BIN/thindisk" convert -c -O qcow2 "$tsan_tmp/src.raw" "$tsan_tmp/dst.qcow2" &&
    "$TSAN_BIN/thindisk" compare "$tsan_tmp/src.raw" "$tsan_tmp/dst.qcow2" >/dev/null; } ||
    tsan_ok=0
  rm -rf "$tsan_tmp"
  # The server itself: READs through its io_uring rings beside writes,
  # trims and flushes on its workers, from 4 fio connections.
  bash "$ROOT/tests/serve/tsan_serve.sh" "$TSAN_BIN/thindisk" || tsan_ok=0
  # The crash suite's concurrent workloads (2-4 threads on one image, each
  # in its own stripe, then the suite's checks): those of seeds 1-60
  # (ThreadsFor in tests/crash/workload.cc), each run alone without a fault
  # (case id seed << 16: fault none; tests/crash/crash_case.h). Not the faulted cases: a concurrent
  # workload's steps fall in a schedule the OS picks, so the armed one may
  # not come, and the whole suite (~1200 cases at ~1 s each under TSan)
  # would not fit the budget.
  for seed in 3 5 9 13 16 24 25 26 30 31 32 36 44 45 46 47 51 52 57; do
    THINDISK_CRASH_CASE=$(printf '0x%x' $((seed << 16))) "$TSAN_BIN/tests/crash/crash_test" \
      --gtest_brief=1 --gtest_filter='CrashSuite.*' || tsan_ok=0
  done
  # The real server under TSan, driven by fio, qemu-io and the stress client.
  for t in fio qemu_io; do
    THINDISK="$TSAN_BIN/thindisk" timeout 600 bash tests/serve/$t.sh || tsan_ok=0
  done
  # TLS: the session read by the reader and written by the writer thread.
  for t in clients refusals; do
    THINDISK="$TSAN_BIN/thindisk" TLS_SERVER=thindisk timeout 600 bash tests/tls/$t.sh ||
      tsan_ok=0
  done
  # Four connections at queue depth 32 against a model (its libnbd client
  # comes from the optimized build; only the server needs TSan).
  THINDISK="$TSAN_BIN/thindisk" \
    STRESS_CLIENT="$ROOT/$BUILD/tests/serve/serve_stress_client" \
    timeout 600 bash tests/serve/stress.sh || tsan_ok=0
  ((tsan_ok)) || FAILED+=("$BUILD_TSAN")
fi
if [[ ${THINDISK_SKIP_FUZZ:-0} != 1 ]]; then
  # libFuzzer needs clang: fuzz/run.sh builds the targets with clang 14 under
  # ASan+UBSan into build-fuzz/ and runs each for a bounded time from the
  # committed seed corpus; then ctest replays that corpus and any crasher committed under fuzz/regressions/
  step "fuzz (${THINDISK_FUZZ_SECONDS:-60} s per target)"
  fuzz_ok=1
  bash fuzz/run.sh "${THINDISK_FUZZ_SECONDS:-60}" || fuzz_ok=0
  (cd "$ROOT/build-fuzz" && ctest --output-on-failure -L fuzz) || fuzz_ok=0
  ((fuzz_ok)) || FAILED+=(build-fuzz)
fi
# report_failures DIR: names each test that failed in DIR's last ctest run
# and repeats the end of its output, so the end of the CI log says what
# failed even when the log is cut.
report_failures() {
  local tmp=$ROOT/$1/Testing/Temporary name
  [[ -f $tmp/LastTestsFailed.log ]] || return 0
  while IFS=: read -r _ name; do
    echo "--- failed in $1: $name (the end of its output)"
    awk -v n="$name" '
      !on && index($0, "Testing: ") && substr($0, index($0, "Testing: ") + 9) == n { on = 1 }
      on { print }
      on && index($0, "\"" n "\" end time") == 1 { exit }' "$tmp/LastTest.log" | tail -60
  done <"$tmp/LastTestsFailed.log"
}

if ((${#FAILED[@]})); then
  for dir in "${FAILED[@]}"; do report_failures "$dir"; done
  step "FAILED: tests failed in ${FAILED[*]}"
  exit 1
fi
step "all tests passed"

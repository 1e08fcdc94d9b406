#!/usr/bin/env bash
# The mutation check of the skip rule (util/capability_test_util.h,
# docs/testing.md "Missing tools and capabilities"): with a capability made
# unavailable by THINDISK_TEST_DENY, the tests that need it
#   (1) skip, every one of them, when neither CI nor THINDISK_REQUIRE_TOOLS
#       is set, and
#   (2) fail, every one of them, saying what was denied, with CI=1 and
#       (separately) with THINDISK_REQUIRE_TOOLS=1.
#
# Usage: skip_rule.sh GTEST_BINARY GTEST_FILTER DENY_NAME
# e.g.   skip_rule.sh build/src/io/io_test 'DirectIo.*' o_direct
set -euo pipefail

[[ $# == 3 ]] || { echo "usage: $0 GTEST_BINARY GTEST_FILTER DENY_NAME" >&2; exit 2; }
BIN=$1 FILTER=$2 DENY=$3
WHAT="$(basename "$BIN") --gtest_filter=$FILTER with THINDISK_TEST_DENY=$DENY"
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT

fail() {
  echo "FAIL [skip_rule]: $WHAT: $*" >&2
  sed 's/^/  | /' "$OUT" >&2
  exit 1
}

# run ENV...: runs the binary under `env ENV...` into $OUT; sets RC, RAN (tests
# run), SKIPPED and FAILED (counts from gtest's summary).
run() {
  RC=0
  env "$@" THINDISK_TEST_DENY="$DENY" "$BIN" --gtest_filter="$FILTER" >"$OUT" 2>&1 || RC=$?
  RAN=$(sed -n 's/^\[==========\] \([0-9]*\) tests\? from .* ran\..*/\1/p' "$OUT")
  SKIPPED=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\?, listed below:/\1/p' "$OUT")
  FAILED=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests\?, listed below:/\1/p' "$OUT")
  RAN=${RAN:-0} SKIPPED=${SKIPPED:-0} FAILED=${FAILED:-0}
  ((RAN > 0)) || fail "no test ran (wrong filter?)"
}

# (1) Locally: all skip, none fails.
run -u CI -u THINDISK_REQUIRE_TOOLS
[[ $RC == 0 ]] || fail "exit $RC without CI (want 0: missing capabilities skip)"
[[ $SKIPPED == "$RAN" && $FAILED == 0 ]] ||
  fail "without CI: $SKIPPED of $RAN skipped, $FAILED failed (want all skipped)"
echo "without CI: $RAN of $RAN skipped"

# (2) In CI (either variable): all fail, naming the denied capability.
for var in CI THINDISK_REQUIRE_TOOLS; do
  run -u CI -u THINDISK_REQUIRE_TOOLS "$var=1"
  [[ $RC != 0 ]] || fail "exit 0 with $var=1 (want failure: a missing capability fails in CI)"
  [[ $FAILED == "$RAN" && $SKIPPED == 0 ]] ||
    fail "with $var=1: $FAILED of $RAN failed, $SKIPPED skipped (want all failed)"
  grep -q "denied by THINDISK_TEST_DENY (CI or THINDISK_REQUIRE_TOOLS is set" "$OUT" ||
    fail "with $var=1: the failure does not say what was denied and why it fails"
  echo "with $var=1: $RAN of $RAN failed"
done

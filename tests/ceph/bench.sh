#!/usr/bin/env bash
# thindisk bench rados://POOL (issue 14): the in-process workloads on
# scratch images in a pool, named td-bench-<pid>-<workload>, removed at the
# end. `rados` shows which objects exist; qemu-img checks what --keep
# leaves (copied out of the pool).
#   1. a short run (W1, W2, W3, W5: a clone over a base in the pool)
#      reports every workload with ops done, non-zero IOPS and allocated
#      bytes (writes: host bytes, amplification >= 1), and leaves no object
#      of its images in the pool.
#   2. --keep leaves the images, well-formed; thindisk rm removes them.
#   3. a run that fails half-way (an image of its name already exists)
#      removes what it made and leaves the other image alone.
#   4. errors: a missing pool, an rbd: name, --latency on a pool, an
#      image's name; --help names rados://POOL.
#
# Needs the test cluster (CEPH_CONF; ctest starts it: tests/ceph/fixture.sh).
# shellcheck source=../interop/lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/../interop/lib.sh"
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

require_thindisk
require_tool "$QEMU_IMG" rados jq
require_test_cluster

POOL=thindisk
SHORT=(--size 1M --ops 64 --qd 4 -q --output json)
# The pool's objects of the images of bench run PID.
objects() { timeout 60 rados -p "$POOL" ls | grep "^td-bench-$1-" | sort || true; }

# bench ARGS...: `thindisk bench ARGS` under capture; PID is the pid it ran
# as (the images' names hold it): the shell writes $$, then becomes thindisk.
# shellcheck disable=SC2016 # $$ and "$@" are the inner shell's
bench() {
  capture timeout 60 bash -c 'echo $$ >bench.pid; exec "$0" bench "$@"' "$TD" "$@"
  PID=$(cat bench.pid)
}

# 1. A short run.
log "run"
bench "rados://$POOL?conf=$CEPH_CONF" --workloads W1,W2,W3,W5 "${SHORT[@]}"
((RC == 0)) || fail "bench on the pool: exit $RC: $(cat "$ERR")"
assert_eq "W1 W2 W2 W3 W5" "$(jq -r '[.results[].id] | join(" ")' "$OUT")" "workloads reported"
jq -e '.results | all(.ops > 0 and .iops > 0 and .allocated_bytes > 0)' "$OUT" >/dev/null ||
  fail "a workload without ops, IOPS or allocated bytes: $(cat "$OUT")"
jq -e '[.results[] | select(.id != "W1")] | all(.host_bytes_written > 0
  and .write_amplification >= 1)' "$OUT" >/dev/null ||
  fail "a write workload without host bytes written: $(cat "$OUT")"
assert_eq "" "$(objects "$PID")" "objects the run left"

# 2. --keep: the images stay, and are images.
log "keep"
bench "rados://$POOL" --workloads W2,W5 --keep "${SHORT[@]}"
((RC == 0)) || fail "bench --keep: exit $RC: $(cat "$ERR")"
kept=$(objects "$PID" | grep '\.header$' | sed 's/\.header$//' | sort | tr '\n' ' ')
assert_eq "td-bench-$PID-w2 td-bench-$PID-w2-qd1 td-bench-$PID-w5-base td-bench-$PID-w5-overlay " \
  "$kept" "images kept"
td info --output=json "rados://$POOL/td-bench-$PID-w5-overlay"
assert_eq "td-bench-$PID-w5-base" "$(jq -r '."backing-filename"' "$OUT")" "the kept clone's backing"
td convert -O qcow2 "rados://$POOL/td-bench-$PID-w2" w2.qcow2
qemu_check w2.qcow2
for name in w2 w2-qd1 w5-overlay w5-base; do td rm -q "rados://$POOL/td-bench-$PID-$name"; done
assert_eq "" "$(objects "$PID")" "objects left by rm of the kept images"

# 3. A run that fails half-way: the clone's name is taken, after W2's
#    images and W5's base were made. Nothing of the run is left; the
#    image that was there stays.
log "failure"
# shellcheck disable=SC2016 # $$ is the inner shell's: bench's pid
capture timeout 60 bash -c 'echo $$ >bench.pid &&
  "$0" create -q -f raw "rados://'"$POOL"'/td-bench-$$-w5-overlay" 1M &&
  exec "$0" bench "rados://'"$POOL"'" --workloads W2,W5 --size 1M --ops 64 -q' "$TD"
PID=$(cat bench.pid)
((RC == 1)) || fail "bench over a taken name: exit $RC: $(cat "$ERR")"
grep -q "td-bench-$PID-w5-overlay.*already exists" "$ERR" ||
  fail "bench over a taken name said: $(cat "$ERR")"
assert_eq "td-bench-$PID-w5-overlay.header" "$(objects "$PID" | tr -d '\n')" \
  "objects after the failed run"
td rm -q "rados://$POOL/td-bench-$PID-w5-overlay"

# 4. Errors, before anything is made.
log "errors"
td_fails "pool 'no-such-pool-$$' does not exist" "a missing pool" \
  bench "rados://no-such-pool-$$" "${SHORT[@]}"
td_fails "not RBD ones" "an rbd: name" bench "rbd:$POOL" "${SHORT[@]}"
td_fails "drop --latency" "--latency on a pool" bench "rados://$POOL" --latency 1ms "${SHORT[@]}"
td_fails "names an image, not a pool" "an image name" bench "rados://$POOL/x" "${SHORT[@]}"
td bench --help
grep -q "rados://POOL" "$OUT" || fail "bench --help does not mention rados://POOL"
echo "PASS"

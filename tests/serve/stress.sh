#!/usr/bin/env bash
# Concurrency stress of `thindisk serve`, verified against a model
# (STRESS_CLIENT is tests/serve/stress_client.c, built by CMake).
#
# For each layout (default qcow2, 64K clusters without extended L2, a clone
# over a backing file, raw): 4 connections (multi-conn) at queue depth 32
# run a fixed number of seeded random reads, writes, write_zeroes (plain,
# NO_HOLE, FAST_ZERO), trims and flushes over overlapping ranges of a 64 MiB
# export; every read is compared with the model at once and every byte is
# re-read at the end. Then the server is stopped (SIGTERM drains and
# flushes), `qemu-img compare` checks the image against the model, the
# server is restarted and every byte is read once more, and `qemu-img check`
# must find the qcow2 image clean.
#
# THINDISK_SEED=N reruns with seed N (a failure prints the seed);
# STRESS_OPS=N changes the per-layout op count.
source "$(dirname "$0")/lib.sh"
require_tool qemu-img qemu-io
require_client STRESS_CLIENT

SIZE=$((64 << 20))
SEED=${THINDISK_SEED:-20261130}
OPS=${STRESS_OPS:-3000}
CONNS=4
QD=32
START=$SECONDS

# stress_layout NAME IMAGE FORMAT MODEL_IN: the whole cycle on one image.
stress_layout() {
  local name=$1 image=$2 fmt=$3 model_in=$4 seed=$((SEED + $5)) t0=$SECONDS
  local sock="$TMP/$name.sock"
  serve_unix "$name" "$sock" -f "$fmt" "$image"
  local pid=$SERVER_PID
  "$STRESS_CLIENT" run "$(uri "$sock")" $SIZE "$seed" "$OPS" $CONNS $QD "$model_in" \
    "$name.model" 2>"$name.client" ||
    { cat "$name.client" >&2; fail "$name: model mismatch (THINDISK_SEED=$SEED)"; }
  stop_server "$pid" "$name"
  qemu-img compare -q -f "$fmt" -F raw "$image" "$name.model" ||
    fail "$name: image differs from the model after shutdown (THINDISK_SEED=$SEED)"
  serve_unix "$name-2" "$sock" -f "$fmt" "$image"
  pid=$SERVER_PID
  "$STRESS_CLIENT" verify "$(uri "$sock")" $SIZE "$name.model" 2>"$name.verify" ||
    { cat "$name.verify" >&2; fail "$name: wrong data after restart (THINDISK_SEED=$SEED)"; }
  stop_server "$pid" "$name-2"
  [[ $fmt == qcow2 ]] && check_clean "$image"
  log "$name: $(tail -1 "$name.client" | sed 's/^stress: //') ($((SECONDS - t0))s total)"
}

"$TD" create -f qcow2 default.qcow2 $SIZE >/dev/null
stress_layout default default.qcow2 qcow2 - 0

"$TD" create -f qcow2 -o cluster_size=65536,extended_l2=off plain64k.qcow2 $SIZE >/dev/null
stress_layout plain64k plain64k.qcow2 qcow2 - 1

# A base with data, holes and explicit zeros, written by qemu-io; the clone
# starts out reading exactly the base (its raw conversion is the model).
"$TD" create -f qcow2 base.qcow2 $SIZE >/dev/null
qemu-io -f qcow2 base.qcow2 -c 'write -P 0x41 0 12M' -c 'write -P 0x42 20M 3M' \
  -c 'write -P 0x43 30001 777777' -c 'write -z 4M 2M' -c 'write -P 0x44 60M 4M' >/dev/null
qemu-img convert -f qcow2 -O raw base.qcow2 base.raw
"$TD" create -f qcow2 -b base.qcow2 -F qcow2 clone.qcow2 >/dev/null
stress_layout clone clone.qcow2 qcow2 base.raw 2
qemu-img compare -q -f qcow2 -F raw base.qcow2 base.raw || fail "writes to the clone reached its base"

"$TD" create -f raw disk.raw $SIZE >/dev/null
stress_layout raw disk.raw raw - 3

log "stress: ok in $((SECONDS - START))s (seed $SEED, $OPS ops per layout)"

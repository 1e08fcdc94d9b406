#!/usr/bin/env bash
# Hostile clients at scale (HOSTILE_SCALE_CLIENT is
# tests/serve/hostile_scale_client.c, built by CMake). While a well-behaved
# client keeps writing, reading and verifying its own region, the server
# gets at once:
#   - hundreds of connections dropped mid-handshake, mid-request and
#     mid-payload (churn);
#   - slow clients that queue many 32 MiB reads and never read a reply;
#   - a client sending 5000 options before GO (cut off at the limit with
#     NBD_REP_ERR_POLICY), and clients writing 5000 options without reading;
#   - requests of every interesting length up to and past the maximum
#     payload, and absurd offsets.
# It must stay up, keep serving the good client (its ops succeed and
# verify), keep its peak RSS (VmHWM) under the bound of
# docs/serve-limits.md, shut down cleanly and leave a clean image.
source "$(dirname "$0")/lib.sh"
require_tool qemu-img qemu-io
require_client HOSTILE_SCALE_CLIENT
HC=$HOSTILE_SCALE_CLIENT

SIZE=$((128 << 20))
GOOD_REGION=$((16 << 20))   # the good client's bytes: [0, 16M)
SCRATCH=$((64 << 20))       # hostile writes land in [64M, 128M)
MAX_CONNECTIONS=12
CACHE_MIB=64                # --cache-size (also the default)
# The memory bound (docs/serve-limits.md): every connection slot may pin
# max_inflight_bytes (64 MiB, ServeOptions) plus at most
# max_inflight_requests (128) uncounted small replies (<= 16 KiB each:
# 2 MiB) and its two threads' stacks (<= 2 MiB touched), on top of 128 KiB
# for each of 2N connections not yet (or no longer) sessions (N, the
# negotiating cap: max(16, C)), the qcow2 metadata cache, 4 MiB per worker
# (the default 8, WorkerPool::kDefaultThreads), a fixed 64 MiB for the
# program, the worker pool and allocator slack, and the 64 MiB of freed
# payload buffers kept for reuse (kPayloadCacheBytes,
# src/nbd/payload_buffer.h).
PER_CONNECTION_MIB=$((64 + 2 + 2))
NEGOTIATING_CAP=$((MAX_CONNECTIONS > 16 ? MAX_CONNECTIONS : 16))
NOT_SESSIONS_MIB=$(((2 * NEGOTIATING_CAP * 128 + 1023) / 1024))
WORKERS=8
PAYLOAD_CACHE_MIB=64
BOUND_MIB=$((MAX_CONNECTIONS * PER_CONNECTION_MIB + NOT_SESSIONS_MIB + CACHE_MIB + WORKERS * 4 + 64 + PAYLOAD_CACHE_MIB))
# kMaxOptionsPerSession (src/nbd/negotiation.h) plus one per export.
OPTION_LIMIT=$((256 + 1))

"$TD" create -f qcow2 disk.qcow2 $SIZE >/dev/null
serve_unix srv srv.sock --max-connections $MAX_CONNECTIONS --cache-size ${CACHE_MIB}M disk.qcow2
SRV=$SERVER_PID
alive() { kill -0 "$SRV" 2>/dev/null || { cat srv.err >&2; fail "server died ($1)"; }; }
rss_kib() { awk -v k="$1:" '$1 == k { print $2 }' "/proc/$SRV/status"; }

# Sample VmRSS while the test runs (VmHWM, read at the end, is the kernel's
# own peak; the samples show the shape).
(while kill -0 "$SRV" 2>/dev/null; do rss_kib VmRSS >>rss.samples 2>/dev/null || true; sleep 0.1; done) &
SAMPLER=$!

timeout 110 "$HC" good "$(uri "$TMP/srv.sock")" $GOOD_REGION "$TMP/stop" 100 >good.out 2>&1 &
GOOD=$!
for ((i = 0; i < 200; i++)); do [[ -e stop.ready ]] && break; sleep 0.05; done
[[ -e stop.ready ]] || { cat good.out >&2; fail "good client did not connect"; }

t0=$SECONDS
timeout 100 "$HC" slow "$TMP/srv.sock" 4 64 $((32 << 20)) "$TMP/stop" >slow.out 2>&1 &
SLOW=$!
timeout 100 "$HC" churn "$TMP/srv.sock" 480 $SCRATCH >churn.out 2>&1 &
CHURN=$!
timeout 100 "$HC" options "$TMP/srv.sock" 5000 $OPTION_LIMIT >options.out 2>&1 &
OPTIONS=$!
FLOODS=()
for i in 1 2 3; do
  timeout 100 "$HC" flood "$TMP/srv.sock" 5000 >"flood$i.out" 2>&1 &
  FLOODS+=($!)
done
timeout 100 "$HC" lengths "$TMP/srv.sock" $SIZE $SCRATCH >lengths.out 2>&1 &
LENGTHS=$!

# join PID NAME: the hostile client passed and the server is still up.
join() {
  local rc=0
  wait "$1" || rc=$?
  [[ $rc == 0 ]] || { cat "$2.out" >&2; fail "$2 client failed (exit $rc)"; }
  alive "after $2"
  log "$(tail -1 "$2.out") [+$((SECONDS - t0))s]"
}
join $CHURN churn
join $OPTIONS options
for i in 1 2 3; do join "${FLOODS[$((i - 1))]}" "flood$i"; done
join $LENGTHS lengths
# Let the good client run a little longer beside the stalled slow readers.
sleep 2
alive "with slow readers"
peak_busy=$(rss_kib VmHWM)
touch stop
join $SLOW slow
join $GOOD good
log "hostile clients done in $((SECONDS - t0))s"
good_ops=$(awk '/^good:/ { print $2 }' good.out)
((good_ops >= 100)) || fail "the good client made only $good_ops requests"

# A fresh client is served after all that.
qemu-io -f raw "$(uri srv.sock)" -c 'read 0 64k' >io.out 2>&1 || fail "fresh client refused: $(cat io.out)"
peak=$(rss_kib VmHWM)
max_sample=$(sort -n rss.samples | tail -1)
log "peak RSS (VmHWM) $((peak / 1024)) MiB (during the attack $((peak_busy / 1024)) MiB," \
  "highest sample $((max_sample / 1024)) MiB); bound $BOUND_MIB MiB" \
  "($MAX_CONNECTIONS x $PER_CONNECTION_MIB MiB + $NOT_SESSIONS_MIB MiB negotiating + $CACHE_MIB MiB cache" \
  "+ $WORKERS x 4 MiB workers + 64 MiB + $PAYLOAD_CACHE_MIB MiB payload cache)"
((peak / 1024 < BOUND_MIB)) || fail "peak RSS $((peak / 1024)) MiB exceeds the bound $BOUND_MIB MiB"
stop_server "$SRV" srv
wait "$SAMPLER" 2>/dev/null || true
check_clean disk.qcow2
log "hostile_scale: ok in ${SECONDS}s"

#!/usr/bin/env bash
# READs through the server's io_uring ring (src/nbd/async_reads.h): with
# the default --aio each reading connection has a ring, and what clients
# read equals what an independent reader (qemu-img convert) reads, on an
# image that sends READs down every path: data clusters (the ring), holes
# and zeroed ranges (zeros in the plan; hole chunks on the pool),
# compressed clusters (the pool) and a raw backing file under a clone (the
# ring, from the base's file). With --aio=threads there is no ring and the
# bytes are the same.
#   1. fio's nbd engine, 4 jobs x QD16 random 4 KiB reads for 2 s: the
#      server holds between 1 and 4 rings meanwhile (0 under --aio=threads).
#   2. nbdcopy (4 connections, 64 requests in flight, 64 KiB and 1 MiB
#      requests) and qemu-img convert over NBD give the image's bytes.
#   3. Rewrites and discards while readers read (fio randrw), then the
#      bytes again: the ring never reads a cluster freed under it.
#   4. Cold reads (io/posix_storage.h): with the image and its base out of
#      the page cache, 1 MiB READs give the same bytes and go around the
#      page cache (mincore: the base stays out of it); read again once
#      cached, they come from the cache.
#   5. Prefetches (src/nbd/connection_prefetch.cc): qemu-io reading 1 MiB
#      at a time in order gets the image's bytes; a write from another
#      qemu-io into the range read ahead, and one from the reader itself,
#      are read back, not the bytes read ahead before them.
source "$(dirname "$0")/lib.sh"
require_tool fio qemu-img qemu-io nbdcopy jq
fio --enghelp=nbd >/dev/null 2>&1 || skip_or_fail "fio built without the nbd engine"

M=$((1 << 20))
# A 64 MiB raw base, a clone of it with data, zeroes, a discard and
# compressed clusters of its own.
qemu-img create -q -f raw base.raw 64M
qemu-io -f raw -c "write -P 0x5b 0 48M" base.raw >/dev/null
"$TD" create -q -f qcow2 -b base.raw -F raw clone.qcow2 64M
qemu-io -f qcow2 -c "write -P 0x11 1M 7M" -c "write -z 20M 2M" -c "discard 30M 1M" \
  -c "write -c -P 0x22 40M 256k" -c "write -P 0x33 50M 10M" clone.qcow2 >/dev/null
qemu-img convert -f qcow2 -O raw clone.qcow2 want.raw

# rings_during PID: the most rings PID held while fio read for 2 s.
rings_during() {
  local pid=$1 most=0 n i
  fio --name=r --ioengine=nbd --uri="$(uri "$TMP/s.sock")" --rw=randread --bs=4k \
    --iodepth=16 --numjobs=4 --size=64M --time_based --runtime=2 \
    --output-format=json --output=fio.json >fio.log 2>fio.err &
  local fio_pid=$!
  for ((i = 0; i < 40; i++)); do
    n=$(uring_rings "$pid")
    ((n > most)) && most=$n
    sleep 0.05
  done
  wait "$fio_pid" || { cat fio.err >&2; fail "fio randread failed"; }
  expect_eq "fio read errors" "$(jq '.jobs[0].error' fio.json)" 0
  echo "$most"
}

for aio in default threads; do
  args=()
  [[ $aio == threads ]] && args=(--aio=threads)
  log "--aio $aio"
  serve_unix s s.sock "${args[@]}" clone.qcow2
  pid=$SERVER_PID
  most=$(rings_during "$pid")
  if [[ $aio == threads ]]; then
    expect_eq "rings under --aio=threads" "$most" 0
  else
    ((most >= 1 && most <= 4)) || fail "rings while 4 fio jobs read: $most (expected 1 to 4)"
  fi
  for rs in 65536 1048576; do
    rm -f got.raw
    timeout 120 nbdcopy --connections=4 --requests=64 --request-size="$rs" \
      "$(uri "$TMP/s.sock")" got.raw || fail "nbdcopy --request-size=$rs"
    cmp want.raw got.raw || fail "$aio: nbdcopy --request-size=$rs read other bytes"
  done
  qemu-img convert -f raw -O raw "$(uri "$TMP/s.sock")" got.raw
  cmp want.raw got.raw || fail "$aio: qemu-img convert over NBD read other bytes"
  stop_server "$pid" s
done

log "cold reads around the page cache"
# evict FILE...: sync each file and drop its pages from the page cache.
evict() {
  python3 - "$@" <<'PY'
import os, sys
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
}
# cached_bytes FILE LENGTH: bytes of FILE's first LENGTH the page cache holds
# (mincore(2) on a mapping, which reads nothing).
cached_bytes() {
  python3 - "$1" "$2" <<'PY'
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
length = int(sys.argv[2])
fd = os.open(sys.argv[1], os.O_RDONLY)
p = libc.mmap(None, length, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
if p in (None, ctypes.c_void_p(-1).value):
    sys.exit("mmap: " + os.strerror(ctypes.get_errno()))
vec = (ctypes.c_ubyte * (length // 4096))()
if libc.mincore(p, length, vec) != 0:
    sys.exit("mincore: " + os.strerror(ctypes.get_errno()))
print(sum(v & 1 for v in vec) * 4096)
PY
}
# Cold reads need O_DIRECT in this directory and cachestat(2) (Linux 6.5).
direct_ok=$(python3 -c 'import os
try:
    os.close(os.open("base.raw", os.O_RDONLY | os.O_DIRECT)); print(1)
except OSError:
    print(0)')
kernel_ok=$(python3 -c 'import os; print(int(tuple(map(int, os.uname().release.split(".")[:2])) >= (6, 5)))')
serve_unix s s.sock clone.qcow2
pid=$SERVER_PID
evict clone.qcow2 base.raw
rm -f got.raw
timeout 120 nbdcopy --connections=1 --requests=4 --request-size=1048576 \
  "$(uri "$TMP/s.sock")" got.raw || fail "cold nbdcopy failed"
cmp want.raw got.raw || fail "cold reads read other bytes"
if ((direct_ok && kernel_ok)); then
  # The base's first 40 MiB are read in whole MiB through the ring (the
  # clone's own data, zeroes and discard sit between them): none of them
  # through the page cache. (The READ at 40 MiB, with compressed clusters,
  # goes to the pool, which reads the base cluster by cluster: readahead
  # caches what follows, and the reads after it find their ranges cached.)
  base_cached=$(cached_bytes base.raw $((40 * M)))
  ((base_cached < M)) ||
    fail "cold reads of the base went through the page cache: $base_cached bytes of its first 40 MiB cached"
  # Cached now (read by hand), the same READs come from the page cache.
  cat base.raw clone.qcow2 >/dev/null
  rm -f got.raw
  timeout 120 nbdcopy --connections=1 --requests=4 --request-size=1048576 \
    "$(uri "$TMP/s.sock")" got.raw || fail "warm nbdcopy failed"
  cmp want.raw got.raw || fail "warm reads read other bytes"
else
  log "no O_DIRECT in $TMP or a kernel before 6.5: cold reads go through the page cache; bytes checked only"
fi
stop_server "$pid" s

log "rewrites and discards while readers read"
cp clone.qcow2 busy.qcow2
serve_unix s s.sock busy.qcow2
pid=$SERVER_PID
# Writers and readers on the same 8 MiB: trims free clusters that reads
# may have planned, rewrites take them again.
timeout 120 fio --name=w --ioengine=nbd --uri="$(uri "$TMP/s.sock")" --rw=randrw \
  --rwmixread=70 --bs=64k --iodepth=16 --numjobs=2 --offset=1M --size=8M \
  --number_ios=3000 --output-format=json --output=rw.json >rw.log 2>rw.err &
rw_pid=$!
timeout 120 fio --name=t --ioengine=nbd --uri="$(uri "$TMP/s.sock")" --rw=randtrim \
  --bs=64k --iodepth=4 --offset=1M --size=8M --number_ios=500 \
  --output-format=json --output=trim.json >trim.log 2>trim.err ||
  { cat trim.err >&2; fail "fio randtrim failed"; }
wait "$rw_pid" || { cat rw.err >&2; fail "fio randrw failed"; }
expect_eq "randrw errors" "$(jq '.jobs[0].error' rw.json)" 0
qemu-img convert -f raw -O raw "$(uri "$TMP/s.sock")" busy-nbd.raw
stop_server "$pid" s
check_clean busy.qcow2
qemu-img convert -f qcow2 -O raw busy.qcow2 busy-file.raw
cmp busy-file.raw busy-nbd.raw || fail "after the busy run the server read other bytes than the file holds"
cmp <(head -c $((40 * M)) want.raw | tail -c $((30 * M))) \
  <(head -c $((40 * M)) busy-file.raw | tail -c $((30 * M))) ||
  fail "bytes outside the rewritten range changed"
log "prefetches for a reader in order"
"$TD" create -q -f qcow2 seq.qcow2 32M
qemu-io -f qcow2 -c "write -P 0x41 0 32M" seq.qcow2 >/dev/null
serve_unix s s.sock seq.qcow2
pid=$SERVER_PID
reads=()
for i in $(seq 0 9); do reads+=(-c "read -P 0x41 ${i}M 1M"); done
# The reader takes 10 MiB in order (the 11th is read ahead), then waits
# while the writer writes into the 11th; then it reads it, writes into
# the 12th (read ahead too) and reads that.
timeout 60 stdbuf -oL qemu-io -f raw "$(uri "$TMP/s.sock")" "${reads[@]}" -c "sleep 5000" \
  -c "read -P 0x42 10M 1M" -c "write -P 0x43 11M 1M" -c "read -P 0x43 11M 1M" \
  >seq.out 2>&1 &
reader=$!
# The writer goes once the reader has had its 10 MiB (its lines out).
for _ in $(seq 500); do
  (($(grep -c '^read' seq.out) >= 10)) && break
  sleep 0.01
done
qemu-io -f raw "$(uri "$TMP/s.sock")" -c "write -P 0x42 10M 1M" >w.out 2>&1 ||
  { cat w.out >&2; fail "the write into the range read ahead failed"; }
wait "$reader" || { cat seq.out >&2; fail "the reader in order failed"; }
if grep -Eq "verification failed|error" w.out seq.out; then
  cat w.out seq.out >&2
  fail "a prefetch answered around a write"
fi
expect_eq "reads and writes done" "$(grep -c '^read\|^wrote' seq.out)" 13
stop_server "$pid" s
check_clean seq.qcow2
log "read_ring: ok"

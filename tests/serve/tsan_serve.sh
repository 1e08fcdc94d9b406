#!/usr/bin/env bash
# tests/serve/tsan_serve.sh THINDISK: a ThreadSanitizer build of the server
# under concurrent clients (scripts/test.sh's TSan pass): READs through the
# per-connection io_uring rings beside writes, trims and flushes on the
# worker pool, on a qcow2 clone of a raw base; then a clean stop. A race
# report makes the server exit non-zero (halt_on_error), which fails this.
set -euo pipefail
TD=$1
tmp=$(mktemp -d)
pid=
trap '[[ -n $pid ]] && kill -9 "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
"$TD" create -q -f raw "$tmp/base.raw" 32M
"$TD" io -f raw -c 'write -P 0x5a 0 24M' "$tmp/base.raw" >/dev/null
"$TD" create -q -f qcow2 -b base.raw -F raw "$tmp/clone.qcow2" 32M
"$TD" serve -q --socket "$tmp/s.sock" "$tmp/clone.qcow2" 2>"$tmp/serve.err" &
pid=$!
for ((i = 0; i < 400; i++)); do
  [[ -S $tmp/s.sock ]] && break
  sleep 0.05
done
uri="nbd+unix:///?socket=$tmp/s.sock"
timeout 120 fio --name=rw --ioengine=nbd --uri="$uri" --rw=randrw --rwmixread=75 --bs=16k \
  --iodepth=16 --numjobs=3 --size=24M --number_ios=1500 --fsync=64 >/dev/null 2>"$tmp/fio.err" &
rw=$!
timeout 120 fio --name=t --ioengine=nbd --uri="$uri" --rw=randtrim --bs=64k --iodepth=4 \
  --size=24M --number_ios=200 >/dev/null 2>>"$tmp/fio.err" || { cat "$tmp/fio.err" >&2; exit 1; }
wait "$rw" || { cat "$tmp/fio.err" >&2; exit 1; }
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=
if ((rc != 0)) || grep -q 'ThreadSanitizer' "$tmp/serve.err"; then
  cat "$tmp/serve.err" >&2
  echo "tsan_serve: the server exited $rc" >&2
  exit 1
fi
echo "tsan_serve: ok"

#!/usr/bin/env bash
# Not a test: fio through `thindisk serve` and qemu-nbd on fresh 4 GiB qcow2
# images, in one run. Prints one line per (server, layout, workload).
#   THINDISK=build/thindisk [RUNTIME=5] [PERF_DIR=/dev/shm] bash tests/serve/perf_compare.sh
set -euo pipefail
TD=$(realpath "${THINDISK:-thindisk}")
RUNTIME=${RUNTIME:-5}
TMP=$(mktemp -d "${PERF_DIR:-/var/tmp}/td-perf-XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT
cd "$TMP"

WORKLOADS=(
  "randwrite-4k-qd1|--rw=randwrite --bs=4k --iodepth=1"
  "randwrite-4k-qd16|--rw=randwrite --bs=4k --iodepth=16"
  "seqwrite-1m-qd4|--rw=write --bs=1M --iodepth=4"
)
# server|layout: how the image is created and served.
run_one() {  # run_one SERVER LAYOUT WORKLOAD_NAME FIO_ARGS
  local server=$1 layout=$2 wname=$3 fargs=$4 opts=""
  rm -f img.qcow2 s.sock
  sync  # start each run without the previous one's dirty pages
  [[ $layout == xl2-128k ]] && opts="-o extended_l2=on,cluster_size=128k"
  if [[ $server == thindisk ]]; then
    # shellcheck disable=SC2086
    "$TD" create -f qcow2 $opts img.qcow2 4G >/dev/null
    "$TD" serve -q -f qcow2 -k "$TMP/s.sock" img.qcow2 &
  else
    # shellcheck disable=SC2086
    qemu-img create -f qcow2 $opts img.qcow2 4G >/dev/null
    qemu-nbd -f qcow2 -t -k "$TMP/s.sock" img.qcow2 &
  fi
  local pid=$!
  for ((i = 0; i < 200; i++)); do [[ -S s.sock ]] && break; sleep 0.05; done
  # shellcheck disable=SC2086
  fio --name=w --ioengine=nbd --uri="nbd+unix:///?socket=$TMP/s.sock" --size=4G \
    --time_based --runtime="$RUNTIME" --randrepeat=0 $fargs --output-format=json \
    --output=r.json >/dev/null 2>&1
  kill -TERM $pid
  wait $pid || true
  printf "%-9s %-9s %-18s %10.0f IOPS %9.1f MB/s  p99 %8.0f us\n" "$server" "$layout" "$wname" \
    "$(jq '.jobs[0].write.iops' r.json)" "$(jq '.jobs[0].write.bw_bytes / 1e6' r.json)" \
    "$(jq '.jobs[0].write.clat_ns.percentile["99.000000"] / 1000' r.json)"
}
for w in "${WORKLOADS[@]}"; do
  for layout in default xl2-128k; do
    for server in thindisk qemu-nbd; do
      run_one "$server" "$layout" "${w%%|*}" "${w#*|}"
    done
  done
done

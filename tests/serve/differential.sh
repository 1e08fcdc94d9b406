#!/usr/bin/env bash
# The same qemu-io script against qemu-nbd and `thindisk serve`, each on a
# copy of one qcow2 image (with a backing file): every read returns the same
# bytes and the two images end with the same content.
source "$(dirname "$0")/lib.sh"
require_tool qemu-io qemu-img qemu-nbd

qemu-img create -f qcow2 base.qcow2 8M >/dev/null
qemu-io -f qcow2 base.qcow2 -c 'write -P 0x10 0 2M' -c 'write -P 0x20 6M 1M' >/dev/null
qemu-img create -f qcow2 -b base.qcow2 -F qcow2 orig.qcow2 >/dev/null
qemu-io -f qcow2 orig.qcow2 -c 'write -P 0x30 1M 2M' -c 'write -z 6M 256k' >/dev/null

SCRIPT=(
  -c 'read -v 1048064 1k'
  -c 'write -P 0x41 100k 10k'
  -c 'write -P 0 5M 64k'
  -c 'read -v 5242864 32'
  -c 'write -P 0x42 2097149 7'
  -c 'write -z -u 4M 128k'
  -c 'discard 1536k 64k'
  -c 'write -P 0x43 7340033 70000'
  -c 'flush'
  -c 'read -v 102384 64'
  -c 'read -v 2097144 16'
  -c 'read -v 6291440 32'
  -c 'read -v 6553584 32'
  -c 'read -v 1572848 32'
  -c 'read -v 7M 32'
  -c 'read -v 8388592 16'
)
# Only the data lines: timing lines differ run to run.
data_lines() { grep -E '^[0-9a-f]{8}:' "$1" || true; }

# Each mode: qemu-nbd options | thindisk serve options (same meaning).
MODES=(
  "--discard=unmap|--discard=unmap"
  "|--discard=ignore"
  "--discard=unmap --detect-zeroes=unmap|--detect-zeroes=unmap"
  "--detect-zeroes=on|--discard=ignore --detect-zeroes=on"
)
for mode in "${MODES[@]}"; do
  qopts=${mode%%|*}
  topts=${mode#*|}
  log "qemu-nbd ${qopts:-(defaults)} vs thindisk serve $topts"
  rm -f q.qcow2 t.qcow2 "$TMP/q.sock" t.sock
  cp orig.qcow2 q.qcow2
  cp orig.qcow2 t.qcow2
  # shellcheck disable=SC2086
  qemu_nbd_unix qemu-nbd "$TMP/q.sock" -f qcow2 $qopts -t q.qcow2
  qpid=$SERVER_PID
  # shellcheck disable=SC2086
  serve_unix t t.sock -f qcow2 $topts t.qcow2
  tpid=$SERVER_PID
  qemu-io -f raw "$(uri "$TMP/q.sock")" "${SCRIPT[@]}" >q.out 2>&1 || fail "qemu-io vs qemu-nbd failed"
  qemu-io -f raw "$(uri t.sock)" "${SCRIPT[@]}" >t.out 2>&1 || fail "qemu-io vs thindisk failed"
  data_lines q.out >q.data
  data_lines t.out >t.data
  [[ $(wc -l <q.data) -gt 10 ]] || fail "too little read output: $(cat q.out)"
  diff -u q.data t.data >reads.diff || { cat reads.diff >&2; cat q.out >&2; fail "reads differ from qemu-nbd"; }
  expect_eq "qemu-io lines" "$(grep -vE '^[0-9a-f]{8}:' t.out | sed 's/;.*//' | sort)" \
    "$(grep -vE '^[0-9a-f]{8}:' q.out | sed 's/;.*//' | sort)"

  stop_server "$tpid" t
  kill_server "$qpid"
  check_clean t.qcow2
  qemu-img compare -f qcow2 -F qcow2 q.qcow2 t.qcow2 >cmp.out 2>&1 ||
    { cat cmp.out >&2; fail "final content differs from qemu-nbd's"; }
  # And both still agree with their common starting point outside the writes.
  qemu-io -f qcow2 t.qcow2 -c 'read -P 0x10 0 64k' -c 'read -P 0x30 1M 64k' \
    -c 'read -P 0x20 6553600 64k' >v.out 2>&1 || fail "post-check read failed"
  if grep -q "Pattern verification failed" v.out; then fail "backing data lost: $(cat v.out)"; fi
done
log "differential: ok"

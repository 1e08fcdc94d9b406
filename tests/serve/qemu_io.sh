#!/usr/bin/env bash
# qemu-io through `thindisk serve`: pattern writes, write -z (with and
# without unmap), discards and flushes; reads verify; after SIGTERM the
# image is clean (qemu-img check) and holds exactly what the same commands
# produce on a raw file (qemu-img compare).
source "$(dirname "$0")/lib.sh"
require_tool qemu-io qemu-img

CMDS=(
  -c 'write -P 0xa1 0 64k'
  -c 'write -P 0xa2 100k 300k'
  -c 'write -P 0xa3 1M 1M'
  -c 'write -z 1536k 64k'
  -c 'write -z -u 3M 1M'
  -c 'write -P 0xa4 3584k 8k'
  -c 'discard 1088k 64k'
  -c 'flush'
  -c 'write -P 0xa5 7M 1536k'
  -c 'write -P 0xa6 12345 777'
  -c 'discard 7M 512k'
  -c 'write -P 0xa7 16773120 4k'
  -c 'aio_write -P 0xa8 10M 256k'
  -c 'aio_write -P 0xa9 11M 256k'
  -c 'aio_flush'
  -c 'flush'
)
# Reads that must hold after the commands above (offsets avoid the
# partly-overwritten areas; discarded ranges read as zeros).
VERIFY=(
  -c 'read -P 0xa1 0 12k'
  -c 'read -P 0xa6 12345 777'
  -c 'read -P 0xa2 100k 300k'
  -c 'read -P 0xa3 1M 64k'
  -c 'read -P 0 1088k 64k'
  -c 'read -P 0 1536k 64k'
  -c 'read -P 0 3M 512k'
  -c 'read -P 0xa4 3584k 8k'
  -c 'read -P 0 7M 512k'
  -c 'read -P 0xa5 7680k 1M'
  -c 'read -P 0xa8 10M 256k'
  -c 'read -P 0xa9 11M 256k'
  -c 'read -P 0xa7 16773120 4k'
  -c 'read -P 0 5M 1M'
)

run_io() {  # run_io WHAT ARGS...: qemu-io must succeed and report no failure
  local what=$1
  shift
  qemu-io "$@" >"io.$what.out" 2>&1 || { cat "io.$what.out" >&2; fail "qemu-io $what failed"; }
  if grep -Eqi "fail|error|mismatch" "io.$what.out"; then
    cat "io.$what.out" >&2
    fail "qemu-io $what reported a failure"
  fi
}

for fmt_opts in "" "-o extended_l2=on,cluster_size=128k"; do
  log "image options: ${fmt_opts:-default}"
  rm -f disk.qcow2 expected.raw s.sock
  # shellcheck disable=SC2086
  "$TD" create -f qcow2 $fmt_opts disk.qcow2 16M >/dev/null
  qemu-img create -f raw expected.raw 16M >/dev/null
  run_io expected -f raw expected.raw "${CMDS[@]}"

  serve_unix s s.sock -f qcow2 disk.qcow2
  pid=$SERVER_PID
  run_io write -f raw "$(uri s.sock)" "${CMDS[@]}"
  run_io verify -f raw "$(uri s.sock)" "${VERIFY[@]}"
  # A second connection sees what the first wrote.
  run_io verify2 -f raw "$(uri s.sock)" -c 'read -P 0xa3 1M 64k'
  stop_server "$pid" s
  [[ ! -e s.sock ]] || fail "socket left behind after shutdown"

  check_clean disk.qcow2
  qemu-img compare -f raw -F qcow2 expected.raw disk.qcow2 >cmp.out 2>&1 ||
    { cat cmp.out >&2; fail "served image differs from the raw reference"; }
  # The image was closed: qcow2 dirty bits are clear (qemu-img info).
  qemu-img info --output=json disk.qcow2 >info.json
  if grep -q '"dirty-flag": true' info.json; then fail "image left dirty"; fi
  run_io local -f raw expected.raw "${VERIFY[@]}"
done
log "qemu_io: ok"

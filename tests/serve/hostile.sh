#!/usr/bin/env bash
# Hostile requests (libnbd with strict mode off) against the real binary:
# exact NBD errors, the connection survives, other clients are unaffected.
# HOSTILE_CLIENT is tests/serve/hostile_client.c, built by CMake.
source "$(dirname "$0")/lib.sh"
require_tool qemu-io
require_client HOSTILE_CLIENT

SIZE=$((64 << 20))
"$TD" create -f qcow2 disk.qcow2 $SIZE >/dev/null
qemu-io -f qcow2 disk.qcow2 -c 'write -P 0x5a 0 64k' >/dev/null
serve_unix rw rw.sock disk.qcow2
rwpid=$SERVER_PID
# A second server on the same image, read-only (its own --read-only path).
cp disk.qcow2 ro.qcow2
serve_unix ro ro.sock --read-only ro.qcow2
ropid=$SERVER_PID

timeout 120 "$HOSTILE_CLIENT" "$(uri "$TMP/rw.sock")" "$(uri "$TMP/ro.sock")" $SIZE ||
  fail "hostile client checks failed"
# Both servers still serve a fresh client.
qemu-io -f raw "$(uri rw.sock)" -c 'read -P 0x5a 0 64k' -c 'read -P 0x3c 2M 4k' >io.out 2>&1 ||
  fail "rw server unusable after hostile client: $(cat io.out)"
if grep -q "verification failed" io.out; then fail "wrong data after hostile client"; fi
qemu-io -r -f raw "$(uri ro.sock)" -c 'read -P 0x5a 0 64k' >io.out 2>&1 ||
  fail "ro server unusable after hostile client"
stop_server "$ropid" ro
stop_server "$rwpid" rw
check_clean disk.qcow2
# qemu-img compare: 0 identical, 1 different, 2 an error (which must not pass).
rc=0
qemu-img compare ro.qcow2 disk.qcow2 >cmp.out 2>&1 || rc=$?
[[ $rc == 1 ]] || fail "compare ro.qcow2 disk.qcow2: exit $rc, want 1 (the good client's write landed): $(cat cmp.out)"
# qemu-io exits 1 when any command fails, a pattern mismatch included.
qemu-io -f qcow2 disk.qcow2 -c 'read -P 0x5a 0 64k' -c 'read -P 0 1M 64k' >io.out 2>&1 ||
  fail "rejected requests changed the image (or it is unreadable): $(cat io.out)"
if grep -q "verification failed" io.out; then fail "rejected requests changed the image"; fi
log "hostile: ok"

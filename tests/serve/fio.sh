#!/usr/bin/env bash
# fio's nbd engine against `thindisk serve`: random writes with crc32c
# verification at iodepth 16 from several jobs (one connection each) at
# once, then a verifying read pass on a fresh connection; bounded by
# --size and --runtime.
source "$(dirname "$0")/lib.sh"
require_tool fio qemu-img
fio --enghelp=nbd >/dev/null 2>&1 || skip_or_fail "fio built without the nbd engine"

"$TD" create -f qcow2 disk.qcow2 256M >/dev/null
serve_unix s s.sock disk.qcow2
pid=$SERVER_PID

# Four jobs, each its own 32 MiB region (offset_increment), so their
# verification does not see one another's writes.
common=(--ioengine=nbd --uri="$(uri "$TMP/s.sock")" --size=32M --offset_increment=32M
  --numjobs=4 --bs=4k --iodepth=16 --group_reporting --output-format=json)
timeout 180 fio --name=rw "${common[@]}" --rw=randwrite --verify=crc32c --verify_fatal=1 \
  --do_verify=1 --runtime=60 --output=write.json >write.log 2>write.err || { cat write.err >&2; fail "fio randwrite+verify failed"; }
expect_eq "write errors" "$(jq '.jobs[0].error' write.json)" 0
[[ $(jq '.jobs[0].write.io_bytes' write.json) -ge $((4 * 32 << 20)) ]] ||
  fail "fio wrote less than the four regions: $(jq '.jobs[0].write.io_bytes' write.json)"
# Verify again from new connections (data survived beyond the writers).
timeout 180 fio --name=rw "${common[@]}" --rw=randwrite --verify=crc32c --verify_only \
  --verify_fatal=1 --output=verify.json >verify.log 2>verify.err || { cat verify.err >&2; fail "fio verify_only failed"; }
expect_eq "verify errors" "$(jq '.jobs[0].error' verify.json)" 0
stop_server "$pid" s
check_clean disk.qcow2
log "fio: ok"

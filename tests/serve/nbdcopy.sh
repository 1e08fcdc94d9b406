#!/usr/bin/env bash
# Bulk copies through `thindisk serve`: nbdcopy both ways with random data,
# and qemu-img convert to and from the export.
source "$(dirname "$0")/lib.sh"
require_tool nbdcopy qemu-img qemu-io

SIZE=$((24 << 20))
# Random data with holes: nbdcopy and convert must keep both right.
head -c $SIZE /dev/urandom >src.raw
dd if=/dev/zero of=src.raw bs=1M seek=4 count=3 conv=notrunc status=none
dd if=/dev/zero of=src.raw bs=64k seek=200 count=5 conv=notrunc status=none

"$TD" create -f qcow2 disk.qcow2 $SIZE >/dev/null
serve_unix s s.sock disk.qcow2
pid=$SERVER_PID

log "nbdcopy file -> export"
timeout 120 nbdcopy src.raw "$(uri s.sock)" || fail "nbdcopy to the export failed"
log "nbdcopy export -> file"
timeout 120 nbdcopy "$(uri s.sock)" back.raw || fail "nbdcopy from the export failed"
cmp src.raw back.raw || fail "nbdcopy round trip differs"
log "nbdcopy export -> export (second connection pair, different offsets)"
"$TD" create -f qcow2 copy.qcow2 $SIZE >/dev/null
serve_unix c c.sock copy.qcow2
cpid=$SERVER_PID
timeout 120 nbdcopy --connections=4 "$(uri s.sock)" "$(uri c.sock)" || fail "export to export copy failed"
# Checked now, through another client: the convert below overwrites copy.qcow2.
timeout 120 qemu-img compare -f raw -F raw src.raw "$(uri c.sock)" ||
  fail "export to export copy differs from the source"

log "qemu-img convert from the export"
timeout 120 qemu-img convert -f raw -O qcow2 "$(uri s.sock)" conv.qcow2 || fail "convert from export failed"
qemu-img compare -f raw -F qcow2 src.raw conv.qcow2 || fail "convert from export differs"
log "qemu-img convert to the export (-n: target exists)"
head -c $SIZE /dev/urandom >src2.raw
timeout 120 qemu-img convert -n -f raw -O raw src2.raw "$(uri c.sock)" || fail "convert to export failed"
stop_server "$cpid" c
stop_server "$pid" s

check_clean disk.qcow2
check_clean copy.qcow2
qemu-img compare -f raw -F qcow2 src.raw disk.qcow2 || fail "disk.qcow2 differs from source"
qemu-img compare -f raw -F qcow2 src2.raw copy.qcow2 || fail "copy.qcow2 differs from source"
# The zero runs of the source were not stored as data by nbdcopy (it
# skips or zeroes them): the image holds less than the full size.
alloc=$(qemu-img info --output=json disk.qcow2 | jq '.["actual-size"]')
[[ $alloc -lt $SIZE ]] || fail "image fully allocated ($alloc bytes): zeros were written as data"
log "nbdcopy: ok"

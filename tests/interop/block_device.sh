#!/usr/bin/env bash
# Images made on a block device (an LVM volume, a SAN LUN; here a loop
# device over a file of random bytes), as qemu-img lays them on a
# host_device: the device keeps its node and its size, and a failure never
# removes the node. Judged by qemu-img and qemu-io:
#   1. convert -O raw onto the device: the source's bytes at its start
#      (qemu-img compare), the bytes past the source kept.
#   2. convert -O qcow2 onto the device, and through a symlink to it (as
#      /dev/VG/LV is): qemu-img check and compare; the node is still a
#      block device and the link still a link.
#   3. create -f qcow2 on the device, written by qemu-io and by thindisk
#      serve until the device is full: ENOSPC for the write past it, the
#      image whole (qemu-img check) and what was written reads back.
#   4. Refusals, each one line, the device's bytes unchanged: a raw image
#      or a qcow2 source larger than the device ("the device is too small").
#   5. A copy that fails after the image was laid (a source whose reads
#      fail): exit 1, the node still a block device.
#   6. A character device (a /dev/null node), a directory and a FIFO as
#      the destination of convert, create and dd: refused, left as they are.
#   7. compact and rm of the image on the device: refused (compact would
#      rename a new file over the node, rm would unlink it), the image whole.
source "$(dirname "$0")/lib.sh"
require_tool "$QEMU_IMG" "$QEMU_IO" losetup nbdkit sha256sum
require_thindisk
[[ $(id -u) == 0 && -e /dev/loop-control ]] || skip_or_fail "needs root and /dev/loop-control"

LOOP=""
device_cleanup() {
  local status=$? i=0
  kill_servers  # nothing may hold the device while it is detached
  while [[ -n $LOOP ]] && ((i++ < 20)); do
    if losetup -d "$LOOP" 2>/dev/null; then LOOP=""; else sleep 0.1; fi
  done
  [[ -z $LOOP ]] || echo "could not detach $LOOP" >&2
  cleanup "$status"
}
trap device_cleanup EXIT

DEV_SIZE=$((32 << 20))
head -c $DEV_SIZE /dev/urandom >backing.img
LOOP=$(losetup -f --show backing.img) || skip_or_fail "losetup found no free loop device"
# The tests use a node of their own for it: a thindisk that removed the
# node it was given removes this one, not the machine's /dev entry.
DEV=$TMP/dev
mknod "$DEV" b $((16#$(stat -c %t "$LOOP"))) $((16#$(stat -c %T "$LOOP")))
head -c 1 "$DEV" >/dev/null || skip_or_fail "a device node in $TMP does not work (nodev?)"

# assert_block_device PATH WHAT: PATH (through links) is still a block device.
assert_block_device() {
  [[ -b $1 ]] || fail "$2: $1 is no longer a block device ($(ls -l "$1" 2>&1))"
}
device_sum() { sha256sum <"$DEV" | cut -d' ' -f1; }

SIZE=$((8 << 20))
log "the source: data, zeroes and holes"
ok "$QEMU_IMG" create -q -f qcow2 src.qcow2 $SIZE
io_ok qemu-io src.qcow2 "write -P 0x31 0 1M" "write -z 2M 1M" "write -P 0x32 5M 300k" \
  "write -P 0x33 $((SIZE - 4096)) 4096"

log "1. convert -O raw onto the device"
tail_before=$(tail -c +$((SIZE + 1)) "$DEV" | sha256sum)
td convert -O raw src.qcow2 "$DEV"
assert_block_device "$DEV" "convert -O raw"
head -c $SIZE "$DEV" >head.raw
ok "$QEMU_IMG" compare -f qcow2 -F raw src.qcow2 head.raw
[[ $(tail -c +$((SIZE + 1)) "$DEV" | sha256sum) == "$tail_before" ]] ||
  fail "convert -O raw changed the device past the image"

log "2. convert -O qcow2 onto the device, and through a link to it"
ln -s "$DEV" lv
for dst in "$DEV" lv; do
  td convert -O qcow2 src.qcow2 "$dst"
  assert_block_device "$dst" "convert -O qcow2 onto $dst"
  qemu_check "$DEV"
  ok "$QEMU_IMG" compare -f qcow2 -F qcow2 src.qcow2 "$DEV"
done
[[ -L lv ]] || fail "the link to the device was replaced"

log "3. create -f qcow2 on the device, written until it is full"
td create -q -f qcow2 "$DEV" 64M
io_ok qemu-io "$DEV" "write -P 0x41 0 20M"
capture "$QEMU_IO" -c "write -P 0x42 20M 20M" "$DEV"
grep -q "No space left on device" "$OUT" "$ERR" ||
  fail "a write past the device's end: $(cat "$OUT" "$ERR")"
qemu_check "$DEV"
io_ok qemu-io "$DEV" "read -P 0x41 0 20M"
td create -q -f qcow2 "$DEV" 64M
serve_unix dev "$TMP/dev.sock" -f qcow2 "$DEV"
URI="nbd+unix:///?socket=$TMP/dev.sock"
io_ok qemu-io-raw "$URI" "write -P 0x51 0 20M" "read -P 0x51 0 20M"
capture "$QEMU_IO" -f raw -c "write -P 0x52 20M 20M" "$URI"
grep -q "No space left on device" "$OUT" "$ERR" ||
  fail "a write past the device's end over NBD: $(cat "$OUT" "$ERR")"
stop_server "$SERVER_PID"
qemu_check "$DEV"
io_ok qemu-io "$DEV" "read -P 0x51 0 20M"
assert_block_device "$DEV" "serve"

log "4. too small: refused, the device unchanged"
before=$(device_sum)
ok "$QEMU_IMG" create -q -f qcow2 big.qcow2 64M
io_ok qemu-io big.qcow2 "write -P 0x61 0 40M"
td_fails "the device is too small" "a raw image larger than the device" \
  convert -O raw big.qcow2 "$DEV"
td_fails "the device is too small" "a qcow2 source larger than the device" \
  convert -O qcow2 big.qcow2 "$DEV"
td_fails "the device is too small" "create -f raw larger than the device" \
  create -q -f raw "$DEV" 1G
[[ $(device_sum) == "$before" ]] || fail "a refused image changed the device"
assert_block_device "$DEV" "refusals"

log "5. a copy that fails midway leaves the node"
spawn bad nbdkit -f -U "$TMP/bad.sock" --filter=error pattern 8M error-pread=EIO error-pread-rate=1
wait_for_socket "$TMP/bad.sock"
td_fails "" "a source whose reads fail" convert -f raw -O qcow2 \
  "nbd+unix:///?socket=$TMP/bad.sock" "$DEV"
assert_block_device "$DEV" "a failed copy"

log "6. a character device, a directory and a FIFO are refused"
mknod null-node c 1 3
mkdir dir
mkfifo fifo
for dst in null-node dir fifo; do
  td_fails "is a (character device|directory|FIFO): an image is made in a file" \
    "convert onto $dst" convert -O raw src.qcow2 "$dst"
  td_fails "is a (character device|directory|FIFO)" "create on $dst" create -q -f qcow2 "$dst" 1M
  td_fails "is a (character device|directory|FIFO)" "dd onto $dst" dd if=src.qcow2 of="$dst"
done
[[ -c null-node && -d dir && -p fifo ]] || fail "a refused destination was changed: $(ls -l)"

log "7. compact and rm leave the device alone"
td convert -O qcow2 src.qcow2 "$DEV"
td_fails "is not a regular file \(a block device\): compact rewrites" "compact on the device" \
  compact "$DEV"
td_fails "is a block device: thindisk rm removes image files" "rm of the device" rm "$DEV"
td_fails "is a block device" "rm through a link to the device" rm lv
assert_block_device "$DEV" "compact and rm"
[[ -L lv ]] || fail "rm removed the link to the device"
qemu_check "$DEV"
ok "$QEMU_IMG" compare -f qcow2 -F qcow2 src.qcow2 "$DEV"

log "PASS"

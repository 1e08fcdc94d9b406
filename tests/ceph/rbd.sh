#!/usr/bin/env bash
# Existing RBD images as thindisk devices (issue 14, step 2; io/rbd_storage.h),
# judged with tools no one here wrote: `rbd` makes, fills (import) and reads
# back (export) the images; qemu-img/qemu-io make and compare the
# references; qemu-io writes through `thindisk serve`.
#   1. info, map (the object map's extents), convert out of an RBD image
#      (content and holes), a snapshot read-only.
#   2. a qcow2 clone in RADOS over an RBD golden image: only the clone
#      changes; the golden image is untouched.
#   3. serve an RBD image read-write: qemu-io's writes, discards and
#      write-zeroes are what `rbd export` reads back.
#   4. one writer (the exclusive-lock feature); errors.
source "$(dirname "$0")/../interop/lib.sh"
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

require_thindisk
require_tool "$QEMU_IMG" "$QEMU_IO" rbd rados nbdinfo jq
require_test_cluster

POOL=thindisk
TAG=r$$
rbd_() { timeout 120 rbd "$@"; }
FEATURES=layering,exclusive-lock,object-map,fast-diff

# The reference disk: data, a hole, zeros.
ok "$QEMU_IMG" create -f raw -q ref.raw 64M
io_ok qemu-io-raw ref.raw "write -P 0xa1 0 3M" "write -P 0xb2 20M 64k" "write -P 0xc3 40M 1M"
ok rbd_ import --image-feature "$FEATURES" ref.raw "$POOL/$TAG-gold"
GOLD=rbd:$POOL/$TAG-gold

log "info, map, convert, snapshot"
td info --output=json "$GOLD"
assert_eq raw "$(jq -r .format "$OUT")" "format of an RBD image"
assert_eq 67108864 "$(jq '."virtual-size"' "$OUT")" "size of an RBD image"
td map --output=json "$GOLD"
# The object map's extents are whole 4 MiB objects: data at 0, 20M and 40M.
assert_eq '[[0,4194304],[20971520,25165824],[41943040,46137344]]' \
  "$(jq -c '[.[] | select(.data) | [.start, .start + .length]]' "$OUT")" "data extents of the golden image"
td convert -O qcow2 "$GOLD" gold.qcow2
ok "$QEMU_IMG" compare ref.raw gold.qcow2
qemu_check gold.qcow2
ok rbd_ snap create "$POOL/$TAG-gold@before"
td compare "$GOLD@before" ref.raw

log "a clone in RADOS over the RBD golden image"
td create -q -f qcow2 -b "$GOLD" -F raw "rados://$POOL/$TAG-clone"
io_ok thindisk "rados://$POOL/$TAG-clone" "write -P 0xd4 1M 4k" "write -z 40M 64k"
cp ref.raw expect.raw
io_ok qemu-io-raw expect.raw "write -P 0xd4 1M 4k" "write -z 40M 64k"
td compare "rados://$POOL/$TAG-clone" expect.raw
ok rbd_ export "$POOL/$TAG-gold" gold-after.raw
assert_same_bytes ref.raw gold-after.raw "the golden image under a clone"

log "serve an RBD image read-write"
sock=$TMP/s.sock
serve_unix server "$sock" "$GOLD"
uri="nbd+unix:///?socket=$sock"
ok nbdinfo --size "$uri"
assert_eq 67108864 "$(cat "$OUT")" "size of the served RBD image"
io_ok qemu-io-raw "$uri" "write -P 0xe5 8M 128k" "discard 20M 64k" "write -z 0 512k" \
  "read -P 0xe5 8M 128k"
# A second writer is refused while the server holds the exclusive lock.
td_fails "in use by another RBD client" "a second writer of a served RBD image" \
  io -c "write 0 4k" "$GOLD"
stop_server "$SERVER_PID"
io_ok qemu-io-raw ref.raw "write -P 0xe5 8M 128k" "write -z 20M 64k" "write -z 0 512k"
ok rbd_ export "$POOL/$TAG-gold" served.raw
assert_same_bytes ref.raw served.raw "rbd export after qemu-io wrote through thindisk serve"
# The snapshot kept the old bytes.
td convert -O raw "$GOLD@before" before.raw
ok "$QEMU_IMG" compare -f raw -F raw gold-after.raw before.raw

log "errors"
td_fails "no such RBD image" "a missing image" info "rbd:$POOL/$TAG-none"
td_fails "does not exist" "a missing pool" info "rbd:no-such-pool-$TAG/x"
td_fails "unknown option 'cnf'" "an option typo" info "$GOLD:cnf=/x"
td_fails "snapshot is read-only" "writing a snapshot" io -c "write 0 4k" "$GOLD@before"
td_fails "does not create RBD images" "create over rbd:" create -f raw "rbd:$POOL/$TAG-new" 1G
td_fails "removed with rbd rm" "rm of an RBD image" rm "$GOLD"

ok rbd_ snap purge "$POOL/$TAG-gold"
td rm -q "rados://$POOL/$TAG-clone"
ok rbd_ rm "$POOL/$TAG-gold"
echo "PASS"

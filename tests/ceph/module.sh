#!/usr/bin/env bash
# The Ceph module (src/io/ceph_module.h): thindisk maps librados and librbd
# only when a Ceph name needs them, and without its module it still does
# everything else, refusing Ceph names with the reason.
#   1. the binary does not link librados, librbd or libceph-common (ldd);
#   2. work on local images (create, io, convert, info) never loads the
#      module (glibc's LD_DEBUG=files lists every object loaded); a
#      rados:// name loads it, from next to the built binary;
#   3. with THINDISK_MODULE_DIR naming an empty directory the same local
#      work succeeds and gives the same bytes (qemu-img compare), while
#      rados:// and rbd: names, rm, ls and lock fail with exit 1 naming
#      where the module was looked for; a directory whose
#      thindisk-ceph.so is not an ELF file, not thindisk's module, or a
#      module of another build (a stand-in compiled here that answers with
#      another ABI number) is an error naming the file, one whose librados
#      is missing names the packages to install, and each leaves the
#      pool's image alone;
#   4. with the module, the same commands work on the test cluster.
#
# Needs the test cluster (CEPH_CONF; ctest starts it: tests/ceph/fixture.sh).
source "$(dirname "$0")/../interop/lib.sh"
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=../lib/module.sh
source "$INTEROP_DIR/../lib/module.sh"

require_thindisk
require_tool "$QEMU_IMG" ldd rados cc
require_test_cluster

POOL=thindisk
TAG=m$$
img() { echo "rados://$POOL/$TAG-$1"; }
MODULE=$(dirname "$TD")/thindisk-ceph.so
[[ -f $MODULE ]] || fail "no module next to the built binary: $MODULE"

# 1. Not linked.
log "ldd"
linked_by_module_only "$MODULE" 'librados|librbd|libceph' 'librados\.so'

# 2. Local work leaves it alone; a rados:// name loads it.
log "loaded on demand"
local_work_skips thindisk-ceph.so librados
td create -f qcow2 "$(img a)" 16M
loaded "$MODULE" "$TD" info "$(img a)" || fail "info $(img a) did not load $MODULE: $(cat "$ERR")"
grep -q "librados" "$TMP/ldlog" || fail "info $(img a) did not load librados"

# 3. Without it.
log "without the module"
mkdir empty
export THINDISK_MODULE_DIR=$TMP/empty
td convert -O qcow2 local.qcow2 copy2.qcow2
td info copy2.qcow2
ok "$QEMU_IMG" compare local.qcow2 copy2.qcow2
missing="Ceph support is not installed: no thindisk-ceph.so \(looked for $TMP/empty/thindisk-ceph.so\)"
td_fails "^thindisk: $(img a): $missing" "info of a rados:// image" info "$(img a)"
td_fails "$missing" "create in a pool" create -f qcow2 "$(img b)" 1G
if grep -q Formatting "$OUT"; then fail "create said it was formatting $(img b): $(cat "$OUT")"; fi
td_fails "$missing" "rm of a rados:// image" rm "$(img a)"
td_fails "$missing" "ls of a pool" ls "rados://$POOL"
td_fails "$missing" "lock ls of a rados:// image" lock ls "$(img a)"
td_fails "$missing" "lock break of a rados:// image" lock break "$(img a)"
td_fails "$missing" "an rbd: image" info "rbd:$POOL/none"
td_fails "$missing" "a convert into a pool" convert -O qcow2 local.qcow2 "$(img c)"
rados_ stat "$TAG-b.header" 2>/dev/null && fail "create made $TAG-b without the module"

log "a broken module"
refuses_broken_modules "$MODULE" Ceph thindisk_ceph_module 8 librados.so.2 \
  "apt-get install librados2 librbd1" info "$(img a)"
refuses_broken_modules "$MODULE" Ceph thindisk_ceph_module 8 librados.so.2 \
  "apt-get install librados2 librbd1" rm "$(img a)"
rados_ stat "$TAG-a.header" >/dev/null || fail "a failed rm touched $(img a)"

# 4. With it again: the image is whole.
log "with the module"
unset THINDISK_MODULE_DIR
td info "$(img a)"
td ls "rados://$POOL"
grep -q "$TAG-a" "$OUT" || fail "ls does not list $TAG-a: $(cat "$OUT")"
td rm "$(img a)"
log "pass"

#!/usr/bin/env bash
# The NBD client module (src/nbdclient/nbd_module.h): thindisk maps libnbd
# (and the libxml2 and ICU it brings) only when it acts as an NBD client;
# without its module it still serves disks and does all local work,
# refusing NBD URIs with the reason.
#   1. the binary links neither libnbd nor libxml2 (ldd); the module links
#      libnbd;
#   2. create, io, convert, info, check and map of local images load
#      neither the module nor libnbd (glibc's LD_DEBUG=files lists every
#      object loaded), nor does a server whose export qemu-io reads
#      (/proc/PID/maps); info of an export loads both, from next to the
#      built binary;
#   3. with THINDISK_MODULE_DIR naming an empty directory, local work gives
#      the same bytes (qemu-img compare) and `serve` still serves (qemu-io
#      writes and reads back), while info, map, io, compare (exit 2),
#      convert from and onto an export, create on one, a backing file on
#      one, serve -L, bench --uri and backup exit 1 naming where the module
#      was looked for; nothing is made and the export keeps its bytes;
#   4. a module file that is not an ELF object, a library that is not the
#      module, a module of another build and one whose libnbd is missing
#      are each refused with the reason (tests/lib/module.sh);
#   5. with the module, the same commands work.
source "$(dirname "$0")/lib.sh"
# shellcheck source=../lib/module.sh
source "$INTEROP_DIR/../lib/module.sh"

require_thindisk
require_tool "$QEMU_IMG" "$QEMU_IO" ldd nbdinfo cc

MODULE=$(dirname "$TD")/thindisk-nbd.so
[[ -f $MODULE ]] || fail "no module next to the built binary: $MODULE"
uri() { echo "nbd+unix:///?socket=$TMP/$1"; }
# re TEXT: TEXT as an extended regular expression that matches it alone.
re() { sed 's/[][\.*^$?+(){}|]/\\&/g' <<<"$1"; }

# 1. Not linked.
log "ldd"
linked_by_module_only "$MODULE" 'libnbd|libxml2|libicu' 'libnbd\.so'

# 2. Local work and serving leave it alone; an NBD URI loads it.
log "loaded on demand"
local_work_skips thindisk-nbd.so libnbd
serve_unix served "$TMP/s.sock" copy.qcow2
wait_accepting "$(uri s.sock)"
ok "$QEMU_IO" -f raw -c 'read -P 0x5a 1M 3M' "$(uri s.sock)"
if grep -E 'thindisk-nbd|libnbd' "/proc/$SERVER_PID/maps"; then
  fail "serving an image loaded the NBD client module"
fi
loaded "$MODULE" "$TD" info "$(uri s.sock)" ||
  fail "info of an export did not load $MODULE: $(cat "$ERR")"
grep -q "libnbd" "$TMP/ldlog" || fail "info of an export did not load libnbd"

# 3. Without it.
log "without the module"
mkdir empty out
export THINDISK_MODULE_DIR=$TMP/empty
td convert -O qcow2 local.qcow2 copy2.qcow2
ok "$QEMU_IMG" compare local.qcow2 copy2.qcow2
serve_unix bare "$TMP/bare.sock" copy2.qcow2
U=$(uri bare.sock)
wait_accepting "$U"
ok "$QEMU_IO" -f raw -c 'write -P 0x77 0 64k' -c 'read -P 0x77 0 64k' -c 'read -P 0x5a 1M 3M' "$U"
missing="NBD client support is not installed: no thindisk-nbd\.so \(looked for $(re "$TMP/empty/thindisk-nbd.so")\)"
td_fails "^thindisk: $(re "$U"): $missing" "info of an export" info "$U"
td_fails "$missing" "map of an export" map "$U"
td_fails "$missing" "io on an export" io -c 'read 0 4k' "$U"
# compare says "error" with exit 2, as qemu-img compare does.
capture "$TD" compare local.qcow2 "$U"
[[ $RC -eq 2 ]] && grep -qE "$missing" "$ERR" || fail "compare with an export: exit $RC, $(cat "$ERR")"
td_fails "$missing" "a convert from an export" convert -O raw "$U" out/from.raw
td_fails "$missing" "a convert onto an export" convert -O raw local.qcow2 "$U"
td_fails "$missing" "create on an export" create -f qcow2 "$U" 8M
if grep -q Formatting "$OUT"; then fail "create said it was formatting $U: $(cat "$OUT")"; fi
td_fails "$missing" "a backing file on an export" create -f qcow2 -b "$U" -F raw out/over.qcow2
td_fails "-L/--list $(re "$TMP/bare.sock"): $missing" "serve -L" serve -L -k "$TMP/bare.sock"
td_fails "$missing" "bench --uri" bench --uri "$U" --workloads W1 --size 4M --ops 8
td_fails "$missing" "a backup of an export" backup --bitmap b --control "$TMP/none.ctl" "$U" out/b.qcow2
[[ -z $(ls out) ]] || fail "failed commands left files behind: $(ls out)"
ok "$QEMU_IO" -f raw -c 'read -P 0x77 0 64k' -c 'read -P 0x5a 1M 3M' -c 'read -P 0 4M 60M' "$U"

# 4. Broken modules, each refused with the reason.
log "a broken module"
refuses_broken_modules "$MODULE" "NBD client" thindisk_nbd_module 7 libnbd.so.0 \
  "apt-get install libnbd0" info "$U"

# 5. With it again.
log "with the module"
unset THINDISK_MODULE_DIR
td info "$U"
td convert -O raw "$U" out/from.raw
ok "$QEMU_IO" -f raw -c 'read -P 0x77 0 64k' -c 'read -P 0x5a 1M 3M' out/from.raw
td serve -L -k "$TMP/bare.sock"
grep -q "exports available: 1" "$OUT" || fail "serve -L: $(cat "$OUT")"
td bench --uri "$U" --workloads W1 --size 4M --ops 8
log "pass"

#!/usr/bin/env bash
# The TLS module (src/nbd/tls.h): `thindisk serve` maps GnuTLS (and the
# eight libraries it brings) only when it is given TLS credentials;
# without the module it still serves in plaintext and does all local
# work, and a server asked for TLS refuses to start, saying why.
#   1. the binary does not link GnuTLS (ldd); the module does;
#   2. create, io, convert, info and check of local images load neither
#      the module nor GnuTLS (LD_DEBUG=files), nor does a plaintext server
#      while qemu-io reads its export (/proc/PID/maps); a server with
#      --tls-psk has both mapped, and nbdinfo reads its export over TLS;
#   3. with THINDISK_MODULE_DIR naming an empty directory, local work gives
#      the same bytes and a plaintext server still serves, while `serve
#      --tls-psk` and `serve --tls-creds` exit 1 naming where the module
#      was looked for, leaving no socket behind;
#   4. a module file that is not an ELF object, a library that is not the
#      module, a module of another build and one whose GnuTLS is missing
#      are each refused with the reason (tests/lib/module.sh);
#   5. with the module again, the TLS server serves nbdinfo and nbdcopy.
source "$(dirname "$0")/lib.sh"
# shellcheck source=../lib/module.sh
source "$INTEROP_DIR/../lib/module.sh"

require_thindisk
require_tool "$QEMU_IMG" "$QEMU_IO" ldd nbdinfo nbdcopy cc

MODULE=$(dirname "$TD")/thindisk-tls.so
[[ -f $MODULE ]] || fail "no module next to the built binary: $MODULE"
echo "alice:00112233445566778899aabbccddeeff" >keys.psk
tls_uri() { echo "nbds+unix://alice@/?socket=$TMP/$1&tls-psk-file=$TMP/keys.psk"; }

# 1. Not linked.
log "ldd"
linked_by_module_only "$MODULE" 'libgnutls|libnettle|libhogweed|libp11-kit' 'libgnutls\.so'

# 2. Local work and plaintext serving leave it alone; TLS credentials load it.
log "loaded on demand"
local_work_skips thindisk-tls.so libgnutls
serve_unix plain "$TMP/plain.sock" copy.qcow2
wait_accepting "nbd+unix:///?socket=$TMP/plain.sock"
ok "$QEMU_IO" -f raw -c 'read -P 0x5a 1M 3M' "nbd+unix:///?socket=$TMP/plain.sock"
if grep -E 'thindisk-tls|libgnutls' "/proc/$SERVER_PID/maps"; then
  fail "a plaintext server loaded the TLS module"
fi
kill_server "$SERVER_PID"
serve_unix tls "$TMP/tls.sock" --tls-psk "$TMP/keys.psk" -r copy.qcow2
wait_for_socket "$TMP/tls.sock"
ok nbdinfo --size "$(tls_uri tls.sock)"
assert_eq 67108864 "$(cat "$OUT")" "the export's size over TLS"
# grep reads the file itself: `cat | grep -q` fails under pipefail when
# grep's early exit gives cat a SIGPIPE.
grep -qF "$MODULE" "/proc/$SERVER_PID/maps" || fail "the TLS server did not load $MODULE"
grep -q libgnutls "/proc/$SERVER_PID/maps" || fail "the TLS server did not load GnuTLS"
kill_server "$SERVER_PID"

# 3. Without it.
log "without the module"
mkdir empty
export THINDISK_MODULE_DIR=$TMP/empty
td convert -O qcow2 local.qcow2 copy2.qcow2
ok "$QEMU_IMG" compare local.qcow2 copy2.qcow2
serve_unix bare "$TMP/bare.sock" copy2.qcow2
wait_accepting "nbd+unix:///?socket=$TMP/bare.sock"
ok "$QEMU_IO" -f raw -c 'write -P 0x77 0 64k' -c 'read -P 0x77 0 64k' -c 'read -P 0x5a 1M 3M' \
  "nbd+unix:///?socket=$TMP/bare.sock"
kill_server "$SERVER_PID"
missing="TLS support is not installed: no thindisk-tls\.so \(looked for $TMP/empty/thindisk-tls\.so\)"
td_fails "^thindisk: $missing" "serve --tls-psk" serve --tls-psk "$TMP/keys.psk" -k "$TMP/t1.sock" copy2.qcow2
mkdir x509
td_fails "$missing" "serve --tls-creds" serve --tls-creds "$TMP/x509" -k "$TMP/t2.sock" copy2.qcow2
[[ ! -e $TMP/t1.sock && ! -e $TMP/t2.sock ]] || fail "a server that could not start left its socket"

# 4. Broken modules, each refused with the reason.
log "a broken module"
refuses_broken_modules "$MODULE" TLS thindisk_tls_module 5 libgnutls.so.30 \
  "apt-get install libgnutls30" serve --tls-psk "$TMP/keys.psk" -k "$TMP/t3.sock" copy2.qcow2
[[ ! -e $TMP/t3.sock ]] || fail "a server that could not start left its socket"

# 5. With it again.
log "with the module"
unset THINDISK_MODULE_DIR
serve_unix tls2 "$TMP/tls2.sock" --tls-psk "$TMP/keys.psk" -r copy2.qcow2
wait_for_socket "$TMP/tls2.sock"
ok nbdcopy "$(tls_uri tls2.sock)" over-tls.raw
ok "$QEMU_IO" -f raw -c 'read -P 0x77 0 64k' -c 'read -P 0x5a 1M 3M' -c 'read -P 0 4M 60M' over-tls.raw
kill_server "$SERVER_PID"
log "pass"

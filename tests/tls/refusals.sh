#!/usr/bin/env bash
# What a TLS server must refuse, against TLS_SERVER (thindisk, or the
# reference qemu-nbd or nbdkit): plaintext clients, option-level abuse
# (raw_client.py: options before TLS, STARTTLS twice, bytes injected after
# STARTTLS, a garbage or truncated or stalled handshake), a certificate of
# another CA, a certificate the authorization list does not name, a wrong
# PSK and an unknown PSK user, an expired server certificate (the client
# refuses), and state kept across STARTTLS (a server offering TLS
# optionally). No refused client gets export data, and after each refusal
# the server still serves a good client the right bytes.
#   TLS_SERVER=qemu-nbd bash tests/tls/refusals.sh
source "$(dirname "$0")/lib.sh"
require_tool nbdinfo nbdcopy qemu-img cmp
require_tls_server

make_pki pki
# The export's bytes: a marker no refused client may receive, then random.
MARKER=thindisk-tls-secret-marker
{ head -c 1M < <(yes "$MARKER"); head -c 3M /dev/urandom; } >want.raw
img=$(image_for_server disk want.raw)

# The server's handshake timeout for stall-handshake: thindisk's is set
# short; qemu-nbd 7.2 (Debian) has a fixed 10 s; nbdkit sets none, so
# GnuTLS's default handshake timeout (40 s) ends the stall.
case $TLS_SERVER in
  thindisk) STALL=3 ;;
  qemu-nbd) STALL=10 ;;
  nbdkit) STALL=40 ;;
esac

# expect_serving URI WHAT: a good client reads the whole export, right.
expect_serving() {
  nbdcopy "$1" serving.raw 2>serving.err || fail "after $2 the server no longer serves: $(cat serving.err)"
  cmp -s serving.raw want.raw || fail "after $2 a good client reads wrong data"
  rm -f serving.raw
}

# refused URI WHAT: nbdcopy and nbdinfo with URI both fail, and no export
# data reached nbdcopy's output. REFUSAL is nbdinfo's message.
refused() {
  rm -f got.raw
  if nbdcopy "$1" got.raw 2>refused.err; then fail "$2: nbdcopy was served"; fi
  if [[ -f got.raw ]] && grep -q "$MARKER" got.raw; then fail "$2: export data reached the client"; fi
  if nbdinfo --size "$1" >refused.out 2>refused.err; then fail "$2: nbdinfo was served"; fi
  REFUSAL=$(cat refused.err)
  log "$2 refused: $(head -1 refused.err)"
}

# skip_check WHAT WHY: a check the reference server cannot take part in.
skip_check() { log "SKIPPED for $TLS_SERVER: $1 ($2)"; }

# ---- The main server: X.509, client certificates required --------------
main_args=()
[[ $TLS_SERVER != thindisk ]] || main_args=(--handshake-timeout "$STALL")
start_tls_server "$TLS_SERVER" "$TMP/x.sock" "$img" "$PKI/server" "${main_args[@]}"
main_pid=$SERVER_PID
GOOD=$(tls_uri "$TMP/x.sock" "$PKI/alice")
expect_serving "$GOOD" "the start"

log "plaintext clients"
refused "nbd+unix:///?socket=$TMP/x.sock" "plaintext nbdcopy/nbdinfo"
grep -q TLS <<<"$REFUSAL" || fail "nbdinfo's refusal does not mention TLS: $REFUSAL"
if qemu-img info "nbd+unix:///?socket=$TMP/x.sock" >qinfo.out 2>&1; then
  fail "plaintext qemu-img info was served: $(cat qinfo.out)"
fi
log "plaintext qemu-img info refused: $(head -1 qinfo.out)"
expect_serving "$GOOD" "plaintext clients"

log "option-level checks (raw_client.py)"
for check in plain-options starttls-twice injection garbage-handshake truncated-record; do
  raw_check "$check" "$TMP/x.sock" "$PKI/alice"
  expect_serving "$GOOD" "raw_client.py $check"
done
raw_check stall-handshake "$TMP/x.sock" "$PKI/alice" "$STALL"
expect_serving "$GOOD" "raw_client.py stall-handshake"

log "certificates"
refused "$(tls_uri "$TMP/x.sock" "$PKI/mallory")" "mallory (a certificate of another CA)"
expect_serving "$GOOD" "mallory"
# Without an authorization list bob is a client like alice (so the refusal
# below is the list's doing).
expect_serving "$(tls_uri "$TMP/x.sock" "$PKI/bob")" "bob (no authorization list)"
kill -0 "$main_pid" 2>/dev/null || fail "the main server died"
stop_tls "$main_pid" x

log "an expired server certificate"
# libnbd 1.14 does not verify the server's certificate over a Unix socket
# (no hostname: it connects even to a server of another CA), so nbdinfo
# judges it over TCP, localhost; qemu-io checks it against tls-hostname.
port=$(free_port)
if try_start_tls_server "$TLS_SERVER" "tcp:$port" "$img" "$PKI/expired"; then
  epid=$SERVER_PID
  refused "nbds://localhost:$port/?tls-certificates=$PKI/alice" "nbdinfo against an expired server certificate"
  grep -qi certificate <<<"$REFUSAL" || fail "the refusal does not blame the certificate: $REFUSAL"
  if qemu-io --object "$(qemu_x509 "$PKI/alice")" --image-opts \
    "$(qemu_nbd_tcp_opts "$port")" \
    -c 'read 0 512' >qio.out 2>&1; then
    fail "qemu-io read from a server with an expired certificate: $(head -3 qio.out)"
  fi
  log "qemu-io refused too: $(head -1 qio.out)"
  stop_tls "$epid" "tcp-$port"
else
  # Refusing to start with an expired certificate is a refusal too.
  log "$TLS_SERVER refuses to start with an expired certificate: $(head -1 "tcp-$port.err")"
  grep -qi expired "tcp-$port.err" ||
    fail "$TLS_SERVER failed to start, but not for the expired certificate: $(cat "tcp-$port.err")"
fi

log "authorization"
# qemu's authz-list-file format, alice's exact DN. thindisk matches the DN
# as RFC 4514 prints it, CN first (gnutls_x509_crt_get_dn2); qemu-nbd 7.2
# matches it in the certificate's encoding order, O first (the legacy
# gnutls_x509_crt_get_dn: "TLS x509 authz check for O=thindisk test,CN=bob").
authz_dn=$ALICE_DN
[[ $TLS_SERVER != qemu-nbd ]] || authz_dn=$ALICE_DN_LEGACY
cat >authz.json <<EOF
{"policy": "deny",
 "rules": [{"match": "$authz_dn", "policy": "allow", "format": "exact"}]}
EOF
# authz_case NAME ARGS...: with the server started with ARGS, alice reads,
# bob is refused and the server's log names bob.
authz_case() {
  local name=$1
  shift
  start_tls_server "$TLS_SERVER" "$TMP/$name.sock" "$img" "$PKI/server" "$@"
  local pid=$SERVER_PID
  expect_serving "$(tls_uri "$TMP/$name.sock" "$PKI/alice")" "alice ($*)"
  refused "$(tls_uri "$TMP/$name.sock" "$PKI/bob")" "bob ($*)"
  expect_serving "$(tls_uri "$TMP/$name.sock" "$PKI/alice")" "bob's refusal ($*)"
  grep -q "bob" "$name.err" || fail "the server's log does not name bob ($*): $(cat "$name.err")"
  log "the server's log names bob: $(grep bob "$name.err" | head -1)"
  stop_tls "$pid" "$name"
}
case $TLS_SERVER in
  thindisk)
    authz_case allow --tls-allow 'CN=alice,*'
    authz_case authz --tls-authz "$TMP/authz.json"
    # qemu-nbd's line for the same file.
    authz_case object --object "authz-list-file,id=authz0,filename=$TMP/authz.json" --tls-authz authz0
    ;;
  qemu-nbd)
    # This qemu-nbd lists authz-list-file but refuses to create one
    # ("Parameter 'qom-type' does not accept value"): the same rules go in
    # as an authz-list object.
    require_tool jq
    authz_case authz --object "$(jq -c '{"qom-type": "authz-list", id: "authz0"} + .' authz.json)" \
      --tls-authz authz0
    ;;
  nbdkit) skip_check "bob refused by an authorization list" "nbdkit has no authorization list" ;;
esac

log "PSK"
start_tls_server "$TLS_SERVER" "$TMP/p.sock" "$img" "$PKI/psk/keys.psk"
psk_pid=$SERVER_PID
GOOD_PSK=$(psk_uri "$TMP/p.sock" alice "$PKI/psk/keys.psk")
expect_serving "$GOOD_PSK" "the start (PSK)"
refused "$(psk_uri "$TMP/p.sock" alice "$PKI/psk-wrong/keys.psk")" "alice with a wrong PSK"
expect_serving "$GOOD_PSK" "a wrong PSK"
refused "$(psk_uri "$TMP/p.sock" carol "$PKI/psk-unknown/keys.psk")" "carol (an unknown PSK user)"
expect_serving "$GOOD_PSK" "an unknown PSK user"
refused "nbd+unix:///?socket=$TMP/p.sock" "plaintext (PSK server)"
expect_serving "$GOOD_PSK" "plaintext (PSK server)"
stop_tls "$psk_pid" p

log "no state survives STARTTLS (TLS optional)"
if [[ $TLS_SERVER == qemu-nbd ]]; then
  skip_check state-reset "qemu-nbd always requires TLS when it has credentials"
else
  TLS_MODE=on start_tls_server "$TLS_SERVER" "$TMP/o.sock" "$img" "$PKI/server"
  opid=$SERVER_PID
  raw_check state-reset "$TMP/o.sock" "$PKI/alice"
  expect_serving "$(tls_uri "$TMP/o.sock" "$PKI/alice")" "state-reset"
  # TLS optional: a plaintext client is served too.
  expect_serving "nbd+unix:///?socket=$TMP/o.sock" "state-reset (plaintext)"
  stop_tls "$opid" o
fi
log "refusals ($TLS_SERVER): ok"

#!/usr/bin/env bash
# Real clients through TLS against TLS_SERVER (thindisk, or the reference
# qemu-nbd or nbdkit), X.509 with client certificates and PSK, each checked
# against the export's content: nbdinfo (size), nbdcopy of a random file in
# and out, qemu-io writes and pattern reads, qemu-img convert to a local
# qcow2 and qemu-img compare with the export, fio randwrite with crc32c
# verify; finally the whole export is compared with what was written. Then
# a server started by socket activation (TCP) and thindisk bench over TLS;
# qemu-nbd's own TLS command line (--object tls-creds-x509/-psk, --tls-creds
# ID), which thindisk serve takes as qemu-nbd does; and `thindisk serve -L`
# over TLS (X.509, PSK, TCP), which must print what qemu-nbd -L prints.
#   TLS_SERVER=nbdkit bash tests/tls/clients.sh
source "$(dirname "$0")/lib.sh"
require_tool nbdinfo nbdcopy qemu-io qemu-img fio jq cmp systemd-socket-activate
((EUID != 0)) || require_tool setpriv
require_tls_server
random_seed
RANDOM=$SEED

MiB=$((1 << 20))
SIZE=$((64 * MiB))
make_pki pki
img=$(image_for_server disk 64M)

# expect_zero FILE OFFSET LENGTH WHAT: that range of FILE reads as zeros.
expect_zero() {
  cmp -s -n "$3" <(tail -c +"$(($2 + 1))" "$1") /dev/zero || fail "$4: not zero"
}

# expect_same FILE1 FILE2 OFFSET LENGTH WHAT: that range is equal in both.
expect_same() {
  cmp -s -n "$4" <(tail -c +"$(($3 + 1))" "$1") <(tail -c +"$(($3 + 1))" "$2") || fail "$5"
}

# list_same WHAT QEMU_NBD_ARGS -- THINDISK_ARGS: qemu-nbd -L and thindisk
# serve -L (each with its own arguments: the address and the TLS options)
# print the same listing; the export of 64 MiB is in it.
list_same() {
  local what=$1 i
  shift
  local qemu_args=() td_args=()
  while [[ $1 != -- ]]; do qemu_args+=("$1"); shift; done
  shift
  td_args=("$@")
  [[ $TD != false ]] || return 0
  log "-L over TLS ($what): thindisk serve -L lists what qemu-nbd -L lists"
  qemu-nbd -L "${qemu_args[@]}" >list.qemu 2>list.err || fail "qemu-nbd -L ($what): $(cat list.err)"
  for i in 1 2; do  # twice: the listing ends the session cleanly
    "$TD" serve -L "${td_args[@]}" >list.td 2>list.err || fail "thindisk serve -L ($what): $(cat list.err)"
  done
  cmp list.qemu list.td || fail "-L ($what): the listings differ: $(diff list.qemu list.td)"
  grep -qx "  size:  $SIZE" list.td || fail "-L ($what): no export of $SIZE bytes: $(cat list.td)"
}

# list_refused WHAT ARGS...: thindisk serve -L ARGS fails with a message.
list_refused() {
  local what=$1
  shift
  [[ $TD != false ]] || return 0
  if "$TD" serve -L "$@" >list.td 2>list.err; then
    fail "thindisk serve -L lists with $what: $(cat list.td)"
  fi
  [[ -s list.err ]] || fail "thindisk serve -L with $what fails without a message"
}

# ---- X.509 --------------------------------------------------------------
start_tls_server "$TLS_SERVER" "$TMP/x.sock" "$img" "$PKI/server"
pid=$SERVER_PID
X509=$(tls_uri "$TMP/x.sock" "$PKI/alice")

log "nbdinfo (X.509)"
nbdinfo --json "$X509" >info.json || fail "nbdinfo with alice's certificate failed"
expect_eq "export size (X.509)" "$(jq '.exports[0]["export-size"]' info.json)" "$SIZE"
expect_eq "TLS in use" "$(jq '.TLS' info.json)" true

log "nbdcopy in and out (X.509)"
# A random file of 16..48 MiB at the start; 56 MiB on are for fio and qemu-io.
in_size=$(((16 + RANDOM % 33) * MiB))
head -c "$in_size" /dev/urandom >in.raw
nbdcopy in.raw "$X509" || fail "nbdcopy into the export failed"
nbdcopy "$X509" out.raw || fail "nbdcopy out of the export failed"
expect_eq "size copied out" "$(stat -c %s out.raw)" "$SIZE"
cmp -n "$in_size" in.raw out.raw || fail "nbdcopy: the export differs from the file copied in"
expect_zero out.raw "$in_size" $((SIZE - in_size)) "nbdcopy: the export beyond the file copied in"

log "qemu-io (X.509)"
qemu-io --object "$(qemu_x509 "$PKI/alice")" --image-opts "$(qemu_nbd_opts "$TMP/x.sock")" \
  -c 'write -P 0x5a 60M 1M' -c flush >qio.out || fail "qemu-io write (X.509) failed"
# A second connection reads it back.
qemu-io --object "$(qemu_x509 "$PKI/alice")" --image-opts "$(qemu_nbd_opts "$TMP/x.sock")" \
  -c 'read -P 0x5a 60M 1M' -c 'read -P 0 61M 1M' >qio.out || fail "qemu-io read -P (X.509): $(cat qio.out)"
grep -q "read 1048576/1048576 bytes" qio.out || fail "qemu-io read (X.509): $(cat qio.out)"

log "fio randwrite with crc32c verify (X.509)"
# fio's nbd engine does not let a URI name local files (tls-certificates=),
# so libnbd finds alice's certificate where it looks by default.
with_default_certs "$PKI/alice" "$TMP/x.sock" timeout 60 fio --name=tls --ioengine=nbd \
  "--uri=nbds+unix:///?socket=$TMP/x.sock" --rw=randwrite --bs=4k --offset=56M --size=4M \
  --verify=crc32c --do_verify=1 --verify_fatal=1 --runtime=20 \
  --output-format=json --output=fio.json >fio.out 2>&1 || fail "fio (X.509) failed: $(cat fio.out)"
cp "$DEFAULT_CERTS_HOME/fio.json" fio.json
expect_eq "fio errors" "$(jq '.jobs[0].error' fio.json)" 0
written=$(jq '.jobs[0].write.io_bytes' fio.json)
((written == 4 * MiB)) || fail "fio wrote $written bytes, want 4 MiB"
verified=$(jq '.jobs[0].read.io_bytes' fio.json)
((verified == 4 * MiB)) || fail "fio verified $verified bytes, want 4 MiB"

log "qemu-img convert and compare (X.509)"
qemu-img convert --object "$(qemu_x509 "$PKI/alice")" --image-opts "$(qemu_nbd_opts "$TMP/x.sock")" \
  -O qcow2 local.qcow2 || fail "qemu-img convert out of the export failed"
qemu-img compare --object "$(qemu_x509 "$PKI/alice")" --image-opts \
  "$(qemu_nbd_opts "$TMP/x.sock")" "driver=qcow2,file.driver=file,file.filename=local.qcow2" ||
  fail "qemu-img compare: the local copy differs from the export"

log "the whole export (X.509)"
nbdcopy "$X509" final.raw || fail "nbdcopy of the final export failed"
cmp -n "$in_size" in.raw final.raw || fail "final: the file copied in changed"
expect_zero final.raw "$in_size" $((56 * MiB - in_size)) "final: between the file and fio's range"
head -c "$MiB" /dev/zero | tr '\0' '\132' >p5a.raw
expect_same final.raw <(cat <(head -c $((60 * MiB)) /dev/zero) p5a.raw) $((60 * MiB)) "$MiB" \
  "final: qemu-io's 0x5a megabyte"
expect_zero final.raw $((61 * MiB)) $((3 * MiB)) "final: after qemu-io's megabyte"
# fio wrote every block of 56..60 MiB once (randwrite covers the range).
if cmp -s -n $((4 * MiB)) <(tail -c +$((56 * MiB + 1)) final.raw) /dev/zero; then
  fail "final: fio's range is still zero"
fi
qemu-img compare -f qcow2 -F raw local.qcow2 final.raw ||
  fail "the qemu-img copy differs from nbdcopy's"
# thindisk's own client (libnbd underneath) against this server.
if [[ $TD != false ]]; then
  log "thindisk info and convert out of the export (X.509)"
  "$TD" info --output=json "$X509" >tdinfo.json || fail "thindisk info of the export failed"
  expect_eq "thindisk info: virtual size" "$(jq '.["virtual-size"]' tdinfo.json)" "$SIZE"
  "$TD" convert -q -O qcow2 "$X509" td.qcow2 || fail "thindisk convert out of the export failed"
  qemu-img compare -q -f qcow2 -F raw td.qcow2 final.raw ||
    fail "thindisk convert: the copy differs from the export"
fi
list_same "X.509, --object" --object "$(qemu_x509 "$PKI/alice")" --tls-creds tls0 \
  --tls-hostname localhost -k "$TMP/x.sock" -- \
  --object "$(qemu_x509 "$PKI/alice")" --tls-creds tls0 -k "$TMP/x.sock"
list_same "X.509, --tls-creds DIR" --object "$(qemu_x509 "$PKI/alice")" --tls-creds tls0 \
  --tls-hostname localhost -k "$TMP/x.sock" -- --tls-creds "$PKI/alice" -k "$TMP/x.sock"
list_refused "no TLS" -k "$TMP/x.sock"
list_refused "mallory's certificate" --tls-creds "$PKI/mallory" -k "$TMP/x.sock"
list_refused "a server's credentials" --object "tls-creds-x509,id=tls0,dir=$PKI/server,endpoint=server" \
  --tls-creds tls0 -k "$TMP/x.sock"
stop_tls "$pid" x

# ---- PSK ------------------------------------------------------------------
start_tls_server "$TLS_SERVER" "$TMP/p.sock" "$img" "$PKI/psk/keys.psk"
pid=$SERVER_PID
PSK=$(psk_uri "$TMP/p.sock" alice "$PKI/psk/keys.psk")

log "nbdinfo and nbdcopy (PSK)"
nbdinfo --json "$PSK" >info.json || fail "nbdinfo with alice's PSK failed"
expect_eq "export size (PSK)" "$(jq '.exports[0]["export-size"]' info.json)" "$SIZE"
expect_eq "TLS in use (PSK)" "$(jq '.TLS' info.json)" true
nbdcopy "$PSK" psk.raw || fail "nbdcopy out of the export (PSK) failed"
cmp psk.raw final.raw || fail "nbdcopy (PSK): the export differs from what X.509 clients wrote"

log "qemu-io (PSK)"
qemu-io --object "$(qemu_psk "$PKI/psk" alice)" --image-opts "$(qemu_nbd_opts "$TMP/p.sock")" \
  -c 'write -P 0xc3 62M 1M' -c flush >qio.out || fail "qemu-io write (PSK) failed"
qemu-io --object "$(qemu_psk "$PKI/psk" alice)" --image-opts "$(qemu_nbd_opts "$TMP/p.sock")" \
  -c 'read -P 0xc3 62M 1M' -c 'read -P 0x5a 60M 1M' >qio.out || fail "qemu-io read -P (PSK): $(cat qio.out)"
[[ $(grep -c "read 1048576/1048576 bytes" qio.out) == 2 ]] || fail "qemu-io read (PSK): $(cat qio.out)"
nbdcopy "$PSK" psk2.raw || fail "nbdcopy out of the export (PSK) failed"
head -c "$MiB" /dev/zero | tr '\0' '\303' >pc3.raw
expect_same psk2.raw <(cat <(head -c $((62 * MiB)) /dev/zero) pc3.raw) $((62 * MiB)) "$MiB" \
  "PSK: qemu-io's 0xc3 megabyte"
expect_same psk2.raw final.raw 0 $((62 * MiB)) "PSK: the export before 62 MiB changed"
if [[ $TD != false ]]; then
  log "thindisk convert out of the export (PSK)"
  "$TD" convert -q -O raw "$PSK" td.raw || fail "thindisk convert (PSK) failed"
  cmp td.raw psk2.raw || fail "thindisk convert (PSK): the copy differs from the export"
fi
list_same "PSK" --object "$(qemu_psk "$PKI/psk" alice)" --tls-creds tls0 -k "$TMP/p.sock" -- \
  --object "$(qemu_psk "$PKI/psk" alice)" --tls-creds tls0 -k "$TMP/p.sock"
list_refused "a wrong PSK" --object "$(qemu_psk "$PKI/psk-wrong" alice)" --tls-creds tls0 -k "$TMP/p.sock"
stop_tls "$pid" p

# ---- Socket activation (systemd's LISTEN_FDS) over TCP ------------------
port=$(free_port)
act=$(image_for_server activated 64M)
start_tls_server "$TLS_SERVER" "sa:$port" "$act" "$PKI/server"
pid=$SERVER_PID
SA="nbds://localhost:$port/?tls-certificates=$PKI/alice"
log "socket activation: nbdinfo (X.509)"
nbdinfo --json "$SA" >info.json || fail "nbdinfo through the activated socket failed"
expect_eq "TLS in use (socket activation)" "$(jq '.TLS' info.json)" true
if nbdinfo --size "nbd://localhost:$port/" >/dev/null 2>&1; then
  fail "the activated server serves plaintext clients"
fi
log "socket activation: qemu-io (X.509)"
qemu-io --object "$(qemu_x509 "$PKI/alice")" --image-opts "$(qemu_nbd_tcp_opts "$port")" \
  -c 'write -P 0x3e 32M 1M' -c 'read -P 0x3e 32M 1M' >qio.out || fail "qemu-io (socket activation): $(cat qio.out)"
if [[ $TD != false ]]; then
  # thindisk's benchmark client over TLS: W2 writes 8 MiB in 4 KiB
  # requests, 16 in flight, W4 in 1 MiB requests; its report counts them.
  log "thindisk bench --uri nbds:// (socket activation)"
  timeout 60 "$TD" bench --uri "$SA" --workloads W2,W4 --size 8M --qd 16 -q --output=json >bench.json ||
    fail "thindisk bench over TLS failed"
  expect_eq "bench: W2 4 KiB writes" "$(jq '.results[] | select(.id == "W2") | .ops' bench.json)" 2048
  expect_eq "bench: W4 bytes" "$(jq '.results[] | select(.id == "W4") | .bytes' bench.json)" $((8 * MiB))
fi
nbdcopy "$SA" act.raw || fail "nbdcopy out of the activated server failed"
expect_same act.raw <(cat <(head -c $((32 * MiB)) /dev/zero) <(head -c "$MiB" /dev/zero | tr '\0' '\076')) \
  $((32 * MiB)) "$MiB" "socket activation: qemu-io's 0x3e megabyte"
list_same "TCP, the server's name checked" --object "$(qemu_x509 "$PKI/alice")" --tls-creds tls0 \
  -b 127.0.0.1 -p "$port" -- --object "$(qemu_x509 "$PKI/alice")" --tls-creds tls0 \
  --tls-hostname 127.0.0.1 -b 127.0.0.1 -p "$port"
list_refused "a name the certificate does not carry" --tls-creds "$PKI/alice" \
  --tls-hostname nbd.invalid -b 127.0.0.1 -p "$port"
stop_tls "$pid" "sa-$port"

# ---- qemu-nbd's own TLS command line (thindisk takes it as it is) -------
if [[ $TLS_SERVER == nbdkit ]]; then
  log "SKIPPED for nbdkit: qemu-nbd's command line"
else
  server=("$TD" serve)
  [[ $TLS_SERVER == thindisk ]] || server=(qemu-nbd)
  n=0
  for object in "tls-creds-x509,id=tls0,dir=$PKI/server,endpoint=server,verify-peer=on" \
    "tls-creds-psk,id=tls0,dir=$PKI/psk,endpoint=server"; do
    n=$((n + 1))
    log "qemu-nbd's line: --object ${object%%,*} --tls-creds tls0"
    spawn "q$n" "${server[@]}" --object "$object" --tls-creds tls0 -k "$TMP/q$n.sock" -f qcow2 -t "$img"
    wait_for_socket "$TMP/q$n.sock"
    pid=$SERVER_PID
    client=$(qemu_x509 "$PKI/alice")
    [[ $object == tls-creds-x509* ]] || client=$(qemu_psk "$PKI/psk" alice)
    qemu-io --object "$client" --image-opts "$(qemu_nbd_opts "$TMP/q$n.sock")" \
      -c 'read -P 0xc3 62M 1M' -c 'read -P 0x5a 60M 1M' >qio.out ||
      fail "qemu-io through qemu-nbd's line ($object): $(cat qio.out)"
    [[ $(grep -c "read 1048576/1048576 bytes" qio.out) == 2 ]] || fail "qemu-io ($object): $(cat qio.out)"
    if nbdinfo --size "nbd+unix:///?socket=$TMP/q$n.sock" >/dev/null 2>&1; then
      fail "qemu-nbd's line ($object) serves plaintext clients"
    fi
    stop_tls "$pid" "q$n"
  done
fi
log "clients ($TLS_SERVER): ok"

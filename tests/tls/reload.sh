#!/usr/bin/env bash
# Rotating credentials without dropping served disks: thindisk re-reads
# them on SIGHUP. A session opened before the reload keeps working (its
# writes land and read back); new clients need the new credentials (a
# client certificate of the old CA is refused once ca-cert.pem names the
# new one); a reload that cannot read its files keeps the old credentials
# and says so; SIGTERM then ends the server cleanly with the TLS session
# still open; a server certificate that expires while served is refused by
# clients until a SIGHUP rotates in a fresh one. thindisk only (the
# reference servers have no reload).
source "$(dirname "$0")/lib.sh"
[[ $TLS_SERVER == thindisk ]] || { echo "reload: thindisk only"; exit 77; }
require_tool nbdinfo qemu-io qemu-img mkfifo
require_tls_server

make_pki pki
old=$PKI
# A second, unrelated PKI: the credentials rotated to.
make_pki pki2
new=$PKI
mkdir live
cp "$old"/server/*.pem live/

qemu-img create -q -f qcow2 disk.qcow2 64M
start_tls_server thindisk "$TMP/s.sock" disk.qcow2 "$TMP/live"
pid=$SERVER_PID
nbdinfo --size "$(tls_uri "$TMP/s.sock" "$old/alice")" >/dev/null || fail "old credentials refused before the reload"

# A session that stays open across the reload: qemu-io reading commands
# from a fifo (one connection for all of them).
mkfifo cmds
qemu-io --object "$(qemu_x509 "$old/alice")" --image-opts "$(qemu_nbd_opts "$TMP/s.sock")" \
  <cmds >qio.out 2>&1 &
qio=$!
exec 3>cmds
# wait_qio N: qemu-io has answered N commands (within 10 s).
wait_qio() {
  local i
  for ((i = 0; i < 100; i++)); do
    (($(grep -o "wrote \|read \|failed" qio.out | wc -l) >= $1)) && return 0
    sleep 0.1
  done
  fail "qemu-io answered fewer than $1 commands: $(cat qio.out)"
}
# qio CMD: sends one command and waits for its answer (qemu-io leaves a
# second line that arrived with the first unread until more input comes).
QIO_SENT=0
qio() {
  echo "$1" >&3
  wait_qio $((++QIO_SENT))
}
qio "write -P 0x5c 1M 256k"

# wait_log_in FILE TEXT: the server log FILE says TEXT within 10 s.
wait_log_in() {
  local i
  for ((i = 0; i < 100; i++)); do
    grep -q -- "$2" "$1" && return 0
    sleep 0.1
  done
  cat "$1" >&2
  fail "the server never logged '$2'"
}
# wait_log TEXT: the first server's log (s.err) says TEXT.
wait_log() { wait_log_in s.err "$1"; }

log "rotate to a new CA, server certificate and key; SIGHUP"
cp "$new"/server/*.pem live/
kill -HUP "$pid"
wait_log "TLS credentials reloaded"
kill -0 "$pid" || fail "SIGHUP ended the server"
nbdinfo --size "$(tls_uri "$TMP/s.sock" "$new/alice")" >/dev/null 2>new.err ||
  fail "the new credentials are refused after the reload: $(cat new.err)"
if nbdinfo --size "$(tls_uri "$TMP/s.sock" "$old/alice")" >/dev/null 2>old.err; then
  fail "a client certificate of the old CA is still accepted after the reload"
fi

log "the session opened before the reload goes on"
qio "read -P 0x5c 1M 256k"
qio "write -P 0x6d 2M 64k"
qio "read -P 0x6d 2M 64k"

log "a reload that cannot read its key keeps the old credentials"
echo "not a key" >live/server-key.pem
kill -HUP "$pid"
wait_log "TLS credentials not reloaded"
kill -0 "$pid" || fail "a failed reload ended the server"
nbdinfo --size "$(tls_uri "$TMP/s.sock" "$new/alice")" >/dev/null 2>kept.err ||
  fail "after a failed reload the credentials in use were lost: $(cat kept.err)"

log "SIGTERM with the TLS session open: a clean exit"
stop_tls "$pid" s
echo quit >&3
exec 3>&-
wait "$qio" || true
grep -q "failed" qio.out && fail "the open session failed: $(cat qio.out)"
[[ $(grep -o "read [0-9]" qio.out | wc -l) == 2 ]] ||
  fail "the open session did not read back both writes: $(cat qio.out)"
qemu-io -f qcow2 -r -c "read -P 0x5c 1M 256k" -c "read -P 0x6d 2M 64k" disk.qcow2 >final.out 2>&1 ||
  fail "the writes of the open session are not in the image: $(cat final.out)"
log "a certificate that expires while served: clients refuse it; SIGHUP rotates in a fresh one"
# Signed by the new CA (make_pki pki2 left PKI_CA there), valid for a few
# seconds from now: thindisk starts with it (it refuses to
# start with an expired one), then it expires under the running server.
# libnbd checks the server's certificate over TCP only (tests/tls/refusals.sh).
expires=$(date -u -d '+4 seconds' '+%s')
pki_server "$TMP/soon" "activation_date = \"$(date -u -d '1 day ago' '+%Y-%m-%d %H:%M:%S')\"" \
  "expiration_date = \"$(date -u -d "@$expires" '+%Y-%m-%d %H:%M:%S')\""
mkdir live2
cp "$TMP"/soon/*.pem live2/
port=$(free_port)
start_tls_server thindisk "tcp:$port" disk.qcow2 "$TMP/live2"
pid=$SERVER_PID
uri="nbds://localhost:$port/?tls-certificates=$new/alice"
nbdinfo --size "$uri" >/dev/null 2>soon.err || fail "the certificate was refused before it expired: $(cat soon.err)"
while (($(date +%s) <= expires)); do sleep 0.2; done
if nbdinfo --size "$uri" >/dev/null 2>late.err; then
  fail "nbdinfo accepted the server certificate after it expired"
fi
grep -qi "certificate" late.err || fail "the client's refusal does not blame the certificate: $(cat late.err)"
log "nbdinfo refused the expired certificate: $(head -1 late.err)"
kill -0 "$pid" || fail "the server died under clients refusing its certificate"
cp "$new"/server/*.pem live2/
kill -HUP "$pid"
wait_log_in "tcp-$port.err" "TLS credentials reloaded"
nbdinfo --size "$uri" >/dev/null 2>fresh.err ||
  fail "the fresh certificate is refused after the reload: $(cat fresh.err)"
stop_tls "$pid" "tcp-$port"
log "reload: ok"

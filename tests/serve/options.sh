#!/usr/bin/env bash
# `thindisk serve` options through real clients: --read-only, -q, --pid-file,
# TCP (--bind/--port), --max-connections, --stdio, socket activation,
# --cache=none, --aio=threads|io_uring, --discard, --detect-zeroes, --cache-size,
# --threads, --busy-poll, --prefetch, SIGINT, and command-line errors.
source "$(dirname "$0")/lib.sh"
require_tool nbdinfo qemu-io qemu-img jq python3

"$TD" create -f qcow2 disk.qcow2 32M >/dev/null
qemu-io -f qcow2 disk.qcow2 -c 'write -P 0x5a 0 1M' >/dev/null

run_ok() {  # run_ok WHAT CMD...: must exit 0 and report no qemu-io failure
  local what=$1
  shift
  "$@" >ok.out 2>&1 || { cat ok.out >&2; fail "$what"; }
  if grep -Eq "verification failed|error" ok.out; then cat ok.out >&2; fail "$what"; fi
}

log "--read-only, -q, --pid-file"
serve_unix ro ro.sock --read-only -q --pid-file "$TMP/ro.pid" disk.qcow2
pid=$SERVER_PID
[[ -s ro.out ]] && fail "-q printed: $(cat ro.out)"
# The pid file is written once the server listens, as its socket appears:
# either may come first (as with qemu-nbd), so it gets 10 s.
for ((i = 0; i < 200; i++)); do
  [[ -s ro.pid ]] && break
  sleep 0.05
done
expect_eq "pid file" "$(cat ro.pid)" "$pid"
expect_eq "read-only flag" "$(nbdinfo --json "$(uri ro.sock)" | jq '.exports[0].is_read_only')" true
if qemu-io -f raw "$(uri ro.sock)" -c 'write 0 4k' 2>&1 | grep -q "^wrote"; then
  fail "write to --read-only export succeeded"
fi
run_ok "read from read-only export" qemu-io -r -f raw "$(uri ro.sock)" -c 'read -P 0x5a 0 1M'
stop_server "$pid" ro
[[ -e ro.pid ]] && fail "pid file not removed at exit"

log "TCP on 127.0.0.1 with a kernel-chosen port; SIGINT"
start_server tcp --bind 127.0.0.1 --port 0 disk.qcow2
pid=$SERVER_PID
for ((i = 0; i < 100; i++)); do grep -q '^nbd://' tcp.out 2>/dev/null && break; sleep 0.05; done
tcp_uri=$(head -1 tcp.out)
[[ $tcp_uri =~ ^nbd://127\.0\.0\.1:[0-9]+/$ ]] || fail "TCP URI not printed: '$tcp_uri'"
[[ $tcp_uri == nbd://127.0.0.1:0/ ]] && fail "URI shows port 0"
expect_eq "size over TCP" "$(nbdinfo --size "$tcp_uri")" 33554432
kill -INT "$pid"
rc=0
timeout 30 tail --pid="$pid" -f /dev/null || fail "no exit after SIGINT"
wait "$pid" || rc=$?
expect_eq "exit status after SIGINT" "$rc" 0

log "--max-connections 1: a second client waits until the first leaves"
serve_unix mc mc.sock --max-connections 1 disk.qcow2
pid=$SERVER_PID
# The holder must be a session (past the handshake): connections still
# negotiating are counted apart (docs/serve-limits.md).
python3 -c '
import socket, struct, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
def recv(n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b)); assert c, "server hung up"; b += c
    return b
recv(18)  # server greeting
s.sendall(struct.pack(">I", 3))  # fixed newstyle, no zeroes
s.sendall(struct.pack(">QIIIH", 0x49484156454F5054, 7, 6, 0, 0))  # NBD_OPT_GO "", no info
while struct.unpack(">QIII", h := recv(20))[2] != 1:  # replies until NBD_REP_ACK
    recv(struct.unpack(">QIII", h)[3])
open(sys.argv[3], "w").close()
time.sleep(float(sys.argv[2]))' "$TMP/mc.sock" 3 "$TMP/holding" &
holder=$!
for ((i = 0; i < 200; i++)); do [[ -e holding ]] && break; sleep 0.05; done
[[ -e holding ]] || fail "holding client did not connect"
start=$(date +%s%N)
expect_eq "second client size" "$(timeout 20 nbdinfo --size "$(uri mc.sock)")" 33554432
waited_ms=$((($(date +%s%N) - start) / 1000000))
wait "$holder"
((waited_ms > 1500)) ||
  fail "second client was served at once (${waited_ms} ms) despite --max-connections 1"
stop_server "$pid" mc

log "--stdio: one server process per connection, inetd-style"
# No stock client starts a server on its stdin/stdout, so a small inetd
# (python3) listens on a Unix socket and runs `serve --stdio` with each
# accepted connection as its stdin and stdout; nbdinfo and qemu-io connect
# there. inetd.rc gets one exit status per connection.
cp disk.qcow2 s.qcow2
spawn inetd python3 -c '
import socket, subprocess, sys
sock, conns, cmd = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
s = socket.socket(socket.AF_UNIX); s.bind(sock); s.listen(1)
with open("inetd.rc", "w") as rc:
    for _ in range(conns):
        c, _ = s.accept()
        with open("stdio.err", "a") as err:
            p = subprocess.Popen(cmd, stdin=c, stdout=c, stderr=err)
        c.close()
        rc.write("%d\n" % p.wait()); rc.flush()' "$TMP/stdio.sock" 3 "$TD" serve --stdio s.qcow2
inetd=$SERVER_PID
wait_for_socket stdio.sock
expect_eq "--stdio size (nbdinfo)" "$(timeout 30 nbdinfo --size "$(uri stdio.sock)")" 33554432
run_ok "--stdio write and read (qemu-io)" timeout 30 qemu-io -f raw "$(uri stdio.sock)" \
  -c 'write -P 0x77 8M 64k' -c flush -c 'read -P 0x5a 0 1M' -c 'read -P 0x77 8M 64k'
run_ok "--stdio read after reconnect (qemu-io)" timeout 30 qemu-io -r -f raw "$(uri stdio.sock)" \
  -c 'read -P 0x77 8M 64k'
timeout 30 tail --pid="$inetd" -f /dev/null || fail "--stdio servers did not exit with their clients"
wait "$inetd" || fail "the inetd helper failed: $(cat inetd.err stdio.err)"
forget_server "$inetd"
expect_eq "--stdio exit statuses" "$(tr '\n' ' ' <inetd.rc)" "0 0 0 "
check_clean s.qcow2
if [[ -n ${HOSTILE_CLIENT:-} && -x ${HOSTILE_CLIENT:-} ]]; then
  # libnbd's nbd_connect_command: the server on the client's own pipes.
  got=$(timeout 30 "$HOSTILE_CLIENT" --stdio "$TD" serve --stdio disk.qcow2) || fail "--stdio client failed"
  expect_eq "--stdio size and first byte (libnbd connect_command)" "$got" "33554432 90"
fi

log "socket activation (nbdinfo [ CMD ])"
expect_eq "activated size" "$(timeout 30 nbdinfo --size -- [ "$TD" serve -q disk.qcow2 ])" 33554432

log "--cache=none, --aio=threads|io_uring, --threads 1, --cache-size, --busy-poll, --prefetch"
for opts in "--cache=none" "--aio=threads" "--cache=none --aio=io_uring" \
    "--threads 1 --cache-size 64k" "--cache=unsafe" "--busy-poll 0" "--busy-poll 5000" \
    "--prefetch off"; do
  cp disk.qcow2 m.qcow2
  rm -f m.sock
  # shellcheck disable=SC2086
  serve_unix m m.sock $opts m.qcow2
  pid=$SERVER_PID
  run_ok "$opts: I/O" qemu-io -f raw "$(uri m.sock)" -c 'write -P 0x61 1M 3M' \
    -c 'write -P 0x62 12345 6789' -c 'aio_write -P 0x63 8M 64k' -c aio_flush -c flush \
    -c 'read -P 0x5a 0 12k' -c 'read -P 0x62 12345 6789' -c 'read -P 0x61 2M 2M' \
    -c 'read -P 0x63 8M 64k'
  # --aio=threads: no ring; otherwise none is left once the client is gone.
  if [[ $opts == *threads* ]]; then expect_no_uring "$pid" "$opts"; else
    expect_rings_at_most "$pid" 0 "$opts, its client gone"; fi
  stop_server "$pid" m
  check_clean m.qcow2
  run_ok "$opts: content after close" qemu-io -f qcow2 m.qcow2 -c 'read -P 0x61 2M 2M' \
    -c 'read -P 0x62 12345 6789' -c 'read -P 0x63 8M 64k'
done

log "--discard=ignore keeps data; default discard unmaps"
for mode in ignore unmap; do
  cp disk.qcow2 d.qcow2
  rm -f d.sock
  serve_unix d d.sock --discard=$mode d.qcow2
  pid=$SERVER_PID
  run_ok "discard ($mode)" qemu-io -f raw "$(uri d.sock)" -c 'discard 0 512k'
  type=$(nbdinfo --map --json "$(uri d.sock)" | jq '.[0].type')
  stop_server "$pid" d
  if [[ $mode == ignore ]]; then
    expect_eq "map after ignored discard" "$type" 0
    run_ok "data kept" qemu-io -f qcow2 d.qcow2 -c 'read -P 0x5a 0 512k'
  else
    expect_eq "map after discard" "$type" 3
    run_ok "discarded reads zero" qemu-io -f qcow2 d.qcow2 -c 'read -P 0 0 512k'
  fi
done

log "--detect-zeroes"
for mode in off on unmap; do
  cp disk.qcow2 z.qcow2
  rm -f z.sock
  serve_unix z z.sock --detect-zeroes=$mode z.qcow2
  pid=$SERVER_PID
  run_ok "zero write ($mode)" qemu-io -f raw "$(uri z.sock)" -c 'write -P 0 0 512k' \
    -c 'write -P 0 4M 512k'
  nbdinfo --map --json "$(uri z.sock)" >z.json
  stop_server "$pid" z
  run_ok "zeros read back ($mode)" qemu-io -f qcow2 z.qcow2 -c 'read -P 0 0 512k' \
    -c 'read -P 0x5a 512k 512k'
  zero_bit=$(jq '[.[] | select(.offset == 0)][0].type' z.json)
  case $mode in
    off) expect_eq "detect-zeroes=off stores data" "$zero_bit" 0 ;;
    on) (((zero_bit & 2) == 2)) || fail "detect-zeroes=on: range not reported zero (type $zero_bit)" ;;
    unmap) expect_eq "detect-zeroes=unmap makes a hole" "$zero_bit" 3 ;;
  esac
  check_clean z.qcow2
done

log "command-line errors"
# serve_refused WHAT PATTERN ARGS...: `thindisk serve ARGS` exits 1 within
# 10 s, saying something that matches PATTERN.
serve_refused() {
  local what=$1 pattern=$2 rc=0
  shift 2
  timeout 10 "$TD" serve -k "$TMP/never.sock" "$@" >err.out 2>&1 || rc=$?
  expect_eq "exit status of $what" "$rc" 1
  grep -q -- "$pattern" err.out || fail "$what: $(cat err.out)"
}
for bad in "" "--export noequals" "--stdio -k x.sock disk.qcow2" "nosuch.qcow2" \
    "--cache=bogus disk.qcow2" "--cache-size junk disk.qcow2" "--port 70000 disk.qcow2" \
    "--busy-poll -1 disk.qcow2" "--busy-poll 20000 disk.qcow2" "--busy-poll x disk.qcow2" \
    "--prefetch maybe disk.qcow2"; do
  # shellcheck disable=SC2086
  serve_refused "'serve $bad'" thindisk $bad
done
# One image written through two exports (the second name a link to it):
# refused naming both exports; read-only, both may serve it.
ln -s disk.qcow2 link.qcow2
serve_refused "two writable exports of one image" "exports 'a' and 'b' serve one image" \
  --export a=disk.qcow2 --export b=link.qcow2
serve_unix two two.sock -r --export a=disk.qcow2 --export b=link.qcow2
run_ok "two read-only exports of one image" qemu-io -r -f raw \
  "nbd+unix:///b?socket=$TMP/two.sock" -c 'read -P 0x5a 0 1M'
stop_server "$SERVER_PID" two
# Nor an export that writes another's backing file (qemu-img's overlay):
# that guest's disk would change under it. The base is left as it was.
qemu-img create -q -f qcow2 -b disk.qcow2 -F qcow2 over.qcow2
sum=$(sha256sum disk.qcow2)
serve_refused "an overlay and its writable base" \
  "export 'base' (disk.qcow2) is a backing file of export 'top'" \
  --export top=over.qcow2 --export base=disk.qcow2
expect_eq "the base after the refusal" "$(sha256sum disk.qcow2)" "$sum"
serve_unix chain chain.sock -r --export base=disk.qcow2 --export top=over.qcow2
run_ok "a read-only base beside its overlay" qemu-io -r -f raw \
  "nbd+unix:///top?socket=$TMP/chain.sock" -c 'read -P 0x5a 0 1M'
stop_server "$SERVER_PID" chain
log "options: ok"

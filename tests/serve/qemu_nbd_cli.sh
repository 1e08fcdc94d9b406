#!/usr/bin/env bash
# qemu-nbd command lines run as written with `thindisk serve` in qemu-nbd's
# place (docs/qemu-nbd.md): clients must see what they see from qemu-nbd 7.2
# serving the same image with the same line. Compared: nbdinfo --json's
# export fields, `qemu-img map --output=json` of the URI and qemu-io pattern
# reads. Covered: the seed's -n --aio=native, virtnbdbackup's line (-r
# --format -x -k -t -e 2 --fork --detect-zeroes=on --pid-file), -t --fork
# --pid-file, -s (image byte-identical afterwards), -l SNAPSHOT, -o OFFSET,
# --image-opts, -L against both servers, and the refused options (-c, -d,
# -B of a missing bitmap, non-TLS --object, bad TLS objects): one clear
# line and a non-zero exit. TLS itself is tests/tls. virtnbdbackup's line
# exports a dirty bitmap (--bitmap): its map must match qemu-nbd's.
source "$(dirname "$0")/lib.sh"
require_tool qemu-nbd qemu-img qemu-io nbdinfo jq cmp

# The nbdinfo --json fields both servers must agree on.
FIELDS='.exports[] | {name: .["export-name"], description, size: .["export-size"],
  is_read_only, can_flush, can_fua, can_trim, can_zero}'

qemu-img create -f qcow2 disk.qcow2 16M >/dev/null
# A persistent bitmap that sees the writes, as virtnbdbackup's checkpoints do.
qemu-img bitmap --add disk.qcow2 virtnbdbackup.0
qemu-io -f qcow2 disk.qcow2 -c 'write -P 0x11 0 1M' -c 'write -P 0x22 4M 512k' \
  -c 'write -z 6M 1M' >/dev/null

# ---- Helpers ---------------------------------------------------------------

# view URI OUT: the client's picture of the export at URI: nbdinfo's fields
# and qemu-img map's extents, in OUT.info and OUT.map.
view() {
  nbdinfo --json "$1" | jq -S "$FIELDS" >"$2.info" || fail "nbdinfo $1"
  qemu-img map --output=json -f raw "$1" | jq -S -c . >"$2.map" || fail "qemu-img map $1"
}

# same WHAT A B: the views A and B (from view) are identical.
same() {
  cmp -s "$2.info" "$3.info" || fail "$1: nbdinfo differs
 thindisk: $(cat "$2.info")
 qemu-nbd: $(cat "$3.info")"
  cmp -s "$2.map" "$3.map" || fail "$1: qemu-img map differs
 thindisk: $(cat "$2.map")
 qemu-nbd: $(cat "$3.map")"
}

# reads_ok WHAT URI QEMU-IO-COMMANDS...: every read matches its pattern.
reads_ok() {
  local what=$1 uri=$2 c args=()
  shift 2
  for c in "$@"; do args+=(-c "$c"); done
  qemu-io -r -f raw "$uri" "${args[@]}" >reads.out 2>&1 || { cat reads.out >&2; fail "$what: qemu-io"; }
  if grep -Eq "verification failed|error|Pattern" reads.out; then cat reads.out >&2; fail "$what"; fi
}

# differential WHAT SOURCE COPY ARGS...: serves a fresh copy of SOURCE
# (named t-COPY) with `thindisk serve ARGS` and another (q-COPY) with
# `qemu-nbd ARGS`, on their own sockets; both must look the same to
# clients. ARGS name the image as @IMG@.
differential() {
  local what=$1 src=$2 img=$3 a args_t=() args_q=()
  shift 3
  cp "$src" "t-$img"
  cp "$src" "q-$img"
  for a in "$@"; do
    args_t+=("${a//@IMG@/t-$img}")
    args_q+=("${a//@IMG@/q-$img}")
  done
  rm -f t.sock q.sock # qemu-nbd leaves its socket behind when killed
  serve_unix "t-$what" "$TMP/t.sock" "${args_t[@]}"
  local tpid=$SERVER_PID
  qemu_nbd_unix "q-$what" "$TMP/q.sock" "${args_q[@]}"
  local qpid=$SERVER_PID
  view "nbd+unix:///?socket=$TMP/t.sock" t
  view "nbd+unix:///?socket=$TMP/q.sock" q
  same "$what" t q
  stop_server "$tpid" "t-$what"
  kill_server "$qpid"
}

# refused WHAT WORD ARGS...: `thindisk serve ARGS` exits non-zero with one
# line on stderr that contains WORD.
refused() {
  local what=$1 word=$2 rc=0
  shift 2
  timeout 10 "$TD" serve "$@" >refused.out 2>refused.err || rc=$?
  ((rc != 0)) || fail "$what: exit status 0"
  ((rc != 124)) || fail "$what: still running after 10 s"
  expect_eq "$what: stderr lines" "$(wc -l <refused.err)" 1
  grep -q -- "$word" refused.err || fail "$what: '$(cat refused.err)' does not say '$word'"
  [[ -s refused.out ]] && fail "$what: printed on stdout: $(cat refused.out)"
  return 0
}

# ---- The seed's line: -n --aio=native ---------------------------------------
log "seed: -n --aio=native -f qcow2 -t"
differential seed disk.qcow2 seed.qcow2 -n --aio=native -f qcow2 -t @IMG@

# same_writes WHAT ARGS...: the same writes through `thindisk serve ARGS`
# and `qemu-nbd ARGS`, each on its own copy of disk.qcow2, leave images
# with the same content, and thindisk's is clean.
same_writes() {
  local what=$1 who
  shift
  for who in t q; do cp disk.qcow2 "w-$who.qcow2"; done
  rm -f t.sock q.sock
  serve_unix wt "$TMP/t.sock" "$@" -f qcow2 -t "$TMP/w-t.qcow2"
  local tpid=$SERVER_PID
  qemu_nbd_unix wq "$TMP/q.sock" "$@" -f qcow2 -t "$TMP/w-q.qcow2"
  local qpid=$SERVER_PID
  for who in t q; do
    qemu-io -f raw "nbd+unix:///?socket=$TMP/$who.sock" -c 'write -P 0x33 512k 1M' \
      -c 'write -z 4M 64k' -c 'write -P 0 8M 128k' >/dev/null || fail "$what: write through $who"
  done
  stop_server "$tpid" wt
  kill_server "$qpid"
  qemu-img compare -f qcow2 -F qcow2 w-t.qcow2 w-q.qcow2 >/dev/null ||
    fail "$what: the images differ after the same writes"
  check_clean w-t.qcow2
}
same_writes "-n --aio=native" -n --aio=native
for mode in none writeback writethrough directsync unsafe; do
  log "--cache=$mode"
  same_writes "--cache=$mode" --cache=$mode --detect-zeroes=on
done

# ---- virtnbdbackup's line ------------------------------------------------------
log "virtnbdbackup: -r --format=qcow2 -x NAME --bitmap=NAME FILE -k SOCK -t -e 2 --fork --detect-zeroes=on --pid-file"
cp disk.qcow2 vb-t.qcow2
cp disk.qcow2 vb-q.qcow2
timeout 30 "$TD" serve -r --format=qcow2 -x sda --bitmap=virtnbdbackup.0 vb-t.qcow2 \
  -k "$TMP/vt.sock" -t -e 2 --fork --detect-zeroes=on --pid-file="$TMP/vt.pid" >vt.out 2>vt.err ||
  { cat vt.err >&2; fail "virtnbdbackup line: thindisk exited non-zero"; }
timeout 30 qemu-nbd -r --format=qcow2 -x sda --bitmap=virtnbdbackup.0 vb-q.qcow2 \
  -k "$TMP/vq.sock" -t -e 2 --fork --detect-zeroes=on --pid-file="$TMP/vq.pid" ||
  fail "virtnbdbackup line: qemu-nbd failed"
tpid=$(cat vt.pid)
qpid=$(cat vq.pid)
SERVER_PIDS+=("$tpid" "$qpid")
kill -0 "$tpid" || fail "--fork: pid file names no live process"
[[ -S vt.sock ]] || fail "--fork returned before the socket existed"
view "nbd+unix:///sda?socket=$TMP/vt.sock" t
view "nbd+unix:///sda?socket=$TMP/vq.sock" q
same virtnbdbackup t q
# What virtnbdbackup reads to back up only what changed: the same map.
for x in t q; do
  nbdinfo --map=qemu:dirty-bitmap:virtnbdbackup.0 "nbd+unix:///sda?socket=$TMP/v$x.sock" \
    >"bm-$x.map" || fail "virtnbdbackup: the dirty bitmap map ($x)"
done
cmp -s bm-t.map bm-q.map || fail "virtnbdbackup: the dirty bitmaps differ
 thindisk: $(cat bm-t.map)
 qemu-nbd: $(cat bm-q.map)"
grep -q "dirty" bm-t.map || fail "virtnbdbackup: the bitmap shows no write: $(cat bm-t.map)"
expect_eq "virtnbdbackup: read-only" "$(jq .is_read_only t.info)" true
reads_ok virtnbdbackup "nbd+unix:///sda?socket=$TMP/vt.sock" 'read -P 0x11 0 1M' \
  'read -P 0x22 4M 512k' 'read -P 0 6M 1M'
# -t: still serving after those clients left.
expect_eq "-t: a later client" "$(nbdinfo --size "nbd+unix:///sda?socket=$TMP/vt.sock")" 16777216
kill -TERM "$tpid" "$qpid"
for ((i = 0; i < 200; i++)); do
  kill -0 "$tpid" 2>/dev/null || kill -0 "$qpid" 2>/dev/null || break
  sleep 0.05
done
kill -0 "$tpid" 2>/dev/null && fail "forked thindisk did not exit on SIGTERM"
[[ -e vt.pid ]] && fail "forked thindisk left its pid file"

# ---- -t --fork --pid-file: failures reach the caller --------------------------
log "--fork: a server that cannot start fails the command with its reason"
rc=0
timeout 30 "$TD" serve -t --fork --pid-file "$TMP/f.pid" -k "$TMP/f.sock" nosuch.qcow2 \
  >f.out 2>f.err || rc=$?
((rc != 0 && rc != 124)) || fail "--fork with a missing image: exit status $rc"
grep -q "nosuch.qcow2" f.err || fail "--fork error does not name the image: $(cat f.err)"
[[ -e f.pid || -e f.sock ]] && fail "--fork failure left a pid file or socket"
# Its stdout is released once it serves: $(...) returns with the URI.
out=$(timeout 30 "$TD" serve -t --fork --pid-file "$TMP/g.pid" -k "$TMP/g.sock" disk.qcow2 2>g.err) ||
  { cat g.err >&2; fail "--fork under \$(...)"; }
gpid=$(cat g.pid)
SERVER_PIDS+=("$gpid")
expect_eq "--fork prints the URI" "$out" "nbd+unix:///?socket=$TMP/g.sock"
expect_eq "--fork export answers" "$(nbdinfo --size "$out")" 16777216
kill -TERM "$gpid"

# ---- -s: writes go to a temporary overlay; the image stays byte-identical ----
log "-s/--snapshot"
mkdir scratch
cp disk.qcow2 s.qcow2
cp s.qcow2 s.before
TMPDIR=$TMP/scratch serve_unix s "$TMP/s.sock" -s -f qcow2 s.qcow2
spid=$SERVER_PID
[[ -z $(ls scratch) ]] || fail "-s left its overlay visible in TMPDIR: $(ls scratch)"
qemu-io -f raw "nbd+unix:///?socket=$TMP/s.sock" -c 'write -P 0x44 0 64k' -c 'discard 4M 512k' \
  -c 'write -P 0x55 10M 1M' >/dev/null || fail "-s: writing through the export"
reads_ok "-s: the writes read back" "nbd+unix:///?socket=$TMP/s.sock" 'read -P 0x44 0 64k' \
  'read -P 0x11 64k 960k' 'read -P 0 4M 512k' 'read -P 0x55 10M 1M'
stop_server "$spid" s
cmp s.qcow2 s.before || fail "-s: the image changed"
[[ -z $(ls scratch) ]] || fail "-s left files behind: $(ls scratch)"
# qemu-nbd -s shows the same picture after the same writes.
differential snapshot disk.qcow2 sq.qcow2 -s -f qcow2 -t @IMG@
# A failing -s start leaves nothing either.
rc=0
TMPDIR=$TMP/scratch "$TD" serve -s -k "$TMP/s2.sock" -f raw -o 999999999 s.qcow2 2>s2.err || rc=$?
((rc != 0)) || fail "-s with an offset past the end started"
[[ -z $(ls scratch) ]] || fail "-s left files behind after an error: $(ls scratch)"
cmp s.qcow2 s.before || fail "-s error path: the image changed"

# ---- -l: an internal snapshot, read-only ---------------------------------------
log "-l/--load-snapshot"
cp disk.qcow2 snap.qcow2
qemu-img snapshot -c before snap.qcow2
qemu-io -f qcow2 snap.qcow2 -c 'write -P 0x66 0 2M' >/dev/null
for sel in before snapshot.name=before snapshot.id=1 "snapshot.id=1,snapshot.name=before"; do
  differential "-l $sel" snap.qcow2 l.qcow2 -l "$sel" -f qcow2 -t @IMG@
done
serve_unix l "$TMP/l.sock" -l before -t snap.qcow2
lpid=$SERVER_PID
expect_eq "-l: read-only" "$(nbdinfo --json "nbd+unix:///?socket=$TMP/l.sock" | jq '.exports[0].is_read_only')" true
reads_ok "-l: the snapshot's data" "nbd+unix:///?socket=$TMP/l.sock" 'read -P 0x11 0 1M' \
  'read -P 0 1M 3M' 'read -P 0x22 4M 512k'
if qemu-io -f raw "nbd+unix:///?socket=$TMP/l.sock" -c 'write -P 0x77 0 4k' 2>&1 | grep -q "^wrote"; then
  fail "-l: a write was accepted"
fi
stop_server "$lpid" l
qemu-io -r -f qcow2 snap.qcow2 -c 'read -P 0x66 0 2M' | grep -q "^read" ||
  fail "-l: the active image changed"
refused "-l with a missing snapshot" "nosuch" -l nosuch -k "$TMP/l2.sock" snap.qcow2

# ---- -o: the export starts at OFFSET -------------------------------------------
log "-o/--offset"
qemu-img create -f raw plain.raw 8M >/dev/null
qemu-io -f raw plain.raw -c 'write -P 0x7a 1M 1M' -c 'write -P 0x7b 3M 64k' >/dev/null
differential offset plain.raw o.raw -f raw -o 1048576 -t @IMG@
expect_eq "-o: export size" "$(jq .size t.info)" $((7 << 20))
differential "offset hex" plain.raw o2.raw -f raw --offset=0x200000 -t @IMG@
differential "offset qcow2" disk.qcow2 o.qcow2 -f qcow2 -o 3145728 -t @IMG@
expect_eq "-o on qcow2: export size" "$(jq .size t.info)" $((13 << 20))
serve_unix o "$TMP/o.sock" -f raw -o 1048576 -t plain.raw
opid=$SERVER_PID
reads_ok "-o: shifted data" "nbd+unix:///?socket=$TMP/o.sock" 'read -P 0x7a 0 1M' \
  'read -P 0x7b 2M 64k' 'read -P 0 3M 4M'
stop_server "$opid" o

# ---- --image-opts -------------------------------------------------------------
log "--image-opts"
differential "image-opts raw window" plain.raw io.raw --image-opts -t \
  "driver=raw,offset=1M,size=2M,file.driver=file,file.filename=@IMG@"
expect_eq "--image-opts raw window size" "$(jq .size t.info)" $((2 << 20))
differential "image-opts qcow2" disk.qcow2 io.qcow2 --image-opts -t \
  "driver=qcow2,file.driver=file,file.filename=@IMG@"
expect_eq "--image-opts qcow2: writable" "$(jq .is_read_only t.info)" false
# (qemu-nbd wants -r as well as read-only=on; thindisk takes either.)
differential "image-opts read-only" disk.qcow2 io.qcow2 -r --image-opts -t \
  "driver=qcow2,file.driver=file,file.filename=@IMG@,read-only=on,cache.direct=on"
expect_eq "--image-opts read-only=on" "$(jq .is_read_only t.info)" true

# ---- -L: the same export list from both servers ---------------------------------
log "-L/--list"
cp disk.qcow2 L1.qcow2
cp disk.qcow2 L2.qcow2
serve_unix Lt "$TMP/Lt.sock" -A -t -x one -D "the first disk" -f qcow2 L1.qcow2
ltpid=$SERVER_PID
qemu_nbd_unix Lq "$TMP/Lq.sock" -A -t -x one -D "the first disk" -f qcow2 L2.qcow2
lqpid=$SERVER_PID
for server in Lt Lq; do
  qemu-nbd -L -k "$TMP/$server.sock" >"$server.by-qemu" || fail "qemu-nbd -L $server"
  "$TD" serve -L -k "$TMP/$server.sock" >"$server.by-td" 2>L.err || { cat L.err >&2; fail "thindisk serve -L $server"; }
  cmp -s "$server.by-qemu" "$server.by-td" || fail "-L listing of $server differs
 qemu-nbd -L:
$(cat "$server.by-qemu")
 thindisk serve -L:
$(cat "$server.by-td")"
done
# Both servers list the same exports, descriptions, sizes and contexts
# (thindisk also offers multi-conn, and its preferred block is the cluster).
grep -v -e "flags:" -e "opt block:" Lt.by-td >Lt.lines
grep -v -e "flags:" -e "opt block:" Lq.by-td >Lq.lines
cmp -s Lt.lines Lq.lines || fail "-L: thindisk and qemu-nbd list different exports
 thindisk: $(cat Lt.lines)
 qemu-nbd: $(cat Lq.lines)"
grep -q "export: 'one'" Lt.by-td || fail "-L: export 'one' not listed: $(cat Lt.by-td)"
grep -q "description: the first disk" Lt.by-td || fail "-L: no description"
stop_server "$ltpid" Lt
kill_server "$lqpid"
refused "-L with an image" "incompatible" -L -k "$TMP/Lt.sock" disk.qcow2

# ---- Refused options: one clear line each -----------------------------------------
log "refused options"
refused "-c" "kernel NBD device" -c /dev/nbd0 disk.qcow2
refused "--connect" "kernel NBD device" --connect=/dev/nbd0 disk.qcow2
refused "-d" "kernel NBD device" -d /dev/nbd0
refused "-B of no bitmap" "bitmap 'bitmap0' is not found" -B bitmap0 -k "$TMP/x.sock" disk.qcow2
refused "--bitmap with -s" "not with -s" --bitmap=virtnbdbackup.0 -s -k "$TMP/x.sock" disk.qcow2
refused "--tls-creds of no object" "nor the id of an --object" --tls-creds tls0 -k "$TMP/x.sock" disk.qcow2
refused "--object secret" "only tls-creds-x509, tls-creds-psk, authz-simple and authz-list-file" \
  --object secret,id=sec0,data=x -k "$TMP/x.sock" disk.qcow2
refused "--tls-creds of a missing dir" "server-cert.pem: No such file" \
  --object tls-creds-x509,id=tls0,dir="$TMP/none",endpoint=server --tls-creds tls0 \
  -k "$TMP/x.sock" disk.qcow2
refused "--tls-hostname" "client's side" --tls-hostname localhost -k "$TMP/x.sock" disk.qcow2
refused "--aio=posix" "--aio" --aio=posix -k "$TMP/x.sock" disk.qcow2
refused "--detect-zeroes=unmap with --discard=ignore" "--discard=unmap" \
  --detect-zeroes=unmap --discard=ignore -k "$TMP/x.sock" disk.qcow2
refused "-s with -l" "cannot be combined" -s -l before -k "$TMP/x.sock" snap.qcow2
[[ -e x.sock ]] && fail "a refused command left a socket"
log "qemu_nbd_cli: ok"

#!/usr/bin/env bash
# NBD exports as images (issue 12): every image name thindisk takes may be
# an NBD URI, with the format probed or given on top of the export, as
# qemu-img does. Judged against qemu-img/qemu-io on the same URIs, with
# exports served by qemu-nbd and nbdkit (Unix sockets in the temp dir):
#   1. info and map --output=json of exports (qemu-nbd: qcow2 decoded, qcow2
#      bytes, raw; nbdkit: file, memory) agree with qemu-img's.
#   2. convert from exports keeps holes (destination map = source map) and
#      content (qemu-img compare); compare FILE URI.
#   3. convert onto an export (nbdkit memory): qcow2 read back with nbdcopy
#      passes qemu-img check/compare; raw zeroes old bytes without data.
#   4. a qcow2 clone over an NBD base (qemu-nbd -r) read and written by
#      qemu-io and thindisk io, and served by thindisk serve (concurrent
#      reads of the base).
#   5. failures: a server that vanishes mid-convert, a too-small export,
#      malformed URIs, an unknown scheme, a refused export name, a server
#      that answers garbage, a read-only export: one line on stderr, exit 1,
#      nothing left behind.
source "$(dirname "$0")/lib.sh"

require_thindisk
require_tool "$QEMU_IMG" "$QEMU_IO" qemu-nbd nbdkit nbdcopy nbdinfo jq python3

uri() { echo "nbd+unix:///?socket=$TMP/$1"; }


# qnbd NAME SOCKET ARGS...: qemu_nbd_unix, then wait_accepting.
qnbd() {
  local name=$1 sock=$2
  shift 2
  qemu_nbd_unix "$name" "$TMP/$sock" "$@"
  wait_accepting "$(uri "$sock")"
}

# nbdkit_unix NAME SOCKET ARGS...: nbdkit in the foreground (so the cleanup
# can kill it by pid) on SOCKET, through spawn.
nbdkit_unix() {
  local name=$1 sock=$2
  shift 2
  spawn "$name" nbdkit -f --exit-with-parent -U "$TMP/$sock" "$@"
  wait_for_socket "$TMP/$sock"
  wait_accepting "$(uri "$sock")"
}

# data_ranges MAPJSON: the merged [start, end] ranges that hold data.
data_ranges() {
  jq -c '[.[] | select(.data) | [.start, .start + .length]]
         | reduce .[] as $r ([]; if length > 0 and .[-1][1] == $r[0]
                                 then .[-1][1] = $r[1] else . + [$r] end)' "$1"
}

# one_line_error WHAT: the last command failed with exit 1 and said one line.
one_line_error() {
  [[ $RC -eq 1 ]] || fail "$1: exit $RC, $(cat "$ERR")"
  [[ $(wc -l <"$ERR") -eq 1 ]] || fail "$1: expected one line on stderr, got: $(cat "$ERR")"
}

# assert_map_agrees URI [OPTION...]: thindisk map and qemu-img map
# (--output=json, same options) describe the export identically.
assert_map_agrees() {
  ok "$QEMU_IMG" map "${@:2}" --output=json "$1"
  jq -S . "$OUT" >"$TMP/.qemu-map.json"
  td map "${@:2}" --output=json "$1"
  jq -S . "$OUT" >"$TMP/.td-map.json"
  diff "$TMP/.qemu-map.json" "$TMP/.td-map.json" >&2 || fail "$1: thindisk map differs from qemu-img map"
}

# assert_info_agrees_uri URI [OPTION...]: as lib.sh's assert_info_agrees,
# but qemu-img prints the URI normalized ("nbd+unix://?socket="), so the
# filename field is left out of the comparison.
assert_info_agrees_uri() {
  ok "$QEMU_IMG" info "${@:2}" --output=json "$1"
  jq -S 'del(.filename)' "$OUT" >"$TMP/.qemu-info.json"
  td info "${@:2}" --output=json "$1"
  jq -S 'del(.filename)' "$OUT" >"$TMP/.td-info.json"
  local diffs
  diffs=$(jq -n -c --slurpfile q "$TMP/.qemu-info.json" --slurpfile t "$TMP/.td-info.json" '
    ($q[0]) as $q | ($t[0]) as $t
    | [$t | paths(scalars)]
    | map(. as $p | try {path: $p, thindisk: ($t | getpath($p)), qemu: ($q | getpath($p))}
                    catch empty)
    | map(select(.qemu != null and .qemu != .thindisk))')
  [[ $diffs == "[]" ]] || fail "$1: thindisk info disagrees with qemu-img info: $diffs"
  jq -e '."virtual-size" and .format' "$TMP/.td-info.json" >/dev/null ||
    fail "$1: thindisk info lacks virtual-size or format"
  cmp -s <(jq -c '[."virtual-size", .format]' "$TMP/.qemu-info.json") \
    <(jq -c '[."virtual-size", .format]' "$TMP/.td-info.json") ||
    fail "$1: size or format differ from qemu-img's"
}

SIZE=$((64 << 20))
log "a half-sparse source: data at 1-3 MiB, 40-41 MiB and 60 MiB + 64 KiB"
truncate -s $SIZE src.raw  # (qemu-img create would allocate the first 4 KiB)
io_ok qemu-io-raw src.raw "write -P 0xab 1M 2M" "write -P 0xcd 40M 1M" "write -P 0x5e 60M 64k"
ok "$QEMU_IMG" convert -f raw -O qcow2 src.raw src.qcow2
ok "$QEMU_IMG" map -f raw --output=json src.raw
SRC_RANGES=$(data_ranges "$OUT")
[[ $SRC_RANGES == "[[1048576,3145728],[41943040,42991616],[62914560,62980096]]" ]] ||
  fail "the source is not the half-sparse image it should be: $SRC_RANGES"

log "1. info and map of qemu-nbd and nbdkit exports agree with qemu-img"
qnbd qnbd-qcow2 qcow2.sock -t -r -f qcow2 "$TMP/src.qcow2"
qnbd qnbd-bytes bytes.sock -t -r -f raw "$TMP/src.qcow2"
qnbd qnbd-raw raw.sock -t -r -f raw "$TMP/src.raw"
nbdkit_unix kit-file file.sock file "$TMP/src.raw"
nbdkit_unix kit-mem mem.sock memory 16M
io_ok qemu-io-raw "$(uri mem.sock)" "write -P 0x11 4M 1M"
for u in qcow2.sock bytes.sock raw.sock file.sock mem.sock; do
  assert_info_agrees_uri "$(uri $u)"
  assert_map_agrees "$(uri $u)"
done
td info --output=json "$(uri bytes.sock)"
assert_eq qcow2 "$(jq -r .format "$OUT")" "format probed on the qcow2 bytes of an export"
td info "$(uri raw.sock)"
grep -q "disk size: unavailable" "$OUT" || fail "info of an export: disk size not 'unavailable'"

log "2. convert from exports keeps holes and content; compare FILE URI"
for u in qcow2.sock bytes.sock file.sock; do
  td convert -O qcow2 "$(uri $u)" "from-$u.qcow2"
  qemu_check "from-$u.qcow2"
  ok "$QEMU_IMG" compare -f raw -F qcow2 src.raw "from-$u.qcow2"
  ok "$QEMU_IMG" map --output=json "from-$u.qcow2"
  assert_eq "$SRC_RANGES" "$(data_ranges "$OUT")" "data ranges of a qcow2 converted from $u"
done
td convert -O raw "$(uri raw.sock)" from-raw.raw
ok "$QEMU_IMG" map -f raw --output=json from-raw.raw
assert_eq "$SRC_RANGES" "$(data_ranges "$OUT")" "data ranges of a raw converted from an export"
assert_same_bytes src.raw from-raw.raw "raw converted from an export"
td compare src.raw "$(uri qcow2.sock)"
td compare "$(uri file.sock)" src.qcow2
cp src.raw other.raw
io_ok qemu-io-raw other.raw "write -P 0x01 50M 512"
capture "$TD" compare other.raw "$(uri raw.sock)"
assert_eq 1 "$RC" "compare of a differing file and export"

log "3. convert onto an nbdkit memory export"
nbdkit_unix kit-dst dst.sock memory 128M
io_ok qemu-io-raw "$(uri dst.sock)" "write -P 0xee 0 128M"  # old bytes everywhere
td convert -O qcow2 src.qcow2 "$(uri dst.sock)"
ok nbdcopy "$(uri dst.sock)" dst-copy.qcow2
qemu_check dst-copy.qcow2
ok "$QEMU_IMG" compare -f qcow2 -F qcow2 src.qcow2 dst-copy.qcow2
ok "$QEMU_IMG" compare -F qcow2 src.qcow2 "$(uri dst.sock)"
# A server that refuses requests under 4 KiB: the engine's small metadata
# writes (L1/L2/refcount entries) are read-modify-written in whole blocks.
nbdkit_unix kit-dst-4k dst-4k.sock --filter=blocksize-policy memory 128M \
  blocksize-minimum=4096 blocksize-preferred=4096 blocksize-error-policy=error
td convert -O qcow2 src.qcow2 "$(uri dst-4k.sock)"
io_ok thindisk "$(uri dst-4k.sock)" "write -P 0x3c 1000 10" "read -P 0x3c 1000 10"
ok nbdcopy "$(uri dst-4k.sock)" dst-4k-copy.qcow2
qemu_check dst-4k-copy.qcow2
cp src.raw src-3c.raw
io_ok qemu-io-raw src-3c.raw "write -P 0x3c 1000 10"
ok "$QEMU_IMG" compare -f raw -F qcow2 src-3c.raw dst-4k-copy.qcow2
nbdkit_unix kit-dst-raw dst-raw.sock memory $SIZE
io_ok qemu-io-raw "$(uri dst-raw.sock)" "write -P 0xee 0 64M"
td convert -O raw src.qcow2 "$(uri dst-raw.sock)"
ok "$QEMU_IMG" compare -f raw -F raw src.raw "$(uri dst-raw.sock)"
ok "$QEMU_IMG" map -f raw --output=json "$(uri dst-raw.sock)"
assert_eq "$SRC_RANGES" "$(data_ranges "$OUT")" \
  "allocation of a raw export after convert (zeroes must be write-zeroes, not data)"
nbdkit_unix kit-small small.sock memory 1M
td_fails "too small" "qcow2 onto a too small export" convert -O qcow2 src.qcow2 "$(uri small.sock)"
one_line_error "qcow2 onto a too small export"
td_fails "too small" "raw onto a too small export" convert -O raw src.raw "$(uri small.sock)"
log "   create on an export (qemu-img create formats an export too)"
nbdkit_unix kit-create create.sock memory 64M
td create -f qcow2 "$(uri create.sock)" 32M
ok "$QEMU_IMG" info --output=json "$(uri create.sock)"
assert_eq "qcow2 32M" "$(jq -r '"\(.format) \(."virtual-size" / 1048576)M"' "$OUT")" \
  "format and size of an image created on an export"
io_ok thindisk "$(uri create.sock)" "write -P 0x3c 1M 64k"
io_ok qemu-io "$(uri create.sock)" "read -P 0x3c 1M 64k" "read -P 0 0 1M"
ok "$QEMU_IMG" check "$(uri create.sock)"
# Thin: 1G of virtual size fits a 1M export; fully preallocated it does not.
td create -f qcow2 "$(uri small.sock)" 1G
ok "$QEMU_IMG" check "$(uri small.sock)"
td_fails "too small" "preallocated create onto a too small export" \
  create -f qcow2 -o preallocation=full "$(uri small.sock)" 1G
one_line_error "preallocated create onto a too small export"

log "4. a qcow2 clone over an NBD base served by qemu-nbd -r"
qnbd qnbd-base base.sock -t -r -f raw "$TMP/src.raw"
td create -f qcow2 -b "$(uri base.sock)" -F raw clone.qcow2 $SIZE
td info --output=json clone.qcow2
assert_eq "$(uri base.sock)" "$(jq -r '."full-backing-filename"' "$OUT")" "backing name of the clone"
io_ok qemu-io clone.qcow2 "read -P 0xab 1M 2M" "read -P 0xcd 40M 1M" "write -P 0x77 2M 64k"
io_ok thindisk clone.qcow2 "read -P 0xab 1M 1M" "read -P 0x77 2M 64k" "read -P 0xab 2112k 960k" \
  "read -P 0 3M 1M" "write -P 0x55 40M 4k"
io_ok qemu-io clone.qcow2 "read -P 0x55 40M 4k" "read -P 0xcd 40964k 1020k" "read -P 0x5e 60M 64k"
qemu_check clone.qcow2
td info --backing-chain clone.qcow2
grep -qF "$(uri base.sock)" "$OUT" || fail "info --backing-chain does not show the NBD base"
# thindisk serve of the clone: nbdcopy's parallel requests make the server's
# workers read the NBD base concurrently; the bytes match qemu-img's reading.
ok "$QEMU_IMG" convert -f qcow2 -O raw clone.qcow2 clone-ref.raw
serve_unix td-clone "$TMP/clone.sock" -r -f qcow2 clone.qcow2
wait_accepting "$(uri clone.sock)"
ok nbdcopy --requests=16 "$(uri clone.sock)" clone-copy.raw
assert_same_bytes clone-ref.raw clone-copy.raw "the clone served by thindisk over its NBD base"
kill -TERM "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
forget_server "$SERVER_PID"
# Copies of the clone: qemu-nbd serves one client at a time, and the
# copy's own open is that client, so nothing before the copy may wait for a
# second connection (the check that the destination is not in the source's
# chain once did, and hung).
capture timeout 60 "$TD" convert -O qcow2 clone.qcow2 clone-copy.qcow2
((RC == 0)) || fail "convert of a clone over an NBD base: exit $RC, $(cat "$ERR")"
ok "$QEMU_IMG" compare -f raw -F qcow2 clone-ref.raw clone-copy.qcow2
capture timeout 60 "$TD" dd -O raw if=clone.qcow2 of=clone-dd.raw bs=1M count=4
((RC == 0)) || fail "dd of a clone over an NBD base: exit $RC, $(cat "$ERR")"
cmp -n $((4 << 20)) clone-ref.raw clone-dd.raw || fail "dd of a clone over an NBD base differs"
# The base is read-only: thindisk io says so, naming the export.
td_fails "read-only" "write to a read-only export" io -c "write 0 4k" "$(uri base.sock)"
grep -qF "$(uri base.sock)" "$ERR" || fail "read-only error does not name the URI: $(cat "$ERR")"

log "5. failures"
# A server that vanishes mid-convert: every read waits 2 s, so the 64 MiB
# of data (32 reads of 2 MiB, convert keeps 8 in flight) take over 8 s, and
# the server is killed after 0.5 s.
nbdkit_unix kit-slow slow.sock --filter=delay pattern $SIZE rdelay=2
set +e
"$TD" convert -O qcow2 "$(uri slow.sock)" vanished.qcow2 >"$TMP/v.out" 2>"$TMP/v.err" &
CONVERT_PID=$!
set -e
sleep 0.5
kill -KILL "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
forget_server "$SERVER_PID"
set +e
wait "$CONVERT_PID"
VRC=$?
set -e
[[ $VRC -eq 1 ]] || fail "convert whose server vanished: exit $VRC, $(cat "$TMP/v.err")"
[[ $(wc -l <"$TMP/v.err") -eq 1 ]] || fail "vanished server: not one line: $(cat "$TMP/v.err")"
grep -qF "$(uri slow.sock)" "$TMP/v.err" || fail "vanished server: URI not named: $(cat "$TMP/v.err")"
assert_absent vanished.qcow2 "destination of a convert whose server vanished"
# The same export with no server behind its socket any more.
td_fails "" "convert from a dead socket" convert -O qcow2 "$(uri slow.sock)" vanished.qcow2
one_line_error "convert from a dead socket"
assert_absent vanished.qcow2 "destination of a convert from a dead socket"

td_fails "" "malformed URI" info "nbd+unix:///?socket="
one_line_error "malformed URI"
td_fails "" "malformed TCP URI" info "nbd://[::1/x"
one_line_error "malformed TCP URI"
td_fails "unknown protocol 'nbdx'" "unknown scheme" info "nbdx://localhost/x"
one_line_error "unknown scheme"
td_fails "unknown protocol" "unknown scheme as a convert source" convert nbdx://h/x never.raw
assert_absent never.raw "destination of a convert from an unknown scheme"
td_fails "unknown protocol 'nbdx'" "unknown scheme as a convert destination" \
  convert -O qcow2 src.qcow2 nbdx://h/x
one_line_error "unknown scheme as a convert destination"
[[ ! -e nbdx: ]] || fail "convert to nbdx://h/x made a directory or file"

qemu_nbd_unix qnbd-named "$TMP/named.sock" -t -r -x good -f raw "$TMP/src.raw"
wait_accepting "nbd+unix:///good?socket=$TMP/named.sock"
td info "nbd+unix:///good?socket=$TMP/named.sock"
td_fails "" "refused export name" info "nbd+unix:///bad?socket=$TMP/named.sock"
one_line_error "refused export name"
td_fails "" "refused export name as convert source" convert "nbd+unix:///bad?socket=$TMP/named.sock" never.qcow2
assert_absent never.qcow2 "destination of a convert from a refused export"

# A "server" that answers every connection with junk (for at most 60 s
# without a connection).
spawn junk python3 -c '
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1] + ".tmp"); s.listen(8); s.settimeout(60)
os.rename(sys.argv[1] + ".tmp", sys.argv[1])  # appears only once listening
while True:
    c, _ = s.accept()
    c.sendall(b"this is not NBD " * 64)
    c.close()
' "$TMP/junk.sock"
wait_for_socket "$TMP/junk.sock"
td_fails "" "server answering garbage" info "$(uri junk.sock)"
one_line_error "server answering garbage"
grep -qF "$(uri junk.sock)" "$ERR" || fail "garbage server: URI not named: $(cat "$ERR")"
td_fails "" "garbage server as convert destination" convert -O qcow2 src.qcow2 "$(uri junk.sock)"
one_line_error "garbage server as convert destination"
td_fails "" "garbage server as backing" create -f qcow2 -b "$(uri junk.sock)" -F raw never2.qcow2
assert_absent never2.qcow2 "clone of a garbage backing"

log "PASS"

#!/usr/bin/env bash
# `thindisk backup` when it must not back up, and when it must not reset
# the bitmap (docs/backup.md), judged by qemu-img, qemu-nbd and nbdinfo:
#   1. refusals: an NBD source without --control, --control with a local
#      source, --incremental over a backup of a disk of another size (or a
#      missing one), an existing target, an incremental without the bitmap
#      ("take a full backup first"), a disabled bitmap, an in_use bitmap (as
#      a crashed qemu leaves it), a raw source, a missing source, -g with
#      --incremental; through a served disk: a bitmap the image lacks, a
#      disabled one, one the server does not export, a dead control socket.
#      Each exits 1 with a clear message, leaves nothing behind, and the
#      source file is byte-identical (md5) afterwards;
#   2. a full backup of an image without the bitmap adds it, enabled, with
#      -g honoured (qemu-img info), and qemu then tracks its writes in it;
#   3. a backup that fails after it started (the target's directory
#      missing, a target that fills up mid-copy) leaves the bitmap as it was
#      (qemu-nbd -B / nbdinfo --map before and after) and the next backup
#      works.
source "$(dirname "$0")/lib.sh"

require_thindisk
require_tool "$QEMU_IMG" "$QEMU_IO" qemu-nbd nbdinfo nbdkit python3 jq md5sum timeout

M=$((1 << 20))

uri() { echo "nbd+unix:///?socket=$TMP/$1"; }


# listing: the temp dir's files (a refused backup must add none).
listing() {
  local f
  for f in "$TMP"/* "$TMP"/.[!.]*; do
    [[ -e $f && ! -S $f && $f != "$OUT" && $f != "$ERR" ]] && echo "${f##*/}"
  done
  return 0
}

# refused WHAT PATTERN SOURCE TARGET ARGS...: `thindisk backup ARGS` exits
# 1 with PATTERN on stderr, adds no file (TARGET included), and SOURCE,
# when it is a file, keeps its md5.
refused() {
  local what=$1 pattern=$2 src=$3 target=$4 before="" files
  shift 4
  [[ -f $src ]] && before=$(md5sum <"$src")
  files=$(listing)
  td_fails "$pattern" "$what" backup "$@"
  assert_absent "$target" "$what"
  assert_eq "$files" "$(listing)" "$what: files in the temp dir"
  [[ -z $before ]] || assert_eq "$before" "$(md5sum <"$src")" "$what: md5 of $src"
  echo "$what: $(head -1 "$ERR")"
}

# set_in_use IMAGE NAME: sets the in_use flag of bitmap NAME in the bitmap
# directory (entry bytes 12..15), as a qemu that crashed leaves it.
set_in_use() {
  ok python3 - "$1" "$2" <<'EOF'
import struct, sys
path, name = sys.argv[1], sys.argv[2].encode()
with open(path, "r+b") as f:
    head = f.read(65536)
    off = struct.unpack(">I", head[100:104])[0]           # header_length
    while True:
        typ, length = struct.unpack(">II", head[off:off + 8])
        if typ == 0:
            sys.exit("no bitmaps extension")
        if typ == 0x23852875:
            nb, _, dir_size, dir_offset = struct.unpack(">IIQQ", head[off + 8:off + 32])
            break
        off += 8 + (length + 7) // 8 * 8
    f.seek(dir_offset)
    d = f.read(dir_size)
    p = 0
    for _ in range(nb):
        flags, = struct.unpack(">I", d[p + 12:p + 16])
        name_size, = struct.unpack(">H", d[p + 18:p + 20])
        extra, = struct.unpack(">I", d[p + 20:p + 24])
        if d[p + 24 + extra:p + 24 + extra + name_size] == name:
            f.seek(dir_offset + p + 12)
            f.write(struct.pack(">I", flags | 1))
            sys.exit(0)
        p += (24 + extra + name_size + 7) // 8 * 8
    sys.exit("no bitmap " + sys.argv[2])
EOF
}

# bitmap_map IMAGE NAME OUT: nbdinfo --map of bitmap NAME, served read-only
# by qemu-nbd -B NAME, into OUT.
bitmap_map() {
  rm -f "$TMP/q.sock"
  qemu_nbd_unix qnbd "$TMP/q.sock" -t -r -f qcow2 -B "$2" "$1"
  wait_accepting "$(uri q.sock)"
  ok timeout 30 nbdinfo --map="qemu:dirty-bitmap:$2" "$(uri q.sock)"
  cp "$OUT" "$3"
  kill_server "$SERVER_PID"
}

# qemu_bitmaps IMAGE: the "bitmaps" list of qemu-img info -U ([] if none).
qemu_bitmaps() {
  ok timeout 60 "$QEMU_IMG" info -U --output=json "$1"
  jq -c '.["format-specific"].data.bitmaps // []' "$OUT"
}

log "the images"
ok "$QEMU_IMG" create -q -f qcow2 src.qcow2 64M
ok "$QEMU_IMG" bitmap --add src.qcow2 daily
io_ok qemu-io src.qcow2 "write -P 1 0 1M" "write -P 2 $((10 * M + 512)) 3000"
td backup --bitmap daily src.qcow2 b0.qcow2
io_ok qemu-io src.qcow2 "write -P 3 $((20 * M)) 64k"
ok "$QEMU_IMG" create -q -f qcow2 other.qcow2 32M
td backup --bitmap daily other.qcow2 other-b0.qcow2
ok "$QEMU_IMG" create -q -f qcow2 nobm.qcow2 64M
io_ok qemu-io nobm.qcow2 "write -P 4 0 64k"
ok "$QEMU_IMG" create -q -f qcow2 dis.qcow2 64M
ok "$QEMU_IMG" bitmap --add --disable dis.qcow2 daily
ok "$QEMU_IMG" create -q -f qcow2 inuse.qcow2 64M
ok "$QEMU_IMG" bitmap --add inuse.qcow2 daily
io_ok qemu-io inuse.qcow2 "write -P 5 0 64k"
set_in_use inuse.qcow2 daily
assert_eq '[{"flags":["in-use","auto"],"name":"daily","granularity":65536}]' \
  "$(qemu_bitmaps inuse.qcow2)" "inuse.qcow2 as qemu-img sees it"
ok "$QEMU_IMG" create -q -f raw raw.img 64M
cp b0.qcow2 existing.qcow2

log "refusals"
refused "an NBD source without --control" "needs --control" "" t.qcow2 \
  --bitmap daily "$(uri none.sock)" t.qcow2
refused "--control with a local source" "--control goes with an NBD source only" src.qcow2 \
  t.qcow2 --bitmap daily --control "$TMP/none.sock" src.qcow2 t.qcow2
refused "--incremental over a backup of another disk size" \
  "other-b0.qcow2 is a backup of a disk of 33554432 bytes" src.qcow2 t.qcow2 \
  --bitmap daily --incremental other-b0.qcow2 src.qcow2 t.qcow2
refused "--incremental over a missing backup" "nosuch-b.qcow2" src.qcow2 t.qcow2 \
  --bitmap daily --incremental nosuch-b.qcow2 src.qcow2 t.qcow2
before=$(md5sum <existing.qcow2)
td_fails "existing.qcow2 exists" "an existing target" backup --bitmap daily \
  --incremental b0.qcow2 src.qcow2 existing.qcow2
assert_eq "$before" "$(md5sum <existing.qcow2)" "an existing target: its md5"
refused "an incremental without the bitmap" "take a full backup first" nobm.qcow2 t.qcow2 \
  --bitmap daily --incremental b0.qcow2 nobm.qcow2 t.qcow2
refused "a full backup of a disabled bitmap" "'daily' is disabled" dis.qcow2 t.qcow2 \
  --bitmap daily dis.qcow2 t.qcow2
refused "an incremental of a disabled bitmap" "'daily' is disabled" dis.qcow2 t.qcow2 \
  --bitmap daily --incremental b0.qcow2 dis.qcow2 t.qcow2
refused "a full backup of an in_use bitmap" "'daily' is inconsistent" inuse.qcow2 t.qcow2 \
  --bitmap daily inuse.qcow2 t.qcow2
refused "an incremental of an in_use bitmap" "'daily' is inconsistent" inuse.qcow2 t.qcow2 \
  --bitmap daily --incremental b0.qcow2 inuse.qcow2 t.qcow2
refused "a raw source" "only a qcow2 image holds" raw.img t.qcow2 --bitmap daily raw.img t.qcow2
refused "a missing source" "missing.qcow2" "" t.qcow2 --bitmap daily missing.qcow2 t.qcow2
refused "-g with --incremental" "not with --incremental" src.qcow2 t.qcow2 \
  --bitmap daily -g 4k --incremental b0.qcow2 src.qcow2 t.qcow2

log "refusals through a served disk"
ok "$QEMU_IMG" create -q -f qcow2 sv.qcow2 64M
ok "$QEMU_IMG" bitmap --add sv.qcow2 daily
ok "$QEMU_IMG" bitmap --add sv.qcow2 unexported
ok "$QEMU_IMG" bitmap --add --disable sv.qcow2 frozen
io_ok qemu-io sv.qcow2 "write -P 6 0 64k"
td backup --bitmap unexported sv.qcow2 sv-b0.qcow2
serve_unix sv "$TMP/sv.sock" -B daily -B frozen --control "$TMP/ctl.sock" sv.qcow2
SV=$SERVER_PID
wait_for_socket "$TMP/ctl.sock"
io_ok qemu-io-raw "$(uri sv.sock)" "write -P 7 $((5 * M)) 4k"
ok timeout 30 nbdinfo --map=qemu:dirty-bitmap:daily "$(uri sv.sock)"
cp "$OUT" sv-before.map
refused "a bitmap the served image lacks" "has no bitmap 'nosuch'" "" t.qcow2 \
  --bitmap nosuch --control "$TMP/ctl.sock" "$(uri sv.sock)" t.qcow2
refused "a disabled bitmap of a served image" "'frozen' is not tracked by the server" "" t.qcow2 \
  --bitmap frozen --control "$TMP/ctl.sock" "$(uri sv.sock)" t.qcow2
refused "a bitmap the server does not export" "does not export bitmap 'unexported'" "" t.qcow2 \
  --bitmap unexported --incremental sv-b0.qcow2 --control "$TMP/ctl.sock" "$(uri sv.sock)" t.qcow2
refused "a dead control socket" "none.ctl" "" t.qcow2 \
  --bitmap daily --control "$TMP/none.ctl" "$(uri sv.sock)" t.qcow2
ok timeout 30 nbdinfo --map=qemu:dirty-bitmap:daily "$(uri sv.sock)"
diff sv-before.map "$OUT" >&2 || fail "the refusals changed the served bitmap 'daily'"
stop_server "$SV" sv

log "a full backup adds the bitmap (enabled, -g honoured) and qemu tracks it"
before=$(qemu_bitmaps nobm.qcow2)
assert_eq "[]" "$before" "nobm.qcow2 bitmaps before"
td backup --bitmap fine -g 4k nobm.qcow2 nobm-b0.qcow2
assert_eq '[{"flags":["auto"],"name":"fine","granularity":4096}]' "$(qemu_bitmaps nobm.qcow2)" \
  "nobm.qcow2 bitmaps after its first full backup"
ok "$QEMU_IMG" compare nobm.qcow2 nobm-b0.qcow2
bitmap_map nobm.qcow2 fine fine0.map
assert_eq "0 $((64 * M)) 0" "$(awk '{print $1, $2, $3}' fine0.map)" "the new bitmap is clean"
io_ok qemu-io nobm.qcow2 "write -P 8 $((5 * M + 1)) 1"
bitmap_map nobm.qcow2 fine fine1.map
grep -qE "^ *$((5 * M)) +4096 +1 +dirty" fine1.map || { cat fine1.map >&2; fail "qemu's write is not in 'fine' at 4k"; }
td backup --bitmap fine --incremental nobm-b0.qcow2 nobm.qcow2 nobm-b1.qcow2
ok "$QEMU_IMG" compare nobm.qcow2 nobm-b1.qcow2
qemu_check nobm-b0.qcow2 nobm-b1.qcow2 nobm.qcow2

log "a backup that fails part-way keeps the bitmap"
io_ok qemu-io src.qcow2 "write -P 9 $((30 * M)) 8M" "write -z $((40 * M)) 1M"
bitmap_map src.qcow2 daily src-before.map
grep -q " 1 *dirty" src-before.map || fail "src.qcow2's bitmap should be dirty here"
# (a) The target's directory is missing, or is a file (root ignores modes).
refused "a target in a missing directory" "nodir/t.qcow2" src.qcow2 nodir/t.qcow2 \
  --bitmap daily --incremental b0.qcow2 src.qcow2 nodir/t.qcow2
touch afile
refused "a target under a file" "afile/t.qcow2" src.qcow2 afile/t.qcow2 \
  --bitmap daily src.qcow2 afile/t.qcow2
# (b) A full backup whose target fills up mid-copy: a qcow2 on a 2 MiB NBD
# export (nbdkit memory), for 10 MiB of data.
rm -f "$TMP/small.sock"
spawn nbdkit nbdkit -f -U "$TMP/small.sock" memory 2M
NBDKIT=$SERVER_PID
wait_accepting "$(uri small.sock)"
before=$(md5sum <src.qcow2)
td_fails "past the end of the export" "a target that fills up" backup --bitmap daily src.qcow2 \
  "$(uri small.sock)"
echo "a target that fills up: $(head -1 "$ERR")"
assert_eq "$before" "$(md5sum <src.qcow2)" "a target that fills up: md5 of src.qcow2"
kill_server "$NBDKIT"
# (c) An incremental whose local target passes the file size limit
# mid-copy (RLIMIT_FSIZE 4 MiB, 9 MiB dirty: writes fail with EFBIG).
before=$(md5sum <src.qcow2)
# shellcheck disable=SC2016 # expanded by the inner bash
capture bash -c 'trap "" XFSZ; ulimit -f 4096; exec "$0" "$@"' "$TD" backup --bitmap daily \
  --incremental b0.qcow2 src.qcow2 big.qcow2
[[ $RC == 1 ]] || fail "a target past the file size limit: exit $RC: $(cat "$ERR")"
echo "a target past the file size limit: $(head -1 "$ERR")"
assert_absent big.qcow2 "a target past the file size limit"
assert_eq "$before" "$(md5sum <src.qcow2)" "a target past the file size limit: md5 of src.qcow2"
bitmap_map src.qcow2 daily src-after.map
diff src-before.map src-after.map >&2 || fail "a failed backup changed the bitmap"
qemu_check src.qcow2

log "and then the next backup works"
td backup --bitmap daily --incremental b0.qcow2 src.qcow2 b1.qcow2
ok "$QEMU_IMG" compare src.qcow2 b1.qcow2
bitmap_map src.qcow2 daily src-reset.map
assert_eq "0 $((64 * M)) 0" "$(awk '{print $1, $2, $3}' src-reset.map)" "daily after the backup"
qemu_check b0.qcow2 b1.qcow2 src.qcow2

#!/usr/bin/env bash
# Persistent bitmaps through the commands that change an image as a whole
# (docs/backup.md), judged by qemu: what each does to the bitmaps is what
# qemu-img 7.2 does, and `qemu-nbd -B` shows the bits.
#   commit     marks the backing file's enabled bitmaps where it wrote;
#   rebase     (safe) marks the overlay's where it copied data in;
#   resize     grows and shrinks them (qemu-img check clean, bits kept);
#   snapshot   -c and -d keep them, -a is refused (as qemu-img);
#   amend      lazy_refcounts keeps them, compat=0.10 is refused (qemu-img
#              downgrades and loses them silently).
source "$(dirname "$0")/lib.sh"
require_thindisk
require_tool qemu-img qemu-nbd nbdinfo
M=$((1 << 20))

# dirty IMAGE BITMAP: the "offset length" of each dirty extent, via qemu-nbd.
dirty() {
  qemu_nbd_unix qn "$TMP/qn.sock" -t -r -f qcow2 -B "$2" "$1"
  nbdinfo --map="qemu:dirty-bitmap:$2" "nbd+unix:///?socket=$TMP/qn.sock" |
    awk '$3 == 1 { print $1, $2 }' >dirty.txt || fail "nbdinfo --map of $1"
  kill_server "$SERVER_PID"
  rm -f "$TMP/qn.sock"
  cat dirty.txt
}

# bitmaps IMAGE: name:flags of each, as qemu-img info lists them.
bitmaps() {
  qemu-img info --output=json -f qcow2 "$1" |
    jq -r '."format-specific".data.bitmaps // [] | .[] | "\(.name):\(.flags | join(","))"' |
    tr '\n' ' '
}

log "commit marks the backing file's enabled bitmaps"
"$TD" create -q -f qcow2 base.qcow2 64M
"$TD" bitmap --add base.qcow2 on
qemu-img bitmap --add --disable base.qcow2 off
"$TD" create -q -f qcow2 -b base.qcow2 -F qcow2 top.qcow2
"$TD" io -c "write -P 0x11 $M 64k" -c "write -P 0x22 $((40 * M)) 4k" top.qcow2 >/dev/null
"$TD" commit top.qcow2 >/dev/null
assert_eq "$M 65536
$((40 * M)) 65536" "$(dirty base.qcow2 on)" "commit: dirty extents of 'on'"
assert_eq "" "$(dirty base.qcow2 off)" "commit: a disabled bitmap"
qemu-img check -q base.qcow2 || fail "commit: qemu-img check"

log "rebase (safe) marks the overlay's"
"$TD" create -q -f qcow2 other.qcow2 64M
"$TD" bitmap --add top.qcow2 t
"$TD" rebase -b other.qcow2 -F qcow2 top.qcow2
[[ -n $(dirty top.qcow2 t) ]] || fail "rebase: the copied data left the bitmap clean"
qemu-img check -q top.qcow2 || fail "rebase: qemu-img check"

log "resize carries them"
"$TD" create -q -f qcow2 -o extended_l2=off,compression_type=zlib r.qcow2 64M  # compat=0.10 could hold it
"$TD" bitmap --add -g 4k r.qcow2 fine
"$TD" io -c "write 8M 4k" r.qcow2 >/dev/null
"$TD" resize r.qcow2 10G
qemu-img check -q r.qcow2 || fail "resize: qemu-img check after growing"
assert_eq "$((8 * M)) 4096" "$(dirty r.qcow2 fine)" "resize: the bits after growing"
"$TD" resize --shrink r.qcow2 16M
assert_eq "$((8 * M)) 4096" "$(dirty r.qcow2 fine)" "resize: the bits after shrinking"
qemu-img check -q r.qcow2 || fail "resize: qemu-img check after shrinking"

log "snapshots: -c and -d keep them, -a is refused"
"$TD" snapshot -c s1 r.qcow2
"$TD" io -c "write 2M 4k" r.qcow2 >/dev/null
assert_eq "fine:auto " "$(bitmaps r.qcow2)" "snapshot -c: the bitmaps"
capture "$TD" snapshot -a s1 r.qcow2
[[ $RC != 0 ]] || fail "snapshot -a with bitmaps succeeded"
grep -q "bitmaps" "$ERR" || fail "snapshot -a: the refusal does not say why: $(cat "$ERR")"
"$TD" snapshot -d s1 r.qcow2
assert_eq "$((2 * M)) 4096
$((8 * M)) 4096" "$(dirty r.qcow2 fine)" "snapshot -d: the bits"

log "amend: lazy_refcounts keeps them, compat=0.10 is refused"
"$TD" amend -o lazy_refcounts=on r.qcow2
assert_eq "fine:auto " "$(bitmaps r.qcow2)" "amend lazy_refcounts: the bitmaps"
qemu-img check -q r.qcow2 || fail "amend: qemu-img check"
before=$(md5sum <r.qcow2)
capture "$TD" amend -o compat=0.10 r.qcow2
[[ $RC != 0 ]] || fail "amend compat=0.10 with bitmaps succeeded"
grep -q "bitmaps" "$ERR" || fail "amend compat=0.10: the refusal does not say why: $(cat "$ERR")"
assert_eq "$before" "$(md5sum <r.qcow2)" "amend compat=0.10 refused: the image"
log "bitmaps_chain: ok"

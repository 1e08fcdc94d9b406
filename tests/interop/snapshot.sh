#!/usr/bin/env bash
# thindisk snapshot against qemu-img snapshot 7.2, both ways, on three
# layouts (thindisk's default, 64 KiB clusters without extended L2, and an
# image holding compressed clusters):
#  - a snapshot made by one tool is listed (same table, same JSON as
#    qemu-img info's "snapshots"), applied and deleted by the other, and the
#    content read back with qemu-io patterns;
#  - the same sequence run by each tool on its own copy gives images that
#    qemu-img compare finds equal, with every snapshot applied;
#  - deleting frees clusters: qemu-img check finds no leaks and the file
#    does not grow across repeated create/overwrite/delete cycles;
#  - convert -l copies a snapshot's content (by name, id, or both) as
#    qemu-img convert -l does, into raw and qcow2, leaving the source as it
#    was; measure -l's required size is the file convert -l makes, its
#    fully allocated size qemu-img measure -l's;
#  - the errors: duplicate and unknown names, raw images, an image in use,
#    and convert -l's.
source "$(dirname "$0")/lib.sh"
# qemu-nbd comes with qemu-img (qemu-utils, scripts/install-deps.sh): the
# busy-image check below always runs.
require_tool "$QEMU_IMG" "$QEMU_IO" qemu-nbd jq stat cmp
require_thindisk

M=$((1 << 20))
SIZE=$((64 * M))

clean() { qemu_check "$1"; td check "$1"; }

# write_a / write_b IMAGE: the two contents the sequences switch between.
write_a() { io_ok qemu-io "$1" "write -P 0xa1 0 4M" "write -P 0xa2 5M 100k"; }
write_b() { io_ok qemu-io "$1" "write -P 0xb1 1M 2M" "write -P 0xb2 10M 64k"; }
read_a() {
  io_ok qemu-io "$1" "read -P 0xa1 0 4M" "read -P 0xa2 5M 100k" "read -P 0 $((5 * M + 102400)) 64k" \
    "read -P 0 10M 64k"
}
read_b() { io_ok qemu-io "$1" "read -P 0xa1 0 1M" "read -P 0xb1 1M 2M" "read -P 0xb2 10M 64k"; }

# new_image NAME LAYOUT: LAYOUT is "default", "64k" or "compressed".
new_image() {
  case $2 in
    default) td create -q -f qcow2 "$1" "$SIZE" ;;
    64k) td create -q -f qcow2 -o cluster_size=65536,extended_l2=off "$1" "$SIZE" ;;
    compressed)
      td create -q -f qcow2 -o cluster_size=65536,extended_l2=off "$1" "$SIZE"
      io_ok qemu-io "$1" "write -c -P 0xc1 16M 1M" "write -c -P 0xc2 20M 128k"
      ;;
  esac
}

read_compressed() {
  [[ $2 == compressed ]] || return 0
  io_ok qemu-io "$1" "read -P 0xc1 16M 1M" "read -P 0xc2 20M 128k"
}

# lists_agree IMAGE: the human table and the JSON list match qemu-img's.
lists_agree() {
  ok "$QEMU_IMG" snapshot -l "$1"
  cp "$OUT" "$TMP/.qemu-list"
  td snapshot -l "$1"
  diff "$TMP/.qemu-list" "$OUT" >&2 || fail "$1: snapshot -l differs from qemu-img's"
  ok "$QEMU_IMG" info --output=json "$1"
  jq -S '.snapshots // []' "$OUT" >"$TMP/.qemu-json"
  td snapshot -l --output=json "$1"
  jq -S . "$OUT" >"$TMP/.td-json"
  diff "$TMP/.qemu-json" "$TMP/.td-json" >&2 || fail "$1: snapshot JSON differs from qemu-img info's"
}

for layout in default 64k compressed; do
  log "layout $layout: thindisk creates, qemu-img lists and applies"
  new_image t.qcow2 $layout
  lists_agree t.qcow2  # none yet
  write_a t.qcow2
  td snapshot -c s1 t.qcow2
  write_b t.qcow2
  clean t.qcow2
  ok "$QEMU_IMG" snapshot -l t.qcow2
  grep -qE '^1 +s1 ' "$OUT" || fail "qemu-img does not list s1: $(cat "$OUT")"
  lists_agree t.qcow2
  ok "$QEMU_IMG" snapshot -a s1 t.qcow2
  read_a t.qcow2
  read_compressed t.qcow2 $layout
  clean t.qcow2
  log "layout $layout: thindisk deletes, qemu-img sees it gone"
  td snapshot -d s1 t.qcow2
  clean t.qcow2
  ok "$QEMU_IMG" snapshot -l t.qcow2
  ! grep -q ' s1 ' "$OUT" || fail "s1 still listed after delete"
  read_a t.qcow2

  log "layout $layout: qemu-img creates, thindisk lists, applies, deletes"
  new_image q.qcow2 $layout
  write_a q.qcow2
  ok "$QEMU_IMG" snapshot -c q1 q.qcow2
  write_b q.qcow2
  ok "$QEMU_IMG" snapshot -c q2 q.qcow2
  lists_agree q.qcow2
  td snapshot -a q1 q.qcow2
  clean q.qcow2
  read_a q.qcow2
  read_compressed q.qcow2 $layout
  td snapshot -a 2 q.qcow2  # by id
  read_b q.qcow2
  td snapshot -d q1 q.qcow2
  clean q.qcow2
  ok "$QEMU_IMG" snapshot -a q2 q.qcow2
  read_b q.qcow2
  td snapshot -d q2 q.qcow2
  clean q.qcow2
  ok "$QEMU_IMG" snapshot -l q.qcow2
  [[ $(wc -l <"$OUT") -le 2 ]] || fail "snapshots left after deleting all: $(cat "$OUT")"

  log "layout $layout: the same sequence by each tool gives equal images"
  new_image base.qcow2 $layout
  write_a base.qcow2
  cp base.qcow2 x.td
  cp base.qcow2 x.qemu
  for tool in td qemu; do
    if [[ $tool == td ]]; then snap() { td snapshot "$@"; }; else snap() { ok "$QEMU_IMG" snapshot "$@"; }; fi
    snap -c s1 x.$tool
    write_b x.$tool
    snap -c s2 x.$tool
    io_ok qemu-io x.$tool "write -P 0xd1 2M 3M" "discard 12M 1M"
    snap -c s3 x.$tool
    snap -a s1 x.$tool
    io_ok qemu-io x.$tool "write -P 0xe1 30M 1M"
    snap -d s2 x.$tool
    clean x.$tool
  done
  ok "$QEMU_IMG" compare x.td x.qemu
  for s in s1 s3; do
    for applier in td qemu; do
      cp x.td a.td
      cp x.qemu a.qemu
      if [[ $applier == td ]]; then
        td snapshot -a $s a.td
        td snapshot -a $s a.qemu
      else
        ok "$QEMU_IMG" snapshot -a $s a.td
        ok "$QEMU_IMG" snapshot -a $s a.qemu
      fi
      ok "$QEMU_IMG" compare a.td a.qemu
      clean a.td
    done
  done

  log "layout $layout: convert -l copies a snapshot's content, as qemu-img convert -l"
  before=$(md5sum <x.td)
  for sel in s1 snapshot.name=s3 "snapshot.id=1" "snapshot.id=3,snapshot.name=s3"; do
    for fmt in raw qcow2; do
      rm -f l.td l.qemu
      td convert -l "$sel" -O $fmt x.td l.td
      ok "$QEMU_IMG" convert -l "$sel" -O $fmt x.td l.qemu
      ok "$QEMU_IMG" compare -f $fmt -F $fmt l.td l.qemu
      [[ $fmt == raw ]] || clean l.td
    done
    # measure -l: "required" is the size of the file convert -l makes (exact
    # by design: qcow2/measure.h), "fully-allocated" qemu-img measure -l's
    # for the same target layout; no "bitmaps" (convert -l copies none).
    td measure --output=json -O qcow2 -l "$sel" x.td
    required=$(jq .required "$OUT")
    [[ $(jq 'has("bitmaps")' "$OUT") == false ]] || fail "measure -l $sel counts bitmaps"
    rm -f lm.qcow2
    td convert -l "$sel" -O qcow2 x.td lm.qcow2
    assert_eq "$(stat -c %s lm.qcow2)" "$required" "measure -l $sel against convert -l's file"
    ok "$QEMU_IMG" measure --output=json -O qcow2 -l "$sel" x.td
    want=$(jq '."fully-allocated"' "$OUT")
    td measure --output=json -O qcow2 -o cluster_size=65536,extended_l2=off -l "$sel" x.td
    assert_eq "$want" "$(jq '."fully-allocated"' "$OUT")" "measure -l $sel: fully-allocated"
  done
  # s1 holds content a, not what was written after it.
  td convert -l s1 -O qcow2 x.td l1.qcow2
  read_a l1.qcow2
  [[ $layout != compressed ]] || { td convert -c -l s1 -O qcow2 x.td lc.qcow2 && read_a lc.qcow2; }
  [[ $(md5sum <x.td) == "$before" ]] || fail "convert -l changed its source image"

  log "layout $layout: delete frees clusters across cycles"
  new_image c.qcow2 $layout
  io_ok qemu-io c.qcow2 "write -P 0x11 0 8M"
  first=0
  for i in 1 2 3 4 5; do
    if ((i % 2)); then td snapshot -c c$i c.qcow2; else ok "$QEMU_IMG" snapshot -c c$i c.qcow2; fi
    io_ok qemu-io c.qcow2 "write -P $((0x20 + i)) 0 8M"
    td snapshot -d c$i c.qcow2
    ok "$QEMU_IMG" check c.qcow2  # exit 0: no leaks, no corruption
    size=$(stat -c %s c.qcow2)
    ((i == 1)) && first=$size
    ((size <= first)) || fail "image grew from $first to $size bytes in cycle $i"
    io_ok qemu-io c.qcow2 "read -P $((0x20 + i)) 0 8M"
  done
done

log "errors"
new_image e.qcow2 64k
td snapshot -c dup e.qcow2
td_fails "already exists" "duplicate name" snapshot -c dup e.qcow2
for op in -a -d; do
  td_fails "no snapshot 'nope'" "unknown name ($op)" snapshot $op nope e.qcow2
done
ok "$QEMU_IMG" create -q -f raw r.raw 1M
td_fails "does not support internal snapshots" "raw image" snapshot -c s r.raw
td_fails "no snapshot 'nope'" "convert -l of an unknown snapshot" convert -l nope e.qcow2 e.out
td_fails "no snapshot id '2' name 'dup'" "convert -l, an id and a name of two snapshots" \
  convert -l snapshot.id=2,snapshot.name=dup e.qcow2 e.out
td_fails "unknown key 'snapshot.size'" "convert -l, a bad key" convert -l snapshot.size=1 e.qcow2 e.out
td_fails "internal snapshots need a qcow2 image" "convert -l of a raw image" convert -l s r.raw e.out
td_fails "no snapshot 'nope'" "measure -l of an unknown snapshot" measure -O qcow2 -l nope e.qcow2
td_fails "-l names a snapshot of a source image" "measure -l --size" measure -l s1 --size 1G
td_fails "--bitmaps cannot be combined with -l" "convert -l --bitmaps" \
  convert --bitmaps -O qcow2 -l dup e.qcow2 e.out
[[ ! -e e.out ]] || fail "a refused convert -l left its destination"
td_fails "" "no operation given" snapshot e.qcow2
clean e.qcow2

log "an image in use by qemu-nbd is refused"
qemu_nbd_unix qemu-nbd "$TMP/nbd.sock" -f qcow2 e.qcow2
td_fails "in use" "busy image" snapshot -c busy e.qcow2
kill_server "$SERVER_PID"
ok "$QEMU_IMG" snapshot -l e.qcow2
grep -q dup "$OUT" || fail "snapshot -l did not list the image's snapshot: $(cat "$OUT")"
! grep -q busy "$OUT" || fail "snapshot created while the image was in use"
echo "PASS [$TEST_NAME]"

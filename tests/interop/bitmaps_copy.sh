#!/usr/bin/env bash
# Persistent bitmaps through measure and convert, judged against qemu-img
# 7.2 (qemu-img measure, qemu-img convert --bitmaps, qemu-nbd -B, nbdinfo):
#   1. `measure -O qcow2` of qcow2 images with 0 to 3 bitmaps (in_use ones
#      too) prints qemu-img's "bitmaps" (same figure, same key order, same
#      human line) for 64k, 128k and 512-byte clusters; no "bitmaps" with
#      -O raw, compat=0.10, --size or a raw source.
#   2. `convert --bitmaps` of an image whose bitmaps qemu-img made and
#      qemu-io dirtied: the destination lists the same bitmaps (qemu-img
#      info), passes qemu-img check, and every bitmap maps identically
#      through qemu-nbd -B / nbdinfo --map; enabled ones keep tracking.
#      Also onto an NBD export (nbdkit memory), and the other way round:
#      qemu-img convert --bitmaps of thindisk's result keeps them.
#   3. the errors, message for message with qemu-img's: an in_use bitmap
#      (a qemu-nbd killed with -9 after a write), --skip-broken-bitmaps
#      (with and without --bitmaps), raw or compat=0.10 destinations, a raw
#      source; a refused conversion leaves no destination behind.
source "$(dirname "$0")/lib.sh"

require_thindisk
require_tool "$QEMU_IMG" "$QEMU_IO" qemu-nbd nbdinfo nbdkit nbdcopy jq timeout

M=$((1 << 20))

uri() { echo "nbd+unix:///?socket=$TMP/$1"; }


# qemu_bitmaps IMAGE: the "bitmaps" list qemu-img info reports ([] when none).
qemu_bitmaps() {
  ok timeout 60 "$QEMU_IMG" info -U --output=json "$1"
  jq -c '.["format-specific"].data.bitmaps // []' "$OUT"
}

# dump_maps IMAGE TAG NAME...: TAG.I.map is `nbdinfo --map` of the I-th
# bitmap named (names may hold '/'), exported read-only by one
# qemu-nbd -B NAME... run.
dump_maps() {
  local img=$1 tag=$2 n i args=()
  shift 2
  for n in "$@"; do args+=(-B "$n"); done
  rm -f "$TMP/$tag.sock"
  qemu_nbd_unix "nbd-$tag" "$TMP/$tag.sock" -t -r -f qcow2 "${args[@]}" "$img"
  wait_accepting "$(uri "$tag.sock")"
  for ((i = 1; i <= $#; i++)); do
    n=${!i}
    capture timeout 30 nbdinfo --map="qemu:dirty-bitmap:$n" "$(uri "$tag.sock")"
    [[ $RC == 0 ]] || fail "nbdinfo --map of bitmap '$n' of $img: $(cat "$ERR")"
    cp "$OUT" "$TMP/$tag.$i.map"
  done
  stop_server "$SERVER_PID" "nbd-$tag"
}

# same_bitmaps A B: qemu-img lists the same bitmaps (names, order, flags,
# granularities) in both images, and each maps identically through
# qemu-nbd (B.I.map: the I-th bitmap's map, from 1).
same_bitmaps() {
  local a=$1 b=$2 list i names=()
  list=$(qemu_bitmaps "$a")
  assert_eq "$list" "$(qemu_bitmaps "$b")" "$b: bitmaps (qemu-img info) vs $a"
  mapfile -t names < <(jq -r '.[].name' <<<"$list")
  ((${#names[@]} > 0)) || return 0
  dump_maps "$a" A "${names[@]}"
  dump_maps "$b" B "${names[@]}"
  for ((i = 1; i <= ${#names[@]}; i++)); do
    diff "$TMP/A.$i.map" "$TMP/B.$i.map" >&2 ||
      fail "$b: bitmap '${names[i - 1]}' maps differently from $a's"
  done
}

# same_stderr_as_qemu WHAT QEMU_ARGS -- TD_ARGS: both fail with exit 1 and
# the same stderr, "qemu-img" read as "thindisk".
same_stderr_as_qemu() {
  local what=$1 qargs=() targs=()
  shift
  while [[ $1 != -- ]]; do qargs+=("$1"); shift; done
  shift
  targs=("$@")
  capture timeout 60 "$QEMU_IMG" "${qargs[@]}"
  [[ $RC == 1 ]] || fail "$what: qemu-img exited $RC"
  sed 's/qemu-img/thindisk/g' "$ERR" >"$TMP/.qemu-err"
  capture "$TD" "${targs[@]}"
  [[ $RC == 1 ]] || fail "$what: thindisk exited $RC: $(cat "$ERR")"
  diff "$TMP/.qemu-err" "$ERR" >&2 || fail "$what: stderr differs from qemu-img's"
}

log "measure: the bitmaps figure, as qemu-img measure"
ok "$QEMU_IMG" create -q -f qcow2 m0.qcow2 1G
ok "$QEMU_IMG" create -q -f qcow2 m1.qcow2 1G
ok "$QEMU_IMG" bitmap --add m1.qcow2 a
ok "$QEMU_IMG" create -q -f qcow2 -o cluster_size=4096 m2.qcow2 10G
ok "$QEMU_IMG" bitmap --add -g 512 m2.qcow2 fine
ok "$QEMU_IMG" bitmap --add -g 4k --disable m2.qcow2 "$(printf 'n%.0s' {1..1023})"
ok "$QEMU_IMG" create -q -f qcow2 -o cluster_size=128k m3.qcow2 $((3 * 1024 * M + 512))
ok "$QEMU_IMG" bitmap --add m3.qcow2 'with space/ü'
ok "$QEMU_IMG" bitmap --add -g 128k m3.qcow2 b128k
ok "$QEMU_IMG" bitmap --add -g 1M --disable m3.qcow2 b1m
io_ok qemu-io m3.qcow2 "write -P 7 0 1M" "write -P 8 2G 64k"
measure_agrees() {  # measure_agrees IMAGE OPTS: thindisk vs qemu-img
  local img=$1 opts=$2 q t
  ok timeout 60 "$QEMU_IMG" measure -O qcow2 -o "$opts" --output=json "$img"
  q=$(jq -c '[keys_unsorted, .bitmaps]' "$OUT")
  td measure -O qcow2 -o "$opts" --output=json "$img"
  t=$(jq -c '[keys_unsorted, .bitmaps]' "$OUT")
  assert_eq "$q" "$t" "measure $img [$opts]: JSON keys and bitmaps"
  ok timeout 60 "$QEMU_IMG" measure -O qcow2 -o "$opts" "$img"
  q=$(grep '^bitmaps size' "$OUT")
  td measure -O qcow2 -o "$opts" "$img"
  assert_eq "$q" "$(grep '^bitmaps size' "$OUT")" "measure $img [$opts]: human bitmaps line"
  echo "measure $img [$opts]: $t"
}
for img in m0.qcow2 m1.qcow2 m2.qcow2 m3.qcow2; do
  for opts in cluster_size=65536,extended_l2=off cluster_size=131072 \
    cluster_size=512,extended_l2=off; do
    measure_agrees "$img" "$opts"
  done
done
# No bitmaps figure: raw output, a version 2 output, --size, a raw source.
ok "$QEMU_IMG" convert -O raw m1.qcow2 m1.raw
for args in "-O raw m1.qcow2" "-O qcow2 -o compat=0.10 m1.qcow2" "-O qcow2 --size 1G" \
  "-O qcow2 m1.raw"; do
  # shellcheck disable=SC2086
  td measure --output=json $args
  assert_eq "false" "$(jq 'has("bitmaps")' "$OUT")" "measure $args: bitmaps key"
  # shellcheck disable=SC2086
  td measure $args
  grep -q '^bitmaps' "$OUT" && fail "measure $args: prints a bitmaps line"
done

log "convert --bitmaps of bitmaps qemu-img made and qemu-io dirtied"
ok "$QEMU_IMG" create -q -f qcow2 src.qcow2 256M
ok "$QEMU_IMG" bitmap --add src.qcow2 e
ok "$QEMU_IMG" bitmap --add -g 4k src.qcow2 small
ok "$QEMU_IMG" bitmap --add src.qcow2 d
ok "$QEMU_IMG" bitmap --add -g 512 src.qcow2 'with space/ü'
io_ok qemu-io src.qcow2 "write -P 1 0 64k" "write -P 2 1M 4k" "write -P 3 $((3 * M + 512)) 1" \
  "write -z 100M 2M" "write -P 4 $((200 * M - 4096)) 8k"
ok "$QEMU_IMG" bitmap --disable src.qcow2 d
ok "$QEMU_IMG" bitmap --add -g 128k --disable src.qcow2 clean
io_ok qemu-io src.qcow2 "write -P 5 50M 64k" "discard 100M 64k"
src_list=$(qemu_bitmaps src.qcow2)
echo "source bitmaps: $src_list"
[[ $(jq length <<<"$src_list") == 5 ]] || fail "the source should hold 5 bitmaps"

for opts in "" "cluster_size=65536,extended_l2=off" "cluster_size=512,extended_l2=off"; do
  rm -f dst.qcow2
  td convert --bitmaps -O qcow2 ${opts:+-o "$opts"} src.qcow2 dst.qcow2
  qemu_check dst.qcow2
  ok "$QEMU_IMG" compare src.qcow2 dst.qcow2
  same_bitmaps src.qcow2 dst.qcow2
  grep -q ' 1  dirty' "$TMP/B.1.map" || fail "bitmap e is all clean: nothing was compared"
  echo "convert --bitmaps [${opts:-defaults}]: same bitmaps and maps"
done
# The conversion's writes marked nothing; -c and -B paths too.
td convert --bitmaps -c -O qcow2 src.qcow2 dstc.qcow2
qemu_check dstc.qcow2
same_bitmaps src.qcow2 dstc.qcow2
td convert --bitmaps -O qcow2 -B m0.qcow2 -F qcow2 src.qcow2 dstb.qcow2
qemu_check dstb.qcow2
same_bitmaps src.qcow2 dstb.qcow2

# Enabled bitmaps keep tracking in the destination, disabled ones do not.
io_ok qemu-io dst.qcow2 "write -P 9 150M 4k"
cp src.qcow2 src2.qcow2
io_ok qemu-io src2.qcow2 "write -P 9 150M 4k"
same_bitmaps src2.qcow2 dst.qcow2
grep -q "^ *157286400 .* 1  dirty" "$TMP/B.1.map" || fail "dst.qcow2: enabled e missed a write"
td convert --bitmaps -O qcow2 dst.qcow2 dst2.qcow2
io_ok thindisk dst2.qcow2 "write -P 10 160M 4k"
io_ok qemu-io src2.qcow2 "write -P 10 160M 4k"
same_bitmaps src2.qcow2 dst2.qcow2

# Without --bitmaps they are dropped.
td convert -O qcow2 src.qcow2 plain.qcow2
assert_eq "[]" "$(qemu_bitmaps plain.qcow2)" "convert without --bitmaps"

log "the other way: qemu-img convert --bitmaps of thindisk's destination"
ok timeout 120 "$QEMU_IMG" convert --bitmaps -O qcow2 dst.qcow2 back.qcow2
qemu_check back.qcow2
same_bitmaps dst.qcow2 back.qcow2

log "convert --bitmaps onto an NBD export"
spawn nbdkit nbdkit -f -U "$TMP/mem.sock" memory 1G
wait_for_socket "$TMP/mem.sock"
wait_accepting "$(uri mem.sock)"
td convert --bitmaps -O qcow2 src.qcow2 "$(uri mem.sock)"
ok timeout 120 nbdcopy "$(uri mem.sock)" export.img
kill_server "$SERVER_PID"
qemu_check export.img
same_bitmaps src.qcow2 export.img

log "errors, as qemu-img reports them"
# An in_use bitmap: qemu-nbd opened the image read-write, wrote, was killed.
ok "$QEMU_IMG" create -q -f qcow2 inuse.qcow2 256M
ok "$QEMU_IMG" bitmap --add inuse.qcow2 e
ok "$QEMU_IMG" bitmap --add --disable inuse.qcow2 d
rm -f "$TMP/rw.sock"
qemu_nbd_unix rw "$TMP/rw.sock" -t -f qcow2 inuse.qcow2
wait_accepting "$(uri rw.sock)"
ok timeout 30 "$QEMU_IO" -f raw -c "write -P 1 2M 64k" "$(uri rw.sock)"
kill_server "$SERVER_PID" KILL
assert_eq '[["in-use","auto"],["in-use"]]' "$(qemu_bitmaps inuse.qcow2 | jq -c 'map(.flags)')" \
  "inuse.qcow2: flags after kill -9"
cp inuse.qcow2 mixed.qcow2
ok "$QEMU_IMG" bitmap --add mixed.qcow2 good
io_ok qemu-io mixed.qcow2 "write -P 2 5M 4k"
for img in inuse.qcow2 mixed.qcow2; do
  for opts in cluster_size=65536,extended_l2=off cluster_size=131072; do
    measure_agrees "$img" "$opts"
  done
done

same_stderr_as_qemu "in_use bitmap" convert --bitmaps -O qcow2 inuse.qcow2 q1.qcow2 -- \
  convert --bitmaps -O qcow2 inuse.qcow2 t1.qcow2
assert_absent t1.qcow2 "refused in_use conversion"
ok timeout 60 "$QEMU_IMG" convert --bitmaps --skip-broken-bitmaps -O qcow2 mixed.qcow2 q2.qcow2
sed 's/qemu-img/thindisk/g' "$ERR" >"$TMP/.qemu-err"
td convert --bitmaps --skip-broken-bitmaps -O qcow2 mixed.qcow2 t2.qcow2
diff "$TMP/.qemu-err" "$ERR" >&2 || fail "--skip-broken-bitmaps: warnings differ from qemu-img's"
qemu_check t2.qcow2
assert_eq '["good"]' "$(qemu_bitmaps t2.qcow2 | jq -c 'map(.name)')" "skip-broken: bitmaps kept"
same_bitmaps q2.qcow2 t2.qcow2
same_stderr_as_qemu "--skip-broken-bitmaps without --bitmaps" \
  convert --skip-broken-bitmaps -O qcow2 mixed.qcow2 q3.qcow2 -- \
  convert --skip-broken-bitmaps -O qcow2 mixed.qcow2 t3.qcow2
assert_absent t3.qcow2 "--skip-broken-bitmaps without --bitmaps"
same_stderr_as_qemu "raw destination" convert --bitmaps -O raw src.qcow2 q4.raw -- \
  convert --bitmaps -O raw src.qcow2 t4.raw
assert_absent t4.raw "raw destination"
same_stderr_as_qemu "compat=0.10 destination" \
  convert --bitmaps -O qcow2 -o compat=0.10 src.qcow2 q5.qcow2 -- \
  convert --bitmaps -O qcow2 -o compat=0.10 src.qcow2 t5.qcow2
assert_absent t5.qcow2 "compat=0.10 destination"
ok "$QEMU_IMG" convert -O raw src.qcow2 src.raw
same_stderr_as_qemu "raw source" convert --bitmaps -f raw -O qcow2 src.raw q6.qcow2 -- \
  convert --bitmaps -f raw -O qcow2 src.raw t6.qcow2
assert_absent t6.qcow2 "raw source"
ok "$QEMU_IMG" create -q -f qcow2 -o compat=0.10 v2.qcow2 64M
same_stderr_as_qemu "version 2 source" convert --bitmaps -O qcow2 v2.qcow2 q7.qcow2 -- \
  convert --bitmaps -O qcow2 v2.qcow2 t7.qcow2
assert_absent t7.qcow2 "version 2 source"

echo "PASS [$TEST_NAME]"

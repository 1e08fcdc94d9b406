#!/usr/bin/env bash
# --image-opts on the image tools, against qemu-img given the same option
# strings: the string names the file, its format (driver=, or probed when
# only file.filename= is given), its cache mode and, for driver=raw, a
# byte window (offset=, size=).
#   1. readers: info (JSON fields), map (JSON extents), check, compare
#      (equal, different, a window of one image against a file holding the
#      same bytes), measure and dd of a window, each as qemu-img's;
#      cache.direct=on opens with O_DIRECT (strace) in compare, one image
#      only.
#   2. convert: a raw window and a probed qcow2 as sources (one, then both
#      concatenated), and -n --target-image-opts into an existing qcow2;
#      the outputs equal qemu-img convert's.
#   3. writers: resize, snapshot -c, bitmap --add, amend, rebase -u and
#      commit through option strings change the image as the same qemu-img
#      commands do.
#   4. refusals, exit 1 and the image as it was: -f (or -O) beside the
#      option strings, an unknown key, driver=luks, filename= without
#      driver=file, read-only=on for a writer, offset= where a window means
#      nothing, a window past the image's end, --target-image-opts without
#      -n.
source "$(dirname "$0")/lib.sh"
require_tool "$QEMU_IMG" "$QEMU_IO" jq strace md5sum python3
require_thindisk

M=$((1 << 20))
# A qcow2 with data, a zeroed run and holes; its raw copy; a file holding
# bytes [8M, 12M) of it.
"$QEMU_IMG" create -q -f qcow2 in.qcow2 32M
"$QEMU_IO" -f qcow2 -c "write -P 0x11 0 3M" -c "write -P 0x22 9M 2M" \
  -c "write -z 10M 64k" -c "write -P 0x33 31M 1M" in.qcow2 >/dev/null
"$QEMU_IMG" convert -f qcow2 -O raw in.qcow2 in.raw
dd if=in.raw of=win.raw bs=1M skip=8 count=4 status=none
Q="driver=qcow2,file.driver=file,file.filename=in.qcow2"
P="file.filename=in.qcow2"  # no driver: probed
W="driver=raw,file.filename=in.raw,offset=8M,size=4M"

log "readers: info, map, check, compare, measure, dd"
for s in "$Q" "$P"; do
  ok "$QEMU_IMG" info --output=json --image-opts "$s"
  jq -c '{f: .format, v: ."virtual-size", c: ."cluster-size"}' "$OUT" >q.json
  td info --output=json --image-opts "$s"
  jq -c '{f: .format, v: ."virtual-size", c: ."cluster-size"}' "$OUT" >t.json
  assert_eq "$(cat q.json)" "$(cat t.json)" "info --image-opts $s"
  ok "$QEMU_IMG" map --output=json --image-opts "$s"
  jq -c 'map({start, length, data, zero})' "$OUT" >q.json
  td map --output=json --image-opts "$s"
  jq -c 'map({start, length, data, zero})' "$OUT" >t.json
  assert_eq "$(cat q.json)" "$(cat t.json)" "map --image-opts $s"
  td check --image-opts "$s"
done
td compare --image-opts "$Q" "driver=raw,file.filename=in.raw"
td compare --image-opts "$W" "driver=raw,file.filename=win.raw"
capture "$QEMU_IMG" compare --image-opts "$W" "driver=raw,file.filename=in.raw,offset=4M,size=4M"
cp "$OUT" q.out
capture "$TD" compare --image-opts "$W" "driver=raw,file.filename=in.raw,offset=4M,size=4M"
assert_eq 1 "$RC" "compare of two different windows (exit status)"
assert_eq "$(cat q.out)" "$(cat "$OUT")" "compare of two different windows"
grep -q "Content mismatch at offset 1048576" "$OUT" || fail "compare of windows: $(cat "$OUT")"
# cache.direct=on on the first image only: O_DIRECT opens that file alone.
capture_traced openat,fcntl compare.trace "$TD" compare --image-opts \
  "$Q,cache.direct=on" "driver=raw,file.filename=in.raw"
assert_eq 0 "$RC" "compare with cache.direct=on"
assert_eq 1 "$(direct_fds compare.trace in.qcow2)" "O_DIRECT descriptors of in.qcow2 (cache.direct=on)"
assert_eq 0 "$(direct_fds compare.trace in.raw)" "O_DIRECT descriptors of in.raw (no cache.*)"
# measure and dd of the window: qemu-img's figures and bytes.
for src in "$W" "$Q"; do
  ok "$QEMU_IMG" measure --output=json -O qcow2 -o cluster_size=64k --image-opts "$src"
  cp "$OUT" q.json
  td measure --output=json -O qcow2 -o cluster_size=64k,extended_l2=off --image-opts "$src"
  assert_eq "$(jq -c . q.json)" "$(jq -c . "$OUT")" "measure --image-opts $src"
done
"$QEMU_IMG" dd --image-opts -O raw bs=64k skip=3 count=40 "if=$W" of=qdd.raw
td dd --image-opts -O raw bs=64k skip=3 count=40 "if=$W" of=tdd.raw
assert_same_bytes tdd.raw qdd.raw "dd --image-opts of a window"

log "convert: windows, probed sources, --target-image-opts"
"$QEMU_IMG" convert --image-opts -O qcow2 "$W" q1.qcow2
td convert --image-opts -O qcow2 "$W" t1.qcow2
ok "$QEMU_IMG" compare q1.qcow2 t1.qcow2
ok "$QEMU_IMG" compare -F raw t1.qcow2 win.raw
qemu_check t1.qcow2
"$QEMU_IMG" convert --image-opts -O raw "$W" "$P" q2.raw
td convert --image-opts -O raw "$W" "$P" t2.raw
assert_same_bytes t2.raw q2.raw "convert --image-opts of a window and a probed qcow2"
"$QEMU_IMG" create -q -f qcow2 tq.qcow2 40M
"$QEMU_IMG" create -q -f qcow2 qq.qcow2 40M
"$QEMU_IMG" convert -n --target-image-opts in.qcow2 "driver=qcow2,file.filename=qq.qcow2"
td convert -n --target-image-opts in.qcow2 "file.filename=tq.qcow2,cache.direct=on"
ok "$QEMU_IMG" compare tq.qcow2 qq.qcow2
qemu_check tq.qcow2

log "writers: resize, snapshot, bitmap, amend, rebase, commit"
cp in.qcow2 q.qcow2
cp in.qcow2 t.qcow2
"$QEMU_IMG" resize -q --image-opts "driver=qcow2,file.filename=q.qcow2" +1M
td resize -q --image-opts "driver=qcow2,file.filename=t.qcow2" +1M
"$QEMU_IMG" snapshot --image-opts -c s1 "driver=qcow2,file.filename=q.qcow2"
td snapshot --image-opts -c s1 "driver=qcow2,file.filename=t.qcow2"
"$QEMU_IMG" bitmap --image-opts --add "driver=qcow2,file.filename=q.qcow2" b0
td bitmap --image-opts --add "driver=qcow2,file.filename=t.qcow2" b0
"$QEMU_IMG" amend --image-opts -o lazy_refcounts=on "driver=qcow2,file.filename=q.qcow2"
td amend --image-opts -o lazy_refcounts=on "driver=qcow2,file.filename=t.qcow2"
for f in q t; do
  ok "$QEMU_IMG" info --output=json "$f.qcow2"
  jq -c '{v: ."virtual-size", s: [.snapshots[].name],
          b: [."format-specific".data.bitmaps[].name],
          l: ."format-specific".data."lazy-refcounts"}' "$OUT" >"$f.json"
done
assert_eq "$(cat q.json)" "$(cat t.json)" "resize, snapshot, bitmap and amend through --image-opts"
grep -q '"s":\["s1"\]' t.json || fail "the writers changed nothing: $(cat t.json)"
qemu_check t.qcow2
# rebase -u and commit: an overlay over in.qcow2, committed into a copy.
for f in q t; do
  cp in.qcow2 "base-$f.qcow2"
  "$QEMU_IMG" create -q -f qcow2 -b in.qcow2 -F qcow2 "top-$f.qcow2"
  "$QEMU_IO" -f qcow2 -c "write -P 0x44 20M 1M" "top-$f.qcow2" >/dev/null
done
"$QEMU_IMG" rebase -u --image-opts -b base-q.qcow2 -F qcow2 "driver=qcow2,file.filename=top-q.qcow2"
td rebase -u --image-opts -b base-t.qcow2 -F qcow2 "driver=qcow2,file.filename=top-t.qcow2"
assert_eq base-t.qcow2 "$("$QEMU_IMG" info --output=json top-t.qcow2 | jq -r '."backing-filename"')" \
  "the backing file after rebase -u --image-opts"
"$QEMU_IMG" commit -q --image-opts "driver=qcow2,file.filename=top-q.qcow2"
td commit -q --image-opts "driver=qcow2,file.filename=top-t.qcow2,cache.direct=on"
ok "$QEMU_IMG" compare base-q.qcow2 base-t.qcow2
qemu_check base-t.qcow2

log "refusals"
before=$(md5sum <in.qcow2)
td_fails "--image-opts and -f are mutually exclusive" "-f beside --image-opts" \
  info --image-opts -f qcow2 "$Q"
td_fails "unsupported key 'bogus'" "an unknown key" info --image-opts "$Q,bogus=1"
td_fails "driver=luks is not supported" "driver=luks" info --image-opts "driver=luks,file.filename=in.qcow2"
td_fails "give driver=" "filename= alone" info --image-opts "filename=in.qcow2"
td_fails "use file.filename=" "filename= under driver=qcow2" info --image-opts "driver=qcow2,filename=in.qcow2"
td_fails "read-only=on, but thindisk resize writes the image" "read-only=on for a writer" \
  resize --image-opts "$Q,read-only=on" +1M
td_fails "discard= and detect-zeroes= are" "discard= for a writer" \
  commit --image-opts "$Q,discard=unmap"
td_fails "offset= and size= are not supported by thindisk map" "a window for map" \
  map --image-opts "driver=raw,file.filename=in.raw,offset=1M"
td_fails "offset 30408704 \+ size 4194304 is past the image size 33554432" "a window past the end" \
  convert --image-opts -O raw "driver=raw,file.filename=in.raw,offset=29M,size=4M" past.raw
assert_absent past.raw "the convert of a window past the end"
td_fails "--target-image-opts requires use of -n flag" "--target-image-opts without -n" \
  convert --target-image-opts in.qcow2 "driver=raw,file.filename=x.raw"
td_fails "--image-opts and -O are mutually exclusive" "-O beside --target-image-opts" \
  convert -n -O raw --target-image-opts in.qcow2 "driver=raw,file.filename=in.raw"
assert_absent x.raw "the refused convert commands"
assert_eq "$before" "$(md5sum <in.qcow2)" "in.qcow2 after the refused commands"

echo PASS

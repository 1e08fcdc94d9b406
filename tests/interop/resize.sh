#!/usr/bin/env bash
# thindisk resize against qemu-img resize 7.2, each on its own copy of the
# same image: grow, shrink with and without data (thindisk refuses data
# unless --force), sizes that are not cluster aligned then grown again
# (the regrown part reads as zeros), growth with each preallocation mode
# (same allocation as qemu-img's), raw files, a backing chain, and the
# error cases. Afterwards both copies must read the same (qemu-img compare)
# and thindisk's must pass qemu-img check.
source "$(dirname "$0")/lib.sh"
require_tool "$QEMU_IMG" "$QEMU_IO" cmp stat
require_thindisk

M=$((1 << 20))
SIZE=$((64 * M))

# same_content A B: qemu-img compare (virtual sizes too).
same_content() {
  ok "$QEMU_IMG" compare "$1" "$2"
  assert_eq "$("$QEMU_IMG" info --output=json "$1" | jq '."virtual-size"')" \
    "$("$QEMU_IMG" info --output=json "$2" | jq '."virtual-size"')" "virtual size of $1 vs $2"
}

# pair NAME OPTS: a qcow2 image with data in [0, 48M), copied to NAME.td
# (thindisk resizes it) and NAME.qemu (qemu-img does).
pair() {
  local name=$1 opts=$2
  td create -q -f qcow2 ${opts:+-o "$opts"} "$name.td" "$SIZE"
  io_ok thindisk "$name.td" "write -P 0x5a 0 $((48 * M))" "write -P 0x6b $((20 * M + 512)) 3000"
  cp "$name.td" "$name.qemu"
}

for opts in "" "cluster_size=65536,extended_l2=off" "cluster_size=4096,compat=0.10"; do
  log "layout: ${opts:-defaults}"
  # Grow: instant, new space reads as zeros, same as qemu-img.
  pair grow "$opts"
  td resize grow.td +$((64 * M))
  ok "$QEMU_IMG" resize -q grow.qemu +$((64 * M))
  same_content grow.td grow.qemu
  qemu_check grow.td
  io_ok thindisk grow.td "read -P 0 $((48 * M)) $((80 * M))"

  # Shrink without --shrink: refused, image untouched.
  pair shrink "$opts"
  capture "$TD" resize shrink.td $((32 * M))
  [[ $RC -ne 0 ]] || fail "shrink without --shrink succeeded"
  grep -q -- "--shrink" "$ERR" || fail "error does not mention --shrink: $(cat "$ERR")"
  assert_same_bytes shrink.td shrink.qemu "refused resize changed the image"

  # Shrink over data: refused, the error names the range; image untouched.
  capture "$TD" resize --shrink shrink.td $((32 * M))
  [[ $RC -ne 0 ]] || fail "shrink over data succeeded without --force"
  grep -qE "0x2000000" "$ERR" || fail "error does not name the data range: $(cat "$ERR")"
  assert_same_bytes shrink.td shrink.qemu "refused shrink changed the image"

  # --force: warns naming the data, then behaves as qemu-img --shrink.
  td resize --shrink --force shrink.td $((32 * M))
  grep -q "warning: .*0x2000000" "$ERR" || fail "--force did not warn naming the data: $(cat "$ERR")"
  ok "$QEMU_IMG" resize -q --shrink shrink.qemu $((32 * M))
  same_content shrink.td shrink.qemu
  qemu_check shrink.td
  td_size=$(stat -c %s shrink.td)
  qemu_size=$(stat -c %s shrink.qemu)
  echo "shrink 64M->32M (${opts:-defaults}): file thindisk $td_size, qemu-img $qemu_size bytes"
  # Known gap: with small clusters a refcount block sits at the start of
  # each host range it counts and is not freed when that range empties, so
  # the file cannot be cut below the last one (qemu frees them).
  if [[ $opts != *cluster_size=4096* ]]; then
    ((td_size <= qemu_size + 4 * M)) || fail "thindisk did not give the cut space back ($td_size)"
  fi

  # Shrink where the cut range holds no data (discarded first), to a size
  # that is not cluster aligned, then grow again: the regrown tail reads as
  # zeros, in thindisk and in qemu, and matches qemu-img's result.
  pair unaligned "$opts"
  new=$((40 * M + 1536))
  io_ok thindisk unaligned.td "discard $new $((SIZE - new))"
  io_ok qemu-io unaligned.qemu "discard $new $((SIZE - new))"
  td resize --shrink unaligned.td $new
  ok "$QEMU_IMG" resize -q --shrink unaligned.qemu $new
  same_content unaligned.td unaligned.qemu
  qemu_check unaligned.td
  td resize unaligned.td $SIZE
  ok "$QEMU_IMG" resize -q unaligned.qemu $SIZE
  io_ok qemu-io unaligned.td "read -P 0x5a $((24 * M)) $((new - 24 * M))" "read -P 0 $new $((SIZE - new))"
  qemu_check unaligned.td
  # qemu ignores the sub-subcluster part of the discard and regrows over
  # the old bytes; thindisk zeroed them at shrink time. Below the cut both
  # read the same.
  rm -f u.td.raw u.qemu.raw
  ok "$QEMU_IMG" convert -O raw unaligned.td u.td.raw
  ok "$QEMU_IMG" convert -O raw unaligned.qemu u.qemu.raw
  cmp -n $new u.td.raw u.qemu.raw >&2 || fail "unaligned: content below the cut differs"
  stale=$(cmp -l u.td.raw u.qemu.raw | wc -l || true)
  echo "regrown tail after an unaligned shrink: thindisk reads zeros; qemu-img shows $stale old bytes"

  # qemu-img shrinks through data to an unaligned size (leaving old bytes
  # in the last cluster's tail); thindisk grows it: the tail reads zeros.
  pair gap "$opts"
  ok "$QEMU_IMG" resize -q --shrink gap.td $new
  td resize gap.td $SIZE
  io_ok thindisk gap.td "read -P 0x5a $((24 * M)) $((new - 24 * M))" "read -P 0 $new $((SIZE - new))"
  qemu_check gap.td
done

log "qcow2 preallocation"
# mapped_bytes IMAGE FROM TO: guest bytes in [FROM, TO) that qemu-img map
# shows with a host offset (data, or host space reserved behind zeros).
mapped_bytes() {
  "$QEMU_IMG" map --output=json "$1" | jq --argjson s "$2" --argjson e "$3" \
    '[.[] | select(has("offset")) | ([.start + .length, $e] | min) - ([.start, $s] | max)
      | select(. > 0)] | add // 0'
}
allocated_clusters() { "$QEMU_IMG" check --output=json "$1" | jq '."allocated-clusters"'; }
host_blocks() { echo $(($(stat -c %b "$1") * 512)); }
old=$((8 * M + 512))  # the old end cuts a cluster
new=$((40 * M))
for opts in "" "cluster_size=65536,extended_l2=off" "cluster_size=4096,compat=0.10"; do
  for mode in metadata falloc full; do
    td create -q -f qcow2 ${opts:+-o "$opts"} pre.td $old
    io_ok thindisk pre.td "write -P 0x5a 0 $M" "write -P 0x6b $((old - 4608)) 4608"
    cp pre.td pre.qemu
    td resize --preallocation=$mode pre.td $new
    ok "$QEMU_IMG" resize -q --preallocation=$mode pre.qemu $new
    same_content pre.td pre.qemu
    qemu_check pre.td
    io_ok qemu-io pre.td "read -P 0x6b $((old - 4608)) 4608" "read -P 0 $old $((new - old))"
    # The same allocation as qemu-img's: every cluster of the grown range
    # has host space (qemu-img map gives it an offset; check counts it).
    td_mapped=$(mapped_bytes pre.td $old $new)
    qemu_mapped=$(mapped_bytes pre.qemu $old $new)
    assert_eq "$qemu_mapped" "$td_mapped" "${opts:-defaults} $mode: bytes of the grown range mapped"
    ((td_mapped >= new - old - M)) || fail "$mode: only $td_mapped grown bytes mapped"
    assert_eq "$(allocated_clusters pre.qemu)" "$(allocated_clusters pre.td)" \
      "${opts:-defaults} $mode: allocated clusters"
    # falloc and full own the host space, metadata leaves it sparse.
    td_blocks=$(host_blocks pre.td)
    if [[ $mode == metadata ]]; then
      ((td_blocks < 16 * M)) || fail "metadata preallocation took $td_blocks host bytes"
    else
      ((td_blocks >= new - old - M)) || fail "$mode preallocation took only $td_blocks host bytes"
    fi
    echo "preallocation=$mode (${opts:-defaults}): host bytes thindisk $td_blocks," \
      "qemu-img $(host_blocks pre.qemu); grown bytes mapped $td_mapped"
    # Writes into the preallocated range use it: the file does not grow.
    size_before=$(stat -c %s pre.td)
    io_ok thindisk pre.td "write -P 0x7c $old $((new - old))"
    assert_eq "$size_before" "$(stat -c %s pre.td)" "$mode: file size after filling the grown range"
    io_ok qemu-io pre.td "read -P 0x7c $old $((new - old))"
    qemu_check pre.td
  done
done
# A clone grown with preallocation reads zeros, not its backing file.
td create -q -f qcow2 pbase.qcow2 $((64 * M))
io_ok thindisk pbase.qcow2 "write -P 0x11 0 $((64 * M))"
for opts in "" "extended_l2=off"; do
  td create -q -f qcow2 ${opts:+-o "$opts"} -b pbase.qcow2 -F qcow2 ptop.td $((16 * M + 512))
  cp ptop.td ptop.qemu
  td resize --preallocation=metadata ptop.td $((96 * M))
  ok "$QEMU_IMG" resize -q --preallocation=metadata ptop.qemu $((96 * M))
  same_content ptop.td ptop.qemu
  io_ok qemu-io ptop.td "read -P 0x11 0 $((16 * M + 512))" "read -P 0 $((16 * M + 512)) $((80 * M - 512))"
  qemu_check ptop.td
done

log "raw"
head -c $((8 * M)) /dev/urandom >r.td
truncate -s $((16 * M)) r.td
cp r.td r.qemu
td resize -f raw r.td +1000
ok "$QEMU_IMG" resize -q -f raw r.qemu +1000
assert_same_bytes r.td r.qemu "raw grow"
capture "$TD" resize -f raw --shrink r.td $((4 * M))
[[ $RC -ne 0 ]] || fail "raw shrink over data succeeded without --force"
td resize -f raw --shrink r.td $((12 * M))  # only a hole is cut
ok "$QEMU_IMG" resize -q -f raw --shrink r.qemu $((12 * M))
assert_same_bytes r.td r.qemu "raw shrink over a hole"
td resize -f raw --shrink --force r.td $((4 * M + 7))
ok "$QEMU_IMG" resize -q -f raw --shrink r.qemu $((4 * M + 7))
assert_same_bytes r.td r.qemu "raw shrink --force"
td resize -f raw --preallocation=full r.td $((6 * M))
ok "$QEMU_IMG" resize -q -f raw --preallocation=full r.qemu $((6 * M))
assert_same_bytes r.td r.qemu "raw grow preallocation=full"

log "backing chain"
td create -q -f qcow2 base.qcow2 "$SIZE"
io_ok thindisk base.qcow2 "write -P 0x11 0 $SIZE"
for tool in td qemu; do
  td create -q -f qcow2 -b base.qcow2 -F qcow2 "top.$tool" "$SIZE"
  io_ok thindisk "top.$tool" "write -P 0x22 $((4 * M)) $((4 * M))"
done
# The clone's own data lies below the cut: shrinking is allowed (backing
# data past the end is not this image's). Regrown space reads as zeros,
# not as the base image.
td resize --shrink top.td $((16 * M + 512))
ok "$QEMU_IMG" resize -q --shrink top.qemu $((16 * M + 512))
same_content top.td top.qemu
td resize top.td $((96 * M))
ok "$QEMU_IMG" resize -q top.qemu $((96 * M))
same_content top.td top.qemu
io_ok qemu-io top.td "read -P 0x11 0 $((4 * M))" "read -P 0x22 $((4 * M)) $((4 * M))" \
  "read -P 0x11 $((8 * M)) $((8 * M + 512))" "read -P 0 $((16 * M + 512)) $((80 * M - 512))"
qemu_check top.td
capture "$TD" resize --shrink top.td $((6 * M))
[[ $RC -ne 0 ]] || fail "clone shrink over its own data succeeded"

log "errors"
td_fails "multiple of 512" "unaligned qcow2 size" resize top.td $((16 * M + 100))
td_fails "cannot shrink by" "shrink below 0" resize --shrink top.td -- -1G
td_fails "missing.qcow2" "missing file" resize missing.qcow2 1G
td_fails "" "bad size" resize top.td 12Q
td_fails "preallocation cannot be used when shrinking" "shrink with preallocation" \
  resize --shrink --preallocation=metadata top.td $((16 * M))
td resize --shrink top.td -- -$((32 * M))  # relative shrink through '--'
assert_eq $((64 * M)) "$("$QEMU_IMG" info --output=json top.td | jq '."virtual-size"')" "relative shrink"
qemu_check top.td
echo "PASS [$TEST_NAME]"

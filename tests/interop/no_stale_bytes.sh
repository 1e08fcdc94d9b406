#!/usr/bin/env bash
# No stale bytes (DESIGN.md P2): poison the image with 0xAA, free it (discard,
# write zeroes, shrink), make thindisk allocate again so freed host clusters
# are reused, then read everything: no 0xAA may be readable anywhere it was
# not most recently written. Preallocated images must read as zeros only.
source "$(dirname "$0")/lib.sh"
require_tool "$QEMU_IMG" cmp
require_thindisk

SIZE=$((64 << 20))
M=$((1 << 20))

# expect_bytes IMAGE AA_COUNT 55_COUNT: converts IMAGE with thindisk and with
# qemu-img, requires identical bytes and exactly these counts of 0xAA/0x55.
expect_bytes() {
  local img=$1 want_aa=$2 want_55=$3
  rm -f td.raw qemu.raw
  td convert -O raw "$img" td.raw
  ok "$QEMU_IMG" convert -O raw "$img" qemu.raw
  assert_same_bytes qemu.raw td.raw "$img: thindisk and qemu-img read different bytes"
  assert_eq "$want_aa" "$(count_byte td.raw aa)" "$img: readable 0xAA (poison) bytes"
  assert_eq "$want_55" "$(count_byte td.raw 55)" "$img: readable 0x55 bytes"
}

# poison_reuse NAME CLUSTER OPTS: the main scenario on one configuration.
poison_reuse() {
  local name=$1 c=$2 opts=$3
  log "poison and reuse: $name"
  local img=$name.qcow2 cmds=() i
  td create -f qcow2 ${opts:+-o "$opts"} "$img" "$SIZE"

  # 1. Poison 16 MiB, plus one 4 KiB range that stays (proves the count works).
  io_ok thindisk "$img" "write -P 0xaa 0 $((16 * M))" "write -P 0xaa $((60 * M)) 4096"
  # 2. Free it: discard 12 MiB, write zeroes (may unmap) over 4 MiB.
  io_ok thindisk "$img" "discard 0 $((12 * M))" "write -z -u $((12 * M)) $((4 * M))"
  # 3. Allocate elsewhere: 4 KiB and 1 KiB first writes, one per cluster, so
  #    each lands in a (probably reused) host cluster of which it covers a
  #    fraction. Every byte of that cluster not written must read as zeros.
  cmds=()
  for ((i = 0; i < 96; i++)); do
    cmds+=("write -P 0x55 $((32 * M + i * c + 4096)) 4096")
    cmds+=("write -P 0x55 $((44 * M + i * c + 512)) 1024")
  done
  io_ok thindisk "$img" "${cmds[@]}"
  # 4. Within one process too: free and reallocate before any flush.
  io_ok thindisk "$img" "write -P 0xaa $((20 * M)) $((2 * M))" "discard $((20 * M)) $((2 * M))" \
    "write -P 0x55 $((24 * M + 8192)) 4096" "read -P 0 $((20 * M)) $((2 * M))"
  # 5. Sub-cluster frees inside a kept cluster: discard and zero pieces.
  io_ok thindisk "$img" "write -P 0xaa $((26 * M)) $c" "discard $((26 * M + c / 2)) $((c / 8))" \
    "write -z $((26 * M + c / 4)) $((c / 8))"
  ok "$QEMU_IMG" check "$img"
  expect_bytes "$img" $((4096 + c - c / 4)) $((96 * 4096 + 96 * 1024 + 4096))
}

poison_reuse default 131072 ""
poison_reuse c64k-standard-l2 65536 "cluster_size=65536,extended_l2=off"
poison_reuse c4k-compat010 4096 "cluster_size=4096,compat=0.10"

# A clone: discarding or zeroing in the overlay hides the poisoned base.
log "poisoned base, clean clone"
td create -f qcow2 base.qcow2 "$SIZE"
io_ok thindisk base.qcow2 "write -P 0xaa 0 $((16 * M))"
td create -f qcow2 -b base.qcow2 -F qcow2 clone.qcow2 "$SIZE"
io_ok thindisk clone.qcow2 "discard 0 $((8 * M))" "write -z $((8 * M)) $((4 * M))" \
  "write -P 0x55 $((4 * M + 512)) 1024"
ok "$QEMU_IMG" check clone.qcow2
expect_bytes clone.qcow2 $((4 * M)) 1024

# Truncated, then regrown: the regrown tail reads as zeros.
log "shrink and regrow"
td create -f qcow2 grow.qcow2 "$SIZE"
io_ok thindisk grow.qcow2 "write -P 0xaa $((48 * M)) $((16 * M))"
# The cut-off range holds data, so the shrink needs --force (it warns).
td resize --shrink --force grow.qcow2 $((40 * M))
td resize grow.qcow2 "$SIZE"
io_ok thindisk grow.qcow2 "read -P 0 $((40 * M)) $((24 * M))"
ok "$QEMU_IMG" check grow.qcow2
expect_bytes grow.qcow2 0 0

# Preallocated images read as zeros only, whatever the mode.
PREALLOC_SIZE=$((32 * M))
head -c "$PREALLOC_SIZE" /dev/zero >zeros.raw
for mode in metadata falloc full; do
  for opts in "" "cluster_size=65536,extended_l2=off,"; do
    log "preallocation=$mode ${opts:-defaults}"
    img=prealloc-$mode.qcow2
    rm -f "$img"
    td create -f qcow2 -o "${opts}preallocation=$mode" "$img" "$PREALLOC_SIZE"
    io_ok thindisk "$img" "read -P 0 0 $PREALLOC_SIZE"
    ok "$QEMU_IMG" check "$img"
    rm -f td.raw
    td convert -O raw "$img" td.raw
    assert_same_bytes zeros.raw td.raw "$img: preallocated image does not read as zeros"
  done
done
echo "PASS [$TEST_NAME]"

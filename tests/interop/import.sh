#!/usr/bin/env bash
# Import: vmdk and vhd ("vpc") images written by qemu-img open in thindisk.
# For each layout qemu-img can write (vmdk monolithicSparse, monolithicFlat,
# streamOptimized; vpc dynamic and fixed):
#  - `thindisk info` names the format and agrees with `qemu-img info`
#    (virtual size, and every other field both print);
#  - `thindisk convert -O qcow2` gives an image `qemu-img compare` finds
#    identical to the source and `qemu-img check` finds clean, with the
#    source's holes still holes (qemu-img map and thindisk map agree) and a
#    file far smaller than the disk;
#  - `thindisk compare` against the raw original says identical, and
#    against a changed copy says different;
#  - opening one for writing fails with a clear message.
source "$(dirname "$0")/lib.sh"
require_tool "$QEMU_IMG" "$QEMU_IO" jq
require_thindisk

MIB=$((1024 * 1024))
SIZE=$((16 * MIB))
# Data and holes. 12M gets real zero bytes (allocated in the raw file) that
# must not become data; 3M is written with -z.
ok "$QEMU_IMG" create -q -f raw src.raw "$SIZE"
io_ok qemu-io-raw src.raw \
  "write -P 0xaa 0 64k" "write -P 0xbb 1M 100k" "write -z 3M 64k" "write -P 0xcc 5M 4k" \
  "write -P 0xdd 9M 1M" "write -P 0x00 12M 64k" "write -P 0xee 15M 512"
DATA_OFFSETS=(0 $((1 * MIB)) $((5 * MIB)) $((9 * MIB)) $((15 * MIB)))
# Holes in every layout (vpc blocks are 2 MiB: blocks 1, 3 and 6 hold nothing).
HOLE_OFFSETS=($((3 * MIB)) $((7 * MIB)) $((12 * MIB + 4096)))
cp src.raw changed.raw
io_ok qemu-io-raw changed.raw "write -P 0x01 $((9 * MIB + 777)) 1"

# map_flag MAPJSON OFFSET FIELD: FIELD (data/zero) of the map entry holding OFFSET.
map_flag() {
  jq -r --argjson o "$2" --arg f "$3" \
    '[.[] | select(.start <= $o and $o < .start + .length)][0][$f]' "$1"
}

# holes_and_data MAPJSON WHAT: the map has no data at HOLE_OFFSETS and data
# at DATA_OFFSETS.
holes_and_data() {
  local o
  for o in "${HOLE_OFFSETS[@]}"; do
    assert_eq false "$(map_flag "$1" "$o" data)" "$2 data at $o"
  done
  for o in "${DATA_OFFSETS[@]}"; do
    assert_eq true "$(map_flag "$1" "$o" data)" "$2 data at $o"
  done
}

# check_info IMAGE FORMAT [OPTION...]: thindisk info (given the OPTIONs)
# names the format and the size qemu-img reports when told the format.
check_info() {
  local img=$1 fmt=$2
  ok "$QEMU_IMG" info -f "$fmt" --output=json "$img"
  local qemu_size
  qemu_size=$(jq '."virtual-size"' "$OUT")
  td info "${@:3}" --output=json "$img"
  assert_eq "$fmt" "$(jq -r .format "$OUT")" "$img: thindisk info format"
  assert_eq "$qemu_size" "$(jq '."virtual-size"' "$OUT")" "$img: virtual size"
  td info "${@:3}" "$img"
  grep -q "^file format: $fmt$" "$OUT" || fail "$img: human info does not say $fmt: $(cat "$OUT")"
}

run_case() {
  local name=$1 fmt=$2 opts=$3
  log "$name ($fmt${opts:+, $opts})"
  local img=$name.$fmt
  [[ $fmt == vpc ]] && img=$name.vhd
  # A fixed vhd probes as raw (its footer is in the last sector, which a raw
  # guest could write), in thindisk as in qemu-img: it is named with -f.
  local tf=()
  [[ $opts == *fixed* ]] && tf=(-f "$fmt")
  if [[ -n $opts ]]; then
    ok "$QEMU_IMG" convert -f raw -O "$fmt" -o "$opts" src.raw "$img"
  else
    ok "$QEMU_IMG" convert -f raw -O "$fmt" src.raw "$img"
  fi

  # 1. info, probed (fixed vhd: probed as raw by both tools, and named).
  check_info "$img" "$fmt" "${tf[@]}"
  if ((${#tf[@]})); then
    td info --output=json "$img"
    assert_eq raw "$(jq -r .format "$OUT")" "$img: a fixed vhd probes as raw"
  fi
  assert_info_agrees "$img" "${tf[@]}"
  if [[ $name == flat ]]; then
    td info --output=json "$img"
    assert_eq monolithicFlat "$(jq -r '."format-specific".data."create-type"' "$OUT")" \
      "$img: create type"
  fi

  # 2. The source's own map: holes are holes.
  td map "${tf[@]}" --output=json "$img"
  cp "$OUT" "$name.src-map.json"
  holes_and_data "$name.src-map.json" "$img: thindisk map"

  # 3. convert to qcow2: identical, clean, sparse.
  local out=$name.qcow2
  td convert "${tf[@]}" -O qcow2 "$img" "$out"
  ok "$QEMU_IMG" compare -f "$fmt" -F qcow2 "$img" "$out"
  ok "$QEMU_IMG" compare -f raw -F qcow2 src.raw "$out"
  ok "$QEMU_IMG" check "$out"
  ok "$QEMU_IMG" map --output=json "$out"
  cp "$OUT" "$name.qemu-map.json"
  holes_and_data "$name.qemu-map.json" "$out: qemu-img map"
  td map --output=json "$out"
  # qemu splits runs that differ in fields we don't compare; join them.
  local norm='reduce (.[] | {start, length, data, zero}) as $e ([];
    if length > 0 and .[-1].data == $e.data and .[-1].zero == $e.zero
    then .[-1].length += $e.length else . + [$e] end)'
  assert_eq "$(jq -c "$norm" "$name.qemu-map.json")" "$(jq -c "$norm" "$OUT")" \
    "$out: thindisk map vs qemu-img map"
  local bytes
  bytes=$(stat -c %s "$out")
  ((bytes < 3 * MIB)) || fail "$out: $bytes bytes for ~1.2 MiB of data (holes not kept?)"

  # 4. thindisk compare across formats (a vhd is CHS-rounded, so larger:
  #    its tail must read as zeros, as qemu-img compare demands).
  local cf=()
  ((${#tf[@]})) && cf=(-f "$fmt" -F raw)
  td compare "${cf[@]}" "$img" src.raw
  capture "$TD" compare "${cf[@]}" "$img" changed.raw
  assert_eq 1 "$RC" "$img vs changed.raw: thindisk compare exit"
  # Like qemu-img, compare names the sector that differs.
  grep -q "Content mismatch at offset $((9 * MIB + 512))!" "$OUT" ||
    fail "$img: compare did not name the changed byte: $(cat "$OUT" "$ERR")"

  # 5. Writes are refused with a message that says what to do.
  capture "$TD" io "${tf[@]}" -c "write -P 0x11 0 512" "$img"
  [[ $RC -ne 0 ]] || fail "$img: a write through thindisk io succeeded"
  grep -q "read-only in thindisk (import with convert)" "$ERR" ||
    fail "$img: write refusal says: $(cat "$ERR")"
}

run_case sparse vmdk ""
run_case flat vmdk "subformat=monolithicFlat"
run_case stream vmdk "subformat=streamOptimized"
run_case dynamic vpc ""
run_case fixed vpc "subformat=fixed"

# A split vmdk is refused clearly, without touching anything.
log "split vmdk is refused"
ok "$QEMU_IMG" convert -f raw -O vmdk -o subformat=twoGbMaxExtentSparse src.raw split.vmdk
capture "$TD" info split.vmdk
[[ $RC -ne 0 && $RC -lt 128 ]] || fail "split.vmdk: info exit $RC"
grep -q "split vmdk images" "$ERR" || fail "split.vmdk: message: $(cat "$ERR")"

echo "PASS [$TEST_NAME]"

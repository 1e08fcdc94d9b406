#!/usr/bin/env bash
# thindisk writes, qemu reads: images created by `thindisk create`, filled by
# `thindisk io` and recompressed by `thindisk convert -c` must pass
# `qemu-img check` with no leaks, read back through qemu-io as modelled,
# compare identical (`qemu-img compare`) to a raw file given the same writes
# through qemu-io, and `qemu-img info` must agree with `thindisk info`.
#
# Every row of MATRIX (model.sh) runs twice: a lone image and a
# base <- mid <- top chain.
source "$(dirname "$0")/lib.sh"
source "$INTEROP_DIR/model.sh"
require_tool "$QEMU_IMG" "$QEMU_IO" jq
require_thindisk

# td_layer LAYER FILE C S: applies layer_ops with `thindisk io`, records them
# in the model and appends the raw-file equivalent to RAW_CMDS.
# thindisk's discard always leaves zeros (v3: zero flags; v2: deallocate, or
# write zeros over a backing file), so it is modelled, and replayed on the
# raw reference, as write -z. Compressed writes are plain writes here:
# compression is exercised by `thindisk convert -c` below.
td_layer() {
  local layer=$1 file=$2 c=$3 s=$4
  local cmds=() op a b d
  while read -r op a b d; do
    case $op in
      w | c) cmds+=("write -P $a $b $d"); model_set "$layer" "$b" "$d" "${a#0x}" ;;
      z) cmds+=("write -z $a $b"); model_set "$layer" "$a" "$b" 00 ;;
      d | u) cmds+=("discard $a $b"); model_set "$layer" "$a" "$b" 00 ;;
    esac
  done < <(layer_ops "$layer" "$c" "$s")
  io_ok thindisk "$file" "${cmds[@]}"
  local x
  for x in "${cmds[@]}"; do
    [[ $x == discard* ]] && x="write -z ${x#discard }"
    RAW_CMDS+=("$x")
  done
}

# qemu_accepts IMAGE REFERENCE_RAW TOP: the checks every image we write passes.
qemu_accepts() {
  local img=$1 ref=$2 top=$3
  # qemu-img check: 0 = clean (2 = corrupt, 3 = leaked clusters).
  ok "$QEMU_IMG" check "$img"
  local reads=()
  mapfile -t reads < <(model_reads "$top")
  io_ok qemu-io "$img" "${reads[@]}"
  ok "$QEMU_IMG" compare -F raw "$img" "$ref"
  assert_info_agrees "$img"
}

run_case() {
  local c=$1 chain=$6
  begin_case "$@"
  local name=$CASE_NAME size=$CASE_SIZE opts=$CASE_OPTS
  RAW_CMDS=()

  local top=0
  if [[ $chain == 1 ]]; then
    td create -f qcow2 -o "$opts" base.qcow2 "$size"
    td create -f qcow2 -o "$opts" -b base.qcow2 -F qcow2 mid.qcow2 "$size"
    td create -f qcow2 -o "$opts" -b mid.qcow2 -F qcow2 top.qcow2 "$size"
    td_layer 0 base.qcow2 "$c" "$size"
    td_layer 1 mid.qcow2 "$c" "$size"
    td_layer 2 top.qcow2 "$c" "$size"
    top=2
  else
    td create -f qcow2 -o "$opts" top.qcow2 "$size"
    td_layer 0 top.qcow2 "$c" "$size"
  fi

  # The reference: the same writes, flattened, through qemu-io on raw.
  ok "$QEMU_IMG" create -q -f raw ref.raw "$size"
  io_ok qemu-io-raw ref.raw "${RAW_CMDS[@]}"

  if [[ $chain == 1 ]]; then
    ok "$QEMU_IMG" check base.qcow2
    ok "$QEMU_IMG" check mid.qcow2
  fi
  qemu_accepts top.qcow2 ref.raw "$top"

  # Compressed, flattened copy written by thindisk convert -c.
  td convert -c -O qcow2 -o "$opts" top.qcow2 compressed.qcow2
  qemu_accepts compressed.qcow2 ref.raw "$top"
  # Our patterns compress well, so some clusters must be stored compressed;
  # except with 512-byte clusters, where no compressed cluster can save the
  # whole 512-byte sector that Image::WriteCompressed demands.
  if ((c > 512)); then
    ok "$QEMU_IMG" check --output=json compressed.qcow2
    local compressed
    compressed=$(jq '."compressed-clusters" // 0' "$OUT")
    ((compressed > 0)) || fail "$name: convert -c stored no compressed cluster"
  fi
  end_case
}

run_matrix run_case
echo "PASS [$TEST_NAME]: $ROWS configurations x {lone image, 3-level chain}, plain and convert -c"

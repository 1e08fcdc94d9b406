#!/usr/bin/env bash
# qemu writes, thindisk reads: images created and filled by qemu-img/qemu-io
# 7.2 must read back through `thindisk io` exactly as modelled, and
# `thindisk convert -O raw` must produce the same bytes as `qemu-img convert`.
# Every row of MATRIX (model.sh) runs twice: a lone image and a
# base <- mid <- top chain. This keeps the script around a minute.
source "$(dirname "$0")/lib.sh"
source "$INTEROP_DIR/model.sh"
require_tool "$QEMU_IMG" "$QEMU_IO" cmp
require_thindisk

# qemu_layer LAYER FILE C S COMPAT HAS_BACKING: applies layer_ops with qemu-io
# and records them in the model.
qemu_layer() {
  local layer=$1 file=$2 c=$3 s=$4 compat=$5 has_backing=$6
  local cmds=() op a b d
  while read -r op a b d; do
    case $op in
      w) cmds+=("write -P $a $b $d"); model_set "$layer" "$b" "$d" "${a#0x}" ;;
      c) cmds+=("write -c -P $a $b $d"); model_set "$layer" "$b" "$d" "${a#0x}" ;;
      z) cmds+=("write -z $a $b"); model_set "$layer" "$a" "$b" 00 ;;
      d)
        cmds+=("discard $a $b")
        # qemu 7.2: v3 discards leave zero clusters; v2 has no zero flag, so
        # without a backing file the cluster is deallocated, and with one
        # the discard is ignored (deallocating would expose backing data).
        if [[ $compat == 1.1 ]]; then
          model_set "$layer" "$a" "$b" 00
        elif [[ $has_backing == 0 ]]; then
          model_unset "$layer" "$a" "$b"
        fi
        ;;
      u) ;;  # qemu ignores unaligned discards
    esac
  done < <(layer_ops "$layer" "$c" "$s")
  io_ok qemu-io "$file" "${cmds[@]}"
}

run_case() {
  local c=$1 compat=$3 chain=$6
  begin_case "$@"
  local name=$CASE_NAME size=$CASE_SIZE opts=$CASE_OPTS

  local top=0 img=top.qcow2
  if [[ $chain == 1 ]]; then
    ok "$QEMU_IMG" create -q -f qcow2 -o "$opts" base.qcow2 "$size"
    ok "$QEMU_IMG" create -q -f qcow2 -o "$opts" -b base.qcow2 -F qcow2 mid.qcow2 "$size"
    ok "$QEMU_IMG" create -q -f qcow2 -o "$opts" -b mid.qcow2 -F qcow2 top.qcow2 "$size"
    qemu_layer 0 base.qcow2 "$c" "$size" "$compat" 0
    qemu_layer 1 mid.qcow2 "$c" "$size" "$compat" 1
    qemu_layer 2 top.qcow2 "$c" "$size" "$compat" 1
    top=2
  else
    ok "$QEMU_IMG" create -q -f qcow2 -o "$opts" top.qcow2 "$size"
    qemu_layer 0 top.qcow2 "$c" "$size" "$compat" 0
  fi
  ok "$QEMU_IMG" check -q "$img"

  # 1. thindisk reads every byte as the model says (patterns and zeros).
  local reads=()
  mapfile -t reads < <(model_reads "$top")
  io_ok thindisk "$img" "${reads[@]}"
  # Our reading must not have changed qemu's image.
  ok "$QEMU_IMG" check -q "$img"

  # 2. Whole-image conversion agrees with qemu's, byte for byte.
  ok "$QEMU_IMG" convert -O raw "$img" qemu.raw
  td convert -O raw "$img" thindisk.raw
  assert_eq "$size" "$(stat -c %s thindisk.raw)" "$name: size of thindisk convert output"
  assert_same_bytes qemu.raw thindisk.raw "$name: thindisk convert vs qemu-img convert"
  end_case
}

run_matrix run_case
echo "PASS [$TEST_NAME]: $ROWS configurations x {lone image, 3-level chain}"

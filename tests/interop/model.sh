# shellcheck shell=bash disable=SC2034,SC2178  # MODELn are used through namerefs
# The shared workload of the interop scripts, a model of what it leaves, and
# the configuration matrix that qemu_to_thindisk.sh and thindisk_to_qemu.sh
# run it on (run_matrix, begin_case/end_case at the end).
#
# layer_ops LAYER C S prints one operation per line for layer LAYER (0 = base
# or a lone image, 1 = mid, 2 = top) of an image with cluster size C and
# virtual size S. Every offset and length is a multiple of 512:
#   w PATTERN OFF LEN   write the byte PATTERN
#   c PATTERN OFF LEN   compressed write (OFF, LEN cluster-aligned)
#   z OFF LEN           write zeroes
#   d OFF LEN           discard, cluster-aligned
#   u OFF LEN           discard, not cluster-aligned (qemu ignores these, so
#                       only the thindisk-writes-first direction issues them)
# The offsets are chosen to hit: whole clusters, sub-cluster pieces at 512 B
# and 4 KiB alignments, writes straddling cluster boundaries, zeroes inside
# written data, partial overwrites of compressed and of backing clusters,
# a second L2 table (S/2) and the unaligned image tail. REQUIRES: S >= 14 C.
# Compressed writes go to clusters not yet written in their layer and come
# before discards: qemu-io 7.2 fails compressed writes with EIO otherwise
# when refcount_bits=1.
layer_ops() {
  local layer=$1 c=$2 s=$3
  local mid=$(((s / 2) / 512 * 512))
  case $layer in
    0)
      echo "w 0x11 0 $c"
      echo "w 0x12 $((c + 512)) 4096"
      echo "w 0x13 $((3 * c - 1024)) $((c + 2048))"
      echo "z $((c + 1024)) 1024"
      echo "w 0x14 $((5 * c)) $((2 * c))"
      echo "c 0x15 $((12 * c)) $c"
      echo "d $((6 * c)) $c"
      echo "w 0x16 $((mid - 512)) 8192"
      echo "u $((mid + 1024)) 2048"
      echo "w 0x17 $((s - 1536)) 1536"
      ;;
    1)
      echo "w 0x21 512 1024"
      echo "z $((2 * c)) $c"
      echo "c 0x23 $((4 * c)) $c"
      echo "d $((5 * c)) $c"
      echo "w 0x22 $((12 * c + 512)) 2048"
      ;;
    2)
      echo "w 0x31 $((c - 512)) 1024"
      echo "d 0 $c"
      echo "z $((6 * c + 512)) 1024"
      echo "w 0x32 $mid 4096"
      echo "u $((3 * c + 512)) 1024"
      echo "w 0x33 $((s - 4096)) 4096"
      ;;
  esac
}

# The model: per layer, per 512-byte sector: unset = unallocated (falls
# through to the layer below), "00" = reads as zeros, "xx" = pattern byte.
declare -a MODEL0 MODEL1 MODEL2
MODEL_SECTORS=0

model_init() {  # model_init SIZE
  MODEL0=() MODEL1=() MODEL2=()
  MODEL_SECTORS=$(($1 / 512))
}

model_set() {  # model_set LAYER OFF LEN VALUE(hex byte, 2 digits)
  local -n m=MODEL$1
  local i end=$((($2 + $3) / 512))
  for ((i = $2 / 512; i < end; i++)); do m[i]=$4; done
}

model_unset() {  # model_unset LAYER OFF LEN
  local -n m=MODEL$1
  local i end=$((($2 + $3) / 512))
  for ((i = $2 / 512; i < end; i++)); do unset 'm[i]'; done
}

# model_reads TOP: prints "read -P 0xVV OFF LEN" commands covering the whole
# image as seen through layers TOP..0.
model_reads() {
  local top=$1 i l v run_v="" run_start=0
  for ((i = 0; i <= MODEL_SECTORS; i++)); do
    v=00
    if ((i == MODEL_SECTORS)); then
      v=end
    else
      for ((l = top; l >= 0; l--)); do
        local -n m=MODEL$l
        if [[ -n ${m[i]+x} ]]; then v=${m[i]}; break; fi
      done
    fi
    if [[ $v != "$run_v" ]]; then
      if [[ -n $run_v ]]; then
        echo "read -P 0x$run_v $((run_start * 512)) $(((i - run_start) * 512))"
      fi
      run_v=$v
      run_start=$i
    fi
  done
}

# The configurations qemu_to_thindisk.sh and thindisk_to_qemu.sh run. The
# full product (5 cluster sizes x extended_l2 x compat x refcount_bits x
# compression x backing) is ~100 valid combinations; these rows cover every
# value of every axis, every pair of (cluster size, compat), extended L2 at
# 64K/128K/2M, each refcount width at the small and the large cluster
# sizes, and both compression types with and without extended L2.
#   cluster  ext  compat  refbits  compression
MATRIX=(
  "512     off  1.1   1   zlib"
  "512     off  0.10  16  zlib"
  "512     off  1.1   64  zstd"
  "4096    off  1.1   64  zstd"
  "4096    off  0.10  16  zlib"
  "65536   on   1.1   1   zlib"
  "65536   off  1.1   16  zstd"
  "65536   off  0.10  16  zlib"
  "131072  on   1.1   16  zstd"
  "131072  off  1.1   64  zlib"
  "2097152 on   1.1   64  zstd"
  "2097152 off  1.1   1   zlib"
  "2097152 off  0.10  16  zlib"
)

# run_matrix FUNC: FUNC C EXT COMPAT REFBITS COMPRESSION CHAIN for every row
# of MATRIX, with CHAIN 0 (a lone image) and 1 (base <- mid <- top); sets
# ROWS to the number of rows run. MATRIX_FILTER=regex runs only the
# matching rows (local debugging).
run_matrix() {
  local row c ext compat refbits comp
  ROWS=0
  for row in "${MATRIX[@]}"; do
    [[ -n ${MATRIX_FILTER:-} && ! $row =~ $MATRIX_FILTER ]] && continue
    read -r c ext compat refbits comp <<<"$row"
    "$1" "$c" "$ext" "$compat" "$refbits" "$comp" 0
    "$1" "$c" "$ext" "$compat" "$refbits" "$comp" 1
    ROWS=$((ROWS + 1))
  done
}

# begin_case C EXT COMPAT REFBITS COMPRESSION CHAIN: one matrix case starts
# in its own directory under $TMP (the working directory until end_case).
# Sets CASE_NAME, CASE_SIZE (>= 14 clusters and 1 MiB, plus an unaligned
# 1536-byte tail), CASE_OPTS (the qcow2 -o string) and empties the model.
begin_case() {
  CASE_NAME="c$1-ext_$2-compat$3-rc$4-$5-chain$6"
  CASE_DIR=$TMP/$CASE_NAME
  mkdir -p "$CASE_DIR"
  cd "$CASE_DIR" || fail "cd $CASE_DIR"
  log "$CASE_NAME"
  CASE_SIZE=$((14 * $1))
  ((CASE_SIZE < 1048576)) && CASE_SIZE=1048576
  CASE_SIZE=$((CASE_SIZE + 1536))
  CASE_OPTS=$(qcow2_opts "$1" "$2" "$3" "$4" "$5")
  model_init "$CASE_SIZE"
}

# end_case: back to $TMP, the case's directory removed.
end_case() {
  cd "$TMP" || fail "cd $TMP"
  rm -rf "$CASE_DIR"
}

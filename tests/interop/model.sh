# shellcheck shell=bash disable=SC2034,SC2178  # MODELn are used through namerefs
# The shared workload of the interop scripts and a model of what it leaves.
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

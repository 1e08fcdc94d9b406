# bench/compare_convert.sh: bench/compare's convert phases, W6 (convert -c
# against qemu-img) and N1 (convert off an NBD export against qemu-img and
# nbdcopy). Sourced by bench/compare, which defines what they use: TD, WORK,
# SOCK, RUNS, the input files and sizes, record, settle, alloc_bytes.
# shellcheck shell=bash disable=SC2154  # bench/compare sets the sizes

# W6: convert with compression; MB/s of input and output/input size.
run_convert() {  # run_convert RUN
  local r=$1 in tool ct out t0 t1 tools=(td qemu)
  ((r % 2)) || tools=(qemu td)
  for in in corpus random; do
    for tool in "${tools[@]}"; do
      for ct in zlib zstd; do
        out=$WORK/conv.qcow2
        rm -f "$out"
        settle
        t0=$(date +%s.%N)
        if [[ $tool == td ]]; then
          "$TD" convert -q -c -f raw -O qcow2 -o compression_type=$ct "$WORK/$in.raw" "$out"
        else
          qemu-img convert -c -f raw -O qcow2 -o compression_type=$ct "$WORK/$in.raw" "$out"
        fi
        t1=$(date +%s.%N)
        record "$r" "$tool" "W6.$in.$ct.mbps" "$(python3 -c "print($w6_bytes / 1e6 / ($t1 - $t0))")"
        record "$r" "$tool" "W6.$in.$ct.ratio" "$(python3 -c "print($(stat -c %s "$out") / $w6_bytes)")"
      done
    done
  done
}

# N1: convert a half-sparse disk off an NBD export (nbdkit file, read-only,
# multi-conn) into a local file: thindisk convert -O qcow2, qemu-img convert
# -O qcow2, and nbdcopy (raw, the copying limit); MB/s of virtual size, the
# source read cold each time.
run_nbd_convert() {  # run_nbd_convert RUN
  local r=$1 tool t0 t1 out tools=(td qemu nbdcopy) uri="nbd+unix:///?socket=$SOCK"
  ((r % 2)) || tools=(nbdcopy qemu td)
  rm -f "$SOCK"
  nbdkit -r -f -U "$SOCK" file file="$WORK/halfsparse.raw" &
  SERVER_PID=$!
  wait_server nbdkit "$SERVER_PID" "" nbd_ready "$SOCK"
  for tool in "${tools[@]}"; do
    rm -f "$WORK"/n1.*
    settle
    t0=$(date +%s.%N)
    case $tool in
      td) out=$WORK/n1.qcow2; "$TD" convert -q -f raw -O qcow2 "$uri" "$out" ;;
      qemu) out=$WORK/n1.qcow2; qemu-img convert -f raw -O qcow2 "$uri" "$out" ;;
      nbdcopy) out=$WORK/n1.raw; nbdcopy "$uri" "$out" ;;
    esac
    sync "$out"
    t1=$(date +%s.%N)
    record "$r" "$tool" "N1.mbps" "$(python3 -c "print($n1_bytes / 1e6 / ($t1 - $t0))")"
    record "$r" "$tool" "N1.alloc" "$(python3 -c "print($(alloc_bytes "$out") / $n1_bytes)")"
  done
  stop_target
}

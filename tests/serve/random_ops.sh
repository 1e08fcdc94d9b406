#!/usr/bin/env bash
# Seeded random operations, the same list three ways: through `thindisk
# serve` (qemu-io over NBD), through qemu's own qcow2 driver (qemu-io on a
# copy made by qemu-img) and on a raw file (the model). After every batch the
# three hold the same bytes (qemu-img compare), and thindisk's image passes
# `qemu-img check` and `thindisk check`. Each configuration is an image
# geometry the fixed scripts meet only at chosen offsets: cluster sizes from
# 512 B to 2 MiB, extended L2 on and off, refcount widths, a backing file
# (compressed or not, or read through NBD from qemu-nbd), an unaligned
# virtual size; and server settings that take other paths: a metadata cache
# of one table (every lookup evicts), zero detection, O_DIRECT.
#
# Operations: writes of a random byte at byte granularity (qemu-io splits
# nothing: the server gets requests of any alignment), write-zeroes with and
# without unmap (-u), cluster-aligned discards (qemu and thindisk both make a
# discarded cluster read as zeroes; an unaligned discard may keep its data,
# which NBD allows, so the model could not say what it reads), flushes.
# Between batches the server is stopped and started again, so the next batch
# runs on what was written to the file; after the first, an internal
# snapshot is taken (qemu-img snapshot and thindisk snapshot); after the
# second both go back to it and grow by a size that is no multiple of the
# cluster; after the third the server reads the whole disk back (nbdcopy)
# and the snapshot is deleted, thindisk convert copies the image with options
# drawn at random (cluster size, extended L2, -c, -B), and at the end thindisk
# commit folds the overlay into its base, and a safe rebase moves it onto a
# base of other bytes (half the size). Every compare is made twice, by
# qemu-img and by thindisk compare: thindisk's read path and qemu's.
#
# With RANDOM_OPS_POOL=POOL (tests/ceph/random_ops.sh) thindisk's image lives
# in that RADOS pool instead (rados://, objects of 64 KiB or one cluster),
# its backing file still a local one; qemu-img reads a copy that thindisk
# convert makes of it. It needs the test cluster (CEPH_CONF), or skips.
#
# THINDISK_SEED=N reproduces a run; THINDISK_RANDOM_OPS=N sets the operations
# per batch (default 150).
source "$(dirname "$0")/lib.sh"
require_tool qemu-io qemu-img nbdcopy
if [[ -n ${RANDOM_OPS_POOL:-} ]]; then
  # shellcheck source=../ceph/lib.sh
  source "$(dirname "$0")/../ceph/lib.sh"
  require_test_cluster
fi

random_seed
RANDOM=$((SEED & 0x7fffffff))
OPS=${THINDISK_RANDOM_OPS:-150}

# rnd N: R is a random number in [0, N), from bash's seeded generator (30
# bits). Never in a subshell ($(...), a pipeline): bash reseeds RANDOM
# there, and the run would no longer follow THINDISK_SEED.
rnd() { R=$((((RANDOM << 15) | RANDOM) % $1)); }

# range UNIT MAX LIMIT: OFF and LEN, multiples of UNIT, for a request of 1 to
# MAX units that starts in [0, LIMIT) and ends at LIMIT at the latest.
range() {
  rnd $(($3 / $1))
  OFF=$((R * $1))
  rnd "$2"
  LEN=$(((1 + R) * $1))
  ((OFF + LEN <= $3)) || LEN=$(($3 - OFF))
}

# gen_ops C S N: N qemu-io commands for an image of cluster size C and size S.
gen_ops() {
  local c=$1 s=$2 n=$3 i kind pattern
  for ((i = 0; i < n; i++)); do
    rnd 20
    kind=$R
    if ((kind < 10)); then # a write, byte- or sector-granular
      rnd 2
      if ((R)); then range 1 $((3 * c)) "$s"; else range 512 $((6 * c / 512 + 1)) "$s"; fi
      rnd 8
      pattern=0
      ((R == 0)) || { rnd 255 && pattern=$((1 + R)); }
      echo "write -q -P $pattern $OFF $LEN"
    elif ((kind < 15)); then # write-zeroes, sector-granular, maybe unmapping
      range 512 $((6 * c / 512 + 1)) "$s"
      rnd 2
      if ((R)); then echo "write -q -z -u $OFF $LEN"; else echo "write -q -z $OFF $LEN"; fi
    elif ((kind < 19)); then # a discard of whole clusters
      range "$c" 4 $((s / c * c))
      ((LEN > 0)) && echo "discard -q $OFF $LEN"
    else
      echo "flush"
    fi
  done
}

# apply WHAT FMT TARGET OPSFILE: run the commands with qemu-io.
apply() {
  qemu-io -f "$2" "$3" <"$4" >"$1.io" 2>&1 || { tail "$1.io" >&2; fail "qemu-io on $1 failed"; }
  if grep -v '^qemu-io>' "$1.io" | grep -q .; then
    cat "$1.io" >&2
    fail "qemu-io on $1 printed an error"
  fi
}

# td_file: a file qemu can read with thindisk's image: the image itself, or
# a copy of a rados:// one.
td_file() {
  if [[ $td == rados://* ]]; then
    rm -f td-copy.qcow2
    "$TD" convert -O qcow2 "$td" td-copy.qcow2 >convert.out 2>&1 ||
      { cat convert.out >&2; fail "thindisk convert of $td failed"; }
    echo td-copy.qcow2
  else
    echo "$td"
  fi
}

# same_bytes WHAT: qemu's image and thindisk's hold the model's bytes, as
# qemu reads them and as thindisk does; both images are clean.
same_bytes() {
  local file
  qemu-img compare -q -f raw -F qcow2 model.raw qemu.qcow2 ||
    fail "$1: qemu's image differs from the model (qemu-img, qemu-io)"
  "$TD" compare -f raw -F qcow2 model.raw "$td" >compare.out 2>&1 ||
    { cat compare.out >&2; fail "$1: thindisk reads otherwise than the model"; }
  file=$(td_file)
  qemu-img compare -f raw -F qcow2 model.raw "$file" >compare.out 2>&1 ||
    { cat compare.out >&2; fail "$1: qemu reads thindisk's image otherwise than the model"; }
  check_clean "$file"
  "$TD" check "$td" >tdcheck.out 2>&1 || { cat tdcheck.out >&2; fail "$1: thindisk check failed"; }
}

# convert_check NAME IMAGE C BASE: IMAGE converted by thindisk, with options
# drawn at random (compressed or not, another cluster size, extended L2 on
# or off, only what the backing file lacks with -B), reads as the model and
# passes qemu-img check.
convert_check() {
  local args=(-O qcow2) cs o
  rnd 13
  cs=$((512 << R))
  o=cluster_size=$cs
  rnd 2
  if ((cs >= 16384)); then
    if ((R)); then o+=,extended_l2=on; else o+=,extended_l2=off; fi
  fi
  args+=(-o "$o")
  rnd 2
  ((R)) && args+=(-c)
  rnd 2
  [[ $4 == plain || $4 == compressed ]] && ((R)) && args+=(-B "$PWD/base.qcow2" -F qcow2)
  rm -f converted.qcow2
  "$TD" convert -q "${args[@]}" "$2" converted.qcow2 >convert.out 2>&1 ||
    { cat convert.out >&2; fail "$1: convert ${args[*]} failed"; }
  qemu-img compare -f raw -F qcow2 model.raw converted.qcow2 >compare.out 2>&1 ||
    { cat compare.out >&2; fail "$1: convert ${args[*]} reads otherwise than the model"; }
  check_clean converted.qcow2
}

# run_case NAME CREATE_OPTS SIZE BASE [SERVE_ARGS...]: one configuration.
# BASE is none, plain, compressed (the backing file both qcow2 images start
# over) or nbd: a plain one that qemu's image names as a file and thindisk's
# as qemu-nbd's read-only export of it (thindisk's NBD client reads it).
run_case() {
  local name=$1 opts=$2 size=$3 base=$4 c b sock base_sum base_pid="" td td_opts compress
  shift 4
  c=$(sed -n 's/.*cluster_size=\([0-9]*\).*/\1/p' <<<"$opts")
  td=td.qcow2
  td_opts=$opts
  if [[ -n ${RANDOM_OPS_POOL:-} ]]; then
    td=rados://$RANDOM_OPS_POOL/ro$$-$name
    td_opts+=,object_size=$((c > 65536 ? c : 65536))
  fi
  log "$name: $td_opts, size $size, base $base, serve $*"
  rm -f ./*.qcow2 ./*.raw model.s1 served.raw
  truncate -s "$size" model.raw
  if [[ $base == none ]]; then
    "$TD" create -f qcow2 -o "$td_opts" "$td" "$size" >/dev/null
    qemu-img create -q -f qcow2 -o "$opts" qemu.qcow2 "$size"
  else
    gen_ops "$c" "$size" 40 >base_ops.all
    grep -v discard base_ops.all >base_ops
    apply base raw model.raw base_ops
    compress=()
    [[ $base == compressed ]] && compress=(-c)
    qemu-img convert -q "${compress[@]}" -f raw -O qcow2 -o "$opts" model.raw base.qcow2
    base_sum=$(sha256sum <base.qcow2)
    if [[ $base == nbd ]]; then
      qemu_nbd_unix base "$PWD/base.sock" -t -r -f qcow2 base.qcow2
      base_pid=$SERVER_PID
      "$TD" create -f qcow2 -o "$td_opts" -b "$(uri "$PWD/base.sock")" -F raw "$td" >/dev/null
    else
      "$TD" create -f qcow2 -o "$td_opts" -b "$PWD/base.qcow2" -F qcow2 "$td" >/dev/null
    fi
    qemu-img create -q -f qcow2 -o "$opts" -b base.qcow2 -F qcow2 qemu.qcow2
  fi
  sock=$PWD/td.sock
  for ((b = 1; b <= 3; b++)); do
    gen_ops "$c" "$size" "$OPS" >ops.$b
    serve_unix td "$sock" "$@" -f qcow2 "$td"
    apply "thindisk serve" raw "$(uri "$sock")" ops.$b
    stop_server "$SERVER_PID" td
    apply qemu qcow2 qemu.qcow2 ops.$b
    apply model raw model.raw ops.$b
    same_bytes "$name batch $b"
    case $b in
      1) # an internal snapshot of what batch 1 left (refcount_bits=1 cannot
        # count a snapshot's clusters: qemu-img and thindisk refuse it)
        [[ $opts == *refcount_bits=1* ]] && continue
        "$TD" snapshot -q -c s1 "$td" || fail "$name: snapshot -c failed"
        qemu-img snapshot -c s1 qemu.qcow2
        cp model.raw model.s1 ;;
      2) # back to it, then grown by a size that is no multiple of the cluster
        if [[ -e model.s1 ]]; then
          "$TD" snapshot -q -a s1 "$td" || fail "$name: snapshot -a failed"
          qemu-img snapshot -a s1 qemu.qcow2
          mv model.s1 model.raw
          same_bytes "$name after snapshot -a"
        fi
        rnd $((4 * c / 512))
        size=$((size + (1 + R) * 512))
        "$TD" resize -q "$td" "$size" || fail "$name: resize to $size failed"
        qemu-img resize -q -f qcow2 qemu.qcow2 "$size"
        truncate -s "$size" model.raw
        same_bytes "$name after the resize to $size" ;;
      3) # read back through the server too; the snapshot dropped
        serve_unix td "$sock" "$@" -r -f qcow2 "$td"
        nbdcopy "$(uri "$sock")" served.raw || fail "$name: nbdcopy from the server failed"
        stop_server "$SERVER_PID" td
        cmp -s model.raw served.raw || fail "$name: the server reads otherwise than the model"
        if [[ $opts != *refcount_bits=1* ]]; then
          "$TD" snapshot -q -d s1 "$td" || fail "$name: snapshot -d failed"
          check_clean "$(td_file)"
        fi
        convert_check "$name" "$td" "$c" "$base" ;;
    esac
  done
  [[ -z $base_pid ]] || kill_server "$base_pid"
  [[ $base == none ]] || [[ $(sha256sum <base.qcow2) == "$base_sum" ]] ||
    fail "$name: the backing file changed"
  if [[ $base == plain || $base == compressed ]]; then
    # thindisk commit folds the overlay into the base (grown to its size)
    "$TD" commit -q "$td" || fail "$name: commit failed"
    qemu-img compare -f raw -F qcow2 model.raw base.qcow2 >compare.out 2>&1 ||
      { cat compare.out >&2; fail "$name: the base after commit differs from the model"; }
    check_clean base.qcow2
    same_bytes "$name: the overlay after commit"
    # a safe rebase onto a base of other bytes keeps what the guest reads
    truncate -s $((size / 2)) other.raw
    gen_ops "$c" $((size / 2)) 40 >other_ops.all
    grep -v discard other_ops.all >other_ops
    apply other raw other.raw other_ops
    qemu-img convert -q -f raw -O qcow2 other.raw other.qcow2
    "$TD" rebase -q -b "$PWD/other.qcow2" -F qcow2 "$td" || fail "$name: rebase failed"
    same_bytes "$name: after rebase onto other bytes"
  fi
  [[ $td != rados://* ]] || "$TD" rm "$td" >/dev/null || fail "thindisk rm $td failed"
}

run_case default "cluster_size=65536" $((64 << 20)) none
run_case small-clusters "cluster_size=4096,extended_l2=off" $((8 << 20)) none --cache-size 1
run_case subclusters "cluster_size=32768,extended_l2=on" $((16 << 20)) plain --detect-zeroes unmap
run_case compressed-base "cluster_size=65536,extended_l2=on" $((24 << 20)) compressed --cache none
run_case tiny "cluster_size=512,extended_l2=off,refcount_bits=1" $((1 << 20)) none --cache-size 1
run_case large "cluster_size=2097152,extended_l2=on,refcount_bits=64" $((40 << 20)) plain
run_case nbd-base "cluster_size=65536,extended_l2=off" $((20 << 20)) nbd
run_case unaligned "cluster_size=131072,extended_l2=on" $(((48 << 20) + 3 * 512)) plain --detect-zeroes on
echo PASS

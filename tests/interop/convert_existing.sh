#!/usr/bin/env bash
# thindisk convert -n (into an existing destination, as qemu-img convert -n
# and the tools that call it: virt-v2v, backup scripts) and the cache flags
# OpenStack passes (-t none, -T), judged by qemu-img:
#   1. A source with data, zeroes, unallocated ranges and a backing file,
#      written into a raw file full of random bytes: exactly the source
#      (qemu-img compare), the same bytes qemu-img convert -n leaves in
#      another copy of that file, and the tail past the source's size kept.
#   2. Into an existing qcow2 image full of data (another cluster size),
#      with -O qcow2, plain and compressed: qemu-img compare and check.
#   3. Onto qemu-nbd's export of a random file.
#   4. --target-is-zero: zeros are not written (qemu-img's meaning), so on
#      a zeroed target the copy is exact and on a random one the source's
#      zero ranges keep the old bytes.
#   5. -t none / directsync / unsafe and -T none, -W and -m 16: the same bytes.
#   6. Refusals, each one line, the destination unchanged: too small, a
#      qcow2 destination without -O, -o / -B / --bitmaps with -n,
#      --target-is-zero without -n, a bad cache mode, -m 17, a destination
#      qemu-nbd is serving (its write lock), no destination.
source "$(dirname "$0")/lib.sh"
require_tool "$QEMU_IMG" "$QEMU_IO" qemu-nbd sha256sum
require_thindisk

SIZE=$((16 << 20))
log "the source: a clone with data, zeroes and holes over a base"
ok "$QEMU_IMG" create -q -f qcow2 -o cluster_size=65536 base.qcow2 $SIZE
io_ok qemu-io base.qcow2 "write -P 0x11 0 4M" "write -P 0x12 12M 2M"
ok "$QEMU_IMG" create -q -f qcow2 -b base.qcow2 -F qcow2 src.qcow2
io_ok qemu-io src.qcow2 "write -P 0x21 1M 100k" "write -z 2M 1M" "write -z 12M 64k" \
  "write -P 0x22 9M 3000" "discard 3M 1M" "write -P 0 5M 64k"

ok "$QEMU_IMG" convert -f qcow2 -O raw src.qcow2 src.raw # the reference

# random_file NAME BYTES: NAME full of random bytes.
random_file() { head -c "$2" /dev/urandom >"$1"; }

log "1. into a raw file of random bytes"
random_file target.raw $((SIZE + (1 << 20)))
cp target.raw qemu-target.raw
td convert -n -f qcow2 src.qcow2 target.raw
ok "$QEMU_IMG" convert -n -f qcow2 -O raw src.qcow2 qemu-target.raw
assert_same_bytes target.raw qemu-target.raw "convert -n against qemu-img convert -n"
head -c $SIZE target.raw >head.raw
ok "$QEMU_IMG" compare -f qcow2 -F raw src.qcow2 head.raw

log "2. into an existing qcow2 image full of data"
for c in "" -c; do
  ok "$QEMU_IMG" create -q -f qcow2 -o cluster_size=4096 target.qcow2 $SIZE
  io_ok qemu-io target.qcow2 "write -P 0x77 0 $SIZE"
  td convert -n $c -O qcow2 src.qcow2 target.qcow2
  ok "$QEMU_IMG" compare -f qcow2 -F qcow2 src.qcow2 target.qcow2
  qemu_check target.qcow2
done

log "3. onto qemu-nbd's export"
random_file export.raw $SIZE
qemu_nbd_unix exp "$PWD/exp.sock" -t -f raw export.raw
td convert -n src.qcow2 "nbd+unix:///?socket=$PWD/exp.sock"
kill_server "$SERVER_PID"
ok "$QEMU_IMG" compare -f qcow2 -F raw src.qcow2 export.raw

log "4. --target-is-zero"
truncate -s $SIZE zero.raw
td convert -n --target-is-zero src.qcow2 zero.raw
ok "$QEMU_IMG" compare -f qcow2 -F raw src.qcow2 zero.raw
random_file kept.raw $SIZE
cp kept.raw kept.before
td convert -n --target-is-zero src.qcow2 kept.raw
# 2M..3M is written as zeroes in the source: not written, the old bytes
# stay; the data before it is the source's
cmp -s -i $((2 << 20)) -n $((1 << 20)) kept.raw kept.before ||
  fail "--target-is-zero wrote the source's zeros"
cmp -s -n $((2 << 20)) kept.raw src.raw || fail "--target-is-zero did not write the source's data"

log "5. cache modes and accepted flags"
for flags in "-t none -T none" "-t directsync" "-t unsafe -W -m 16" "-t writethrough -T writeback"; do
  random_file cache.raw $SIZE
  # shellcheck disable=SC2086 # the flags are words
  td convert -n $flags src.qcow2 cache.raw
  ok "$QEMU_IMG" compare -f qcow2 -F raw src.qcow2 cache.raw
  rm -f new.qcow2
  # shellcheck disable=SC2086
  td convert $flags -O qcow2 src.qcow2 new.qcow2
  ok "$QEMU_IMG" compare -f qcow2 -F qcow2 src.qcow2 new.qcow2
  qemu_check new.qcow2
done

log "6. refusals leave the destination as it was"
truncate -s $((SIZE / 2)) small.raw
ok "$QEMU_IMG" create -q -f qcow2 existing.qcow2 $SIZE
random_file busy.raw $SIZE
# refused DEST PATTERN ARGS...: thindisk convert ARGS fails with one line
# matching PATTERN, and DEST keeps its bytes.
refused() {
  local dest=$1 pattern=$2 before
  shift 2
  before=$(sha256sum <"$dest")
  td_fails "$pattern" "convert $*" convert "$@"
  [[ $(grep -c . "$ERR") == 1 ]] || fail "convert $*: more than one line: $(cat "$ERR")"
  [[ $(sha256sum <"$dest") == "$before" ]] || fail "convert $*: $dest changed"
  echo "ok: convert $*: $(cat "$ERR")"
}
refused small.raw "smaller than input" -n src.qcow2 small.raw
refused existing.qcow2 "is a qcow2 image: give -O qcow2" -n src.qcow2 existing.qcow2
refused busy.raw "-o has no effect" -n -o cluster_size=4096 src.qcow2 busy.raw
refused busy.raw "-B names the backing file" -n -B base.qcow2 -O qcow2 src.qcow2 busy.raw
refused existing.qcow2 "--bitmaps needs a new target" -n --bitmaps -O qcow2 src.qcow2 existing.qcow2
refused busy.raw "requires use of -n" --target-is-zero src.qcow2 busy.raw
refused busy.raw "invalid -t 'fast' \(expected none, writeback" -n -t fast src.qcow2 busy.raw
refused busy.raw "invalid -T 'x' \(expected none, writeback" -n -T x src.qcow2 busy.raw
refused busy.raw "not in range 1 to 16" -n -m 17 src.qcow2 busy.raw
qemu_nbd_unix busy "$PWD/busy.sock" -t -f qcow2 existing.qcow2 # a writer holds its lock
refused existing.qcow2 "in use by another process" -n -O qcow2 src.qcow2 existing.qcow2
kill_server "$SERVER_PID"
td_fails "missing.raw: No such file" "convert -n into nothing" convert -n src.qcow2 missing.raw
assert_absent missing.raw "convert -n into nothing"
log "convert_existing: ok"

#!/usr/bin/env bash
# thindisk convert --salvage, judged against qemu-img convert --salvage on
# the same source: an NBD export of a raw file of random bytes (8 MiB +
# 1000) through nbdkit's ddrescue filter, whose reads fail with EIO
# wherever they touch one of three bad ranges: 4000 bytes across sectors
# at 2 MiB + 1000, one whole sector at 6 MiB, and part of the last, partial
# sector.
#   1. Raw output: the source with every sector that holds a bad byte
#      zeroed, which is what qemu-img writes; exit 0; one warning per bad
#      range (neighbouring sectors merged) and a total; none with -q. A
#      failed 2 MiB read is read again in halves, so the export sees a few
#      dozen failed reads (its log filter counts them), not one per sector.
#   2. qcow2 output, plain and compressed (-c): the same content.
#   3. -n into an existing file of 0xff bytes: the same bytes as qemu-img
#      convert -n --salvage leaves.
#   4. Without --salvage: exit 1 naming the failed read, no destination.
source "$(dirname "$0")/lib.sh"
require_tool "$QEMU_IMG" nbdkit nbdinfo cmp
require_thindisk

SIZE=$((8 * 1048576 + 1000))
head -c $SIZE /dev/urandom >src.raw
# Bad byte ranges [start, end), as a GNU ddrescue map file ("+" read, "-"
# bad) for the ddrescue filter. The log filter records every request.
BAD="2098152:2102152 6291456:6291968 8388808:8389508"
{
  echo "# current_pos  current_status"
  echo "0x0 +"
  pos=0
  for r in $BAD; do
    a=${r%:*} b=${r#*:}
    if ((a > pos)); then printf '0x%x 0x%x +\n' $pos $((a - pos)); fi
    printf '0x%x 0x%x -\n' "$a" $((b - a))
    pos=$b
  done
  if ((SIZE > pos)); then printf '0x%x 0x%x +\n' $pos $((SIZE - pos)); fi
} >map.txt
spawn nbdkit nbdkit -f -U "$TMP/bad.sock" --filter=log --filter=ddrescue file "$TMP/src.raw" \
  ddrescue-mapfile="$TMP/map.txt" logfile="$TMP/log.txt"
SRC="nbd+unix:///?socket=$TMP/bad.sock"
wait_accepting "$SRC"
# failed_reads: how many reads the export has failed so far.
failed_reads() { grep -c 'Read .*return=-1' log.txt || true; }

# expected.raw: the source with every sector holding a bad byte zeroed.
cp src.raw expected.raw
for r in $BAD; do
  first=$((${r%:*} / 512 * 512))
  last=$(((${r#*:} + 511) / 512 * 512))
  ((last <= SIZE)) || last=$SIZE
  dd if=/dev/zero of=expected.raw bs=1 seek=$first count=$((last - first)) conv=notrunc \
    status=none
done

log "1. raw output: what qemu-img convert --salvage writes"
# (qemu-img rounds a raw output up to whole sectors: its first SIZE bytes.)
ok "$QEMU_IMG" convert --salvage -f raw -O raw "$SRC" qemu.raw
cmp -n $SIZE qemu.raw expected.raw ||
  fail "qemu-img's output is not the source with the bad sectors zeroed"
before=$(failed_reads)
td convert --salvage -f raw -O raw "$SRC" td.raw
cmp td.raw expected.raw || fail "thindisk's output differs from qemu-img's"
failed=$(($(failed_reads) - before))
cat "$ERR"
grep -q "could not read bytes 2097664-2102271 of $SRC (Input/output error): written as zeros" \
  "$ERR" || fail "no merged warning for the range across sectors"
grep -q "could not read bytes 6291456-6291967 " "$ERR" || fail "no warning for the sector at 6 MiB"
grep -q "could not read bytes 8388608-$((SIZE - 1)) " "$ERR" || fail "no warning for the last sector"
assert_eq 3 "$(grep -c 'could not read bytes' "$ERR")" "warnings, one per bad range"
grep -q "$((9 * 512 + 512 + SIZE - 8388608)) bytes in 3 range(s) could not be read" "$ERR" ||
  fail "no total: $(cat "$ERR")"
echo "failed reads seen by the export: $failed"
((failed < 120)) || fail "$failed failed reads: the bad ranges were not bisected"
td convert -q --salvage -f raw -O raw "$SRC" quiet.raw
[[ ! -s $ERR ]] || fail "-q still printed: $(cat "$ERR")"
cmp quiet.raw expected.raw || fail "-q output differs"

log "2. qcow2 output, plain and compressed"
for c in "" -c; do
  rm -f td.qcow2
  td convert --salvage $c -f raw -O qcow2 "$SRC" td.qcow2
  ok "$QEMU_IMG" compare -f qcow2 -F raw td.qcow2 expected.raw
  qemu_check td.qcow2
done

log "3. -n into an existing file of 0xff bytes"
for tool in td qemu; do
  head -c $SIZE /dev/zero | tr '\0' '\377' >"n.$tool"
done
td convert -n --salvage -f raw -O raw "$SRC" n.td
ok "$QEMU_IMG" convert -n --salvage -f raw -O raw "$SRC" n.qemu
cmp -n $SIZE n.td n.qemu || fail "-n --salvage differs from qemu-img's"

log "4. without --salvage: the read error stops the copy"
td_fails "read of .* failed: Input/output error" "a bad read without --salvage" \
  convert -f raw -O raw "$SRC" stopped.raw
[[ ! -e stopped.raw ]] || fail "a failed convert left its destination"
echo "PASS [$TEST_NAME]"

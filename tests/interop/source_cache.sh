#!/usr/bin/env bash
# The cache modes of compare and check (-T), commit and amend (-t) and
# rebase (-t for the image, -T for the new backing file), as qemu-img takes
# them: the images are opened in that mode (none and directsync: O_DIRECT,
# as strace shows on their descriptors) and the results are those without
# it, judged by qemu-img.
#   1. compare -T none: identical images exit 0, a changed byte exits 1
#      with qemu-img's mismatch offset; both files are read with O_DIRECT,
#      which the default (writeback) does not set.
#   2. check -T none on a clean image, and check -r leaks -T directsync on
#      an image with a leaked cluster (a refcount raised by hand): the leak
#      is reported and repaired through O_DIRECT, and qemu-img check then
#      finds the image clean.
#   3. commit -t none (the base written through O_DIRECT, equal to the
#      overlay's view before), rebase -t none -T none onto an empty base (the
#      image and the new base opened with O_DIRECT, the view unchanged),
#      amend -t none -o lazy_refcounts=on (set, as qemu-img info shows).
#   4. bad values are refused, naming them (compare exits 2, the others 1),
#      and change nothing.
source "$(dirname "$0")/lib.sh"
require_tool "$QEMU_IMG" "$QEMU_IO" strace python3
require_thindisk

# traced CMD...: runs CMD under strace (openat, fcntl) into trace.txt; sets RC.
traced() { capture_traced openat,fcntl trace.txt "$@"; }

log "compare -T none"
"$QEMU_IMG" create -q -f qcow2 a.qcow2 64M
"$QEMU_IO" -f qcow2 -c "write -P 0x5c 1M 3M" -c "write -P 0x7e 40M 64k" a.qcow2 >/dev/null
"$QEMU_IMG" convert -O raw a.qcow2 b.raw
traced "$TD" compare -T none a.qcow2 b.raw
[[ $RC == 0 ]] || fail "compare -T none of equal images: exit $RC, $(cat "$ERR")"
assert_eq 1 "$(direct_fds trace.txt a.qcow2)" "O_DIRECT descriptors of a.qcow2 (compare -T none)"
assert_eq 1 "$(direct_fds trace.txt b.raw)" "O_DIRECT descriptors of b.raw (compare -T none)"
traced "$TD" compare a.qcow2 b.raw
[[ $RC == 0 ]] || fail "compare of equal images: exit $RC"
assert_eq 0 "$(direct_fds trace.txt a.qcow2)" "O_DIRECT descriptors of a.qcow2 (default cache)"
printf '\x01' | dd of=b.raw bs=1 seek=$((40 * 1048576 + 4097)) conv=notrunc status=none
capture "$QEMU_IMG" compare a.qcow2 b.raw
expected=$(cat "$OUT")
capture "$TD" compare -T none a.qcow2 b.raw
[[ $RC == 1 ]] || fail "compare -T none of different images: exit $RC, $(cat "$ERR")"
assert_eq "$expected" "$(cat "$OUT")" "compare -T none's answer against qemu-img compare's"

log "check -T none and check -r leaks -T directsync"
traced "$TD" check -T none a.qcow2
[[ $RC == 0 ]] || fail "check -T none of a clean image: exit $RC, $(cat "$OUT" "$ERR")"
[[ $(direct_fds trace.txt a.qcow2) -ge 1 ]] || fail "check -T none did not read a.qcow2 with O_DIRECT"
# A leaked cluster: the refcount of the cluster after the file's end raised
# to 1 (refcount_bits 16, the first refcount block), and the file grown to
# hold it.
python3 - a.qcow2 <<'EOF'
import os, struct, sys
path = sys.argv[1]
with open(path, "r+b") as f:
    hdr = f.read(104)
    cluster_bits = struct.unpack(">I", hdr[20:24])[0]
    table = struct.unpack(">Q", hdr[48:56])[0]
    cluster = 1 << cluster_bits
    f.seek(table)
    block = struct.unpack(">Q", f.read(8))[0]
    size = os.fstat(f.fileno()).st_size
    index = (size + cluster - 1) // cluster
    assert index < cluster // 2, "the leak must fall in the first refcount block"
    f.seek(block + 2 * index)
    f.write(struct.pack(">H", 1))
    f.truncate((index + 1) * cluster)
EOF
capture "$QEMU_IMG" check a.qcow2
[[ $RC == 3 ]] || fail "qemu-img check of the hand-made leak: exit $RC (3 expected), $(cat "$OUT")"
traced "$TD" check -r leaks -T directsync a.qcow2
[[ $RC == 0 ]] || fail "check -r leaks -T directsync: exit $RC, $(cat "$OUT" "$ERR")"
grep -q "1 leaked clusters" "$OUT" || fail "check -r leaks -T directsync did not report the leak: $(cat "$OUT")"
[[ $(direct_fds trace.txt a.qcow2) -ge 1 ]] || fail "check -r leaks -T directsync did not use O_DIRECT"
qemu_check a.qcow2

log "commit -t none, rebase -t none -T none, amend -t none"
"$QEMU_IMG" create -q -f qcow2 base.qcow2 64M
"$QEMU_IO" -f qcow2 -c "write -P 0x11 0 8M" base.qcow2 >/dev/null
"$QEMU_IMG" create -q -f qcow2 -b base.qcow2 -F qcow2 top.qcow2
"$QEMU_IO" -f qcow2 -c "write -P 0x22 1M 2M" -c "write -P 0x33 30M 1M" top.qcow2 >/dev/null
"$QEMU_IMG" convert -O raw top.qcow2 view.raw
traced "$TD" commit -q -t none top.qcow2
[[ $RC == 0 ]] || fail "commit -t none: exit $RC, $(cat "$ERR")"
[[ $(direct_fds trace.txt base.qcow2) -ge 1 ]] || fail "commit -t none did not write base.qcow2 with O_DIRECT"
[[ $(direct_fds trace.txt top.qcow2) -ge 1 ]] || fail "commit -t none did not open top.qcow2 with O_DIRECT"
ok "$QEMU_IMG" compare -f raw -F qcow2 view.raw base.qcow2
qemu_check base.qcow2 top.qcow2
# rebase (safe mode) onto an empty base: the image takes what the old base showed.
"$QEMU_IO" -f qcow2 -c "write -P 0x44 40M 1M" top.qcow2 >/dev/null
"$QEMU_IMG" convert -O raw top.qcow2 view.raw
"$QEMU_IMG" create -q -f qcow2 empty.qcow2 64M
traced "$TD" rebase -t none -T none -b empty.qcow2 -F qcow2 top.qcow2
[[ $RC == 0 ]] || fail "rebase -t none -T none: exit $RC, $(cat "$ERR")"
[[ $(direct_fds trace.txt top.qcow2) -ge 1 ]] || fail "rebase -t none did not open top.qcow2 with O_DIRECT"
[[ $(direct_fds trace.txt empty.qcow2) -ge 1 ]] || fail "rebase -T none did not read empty.qcow2 with O_DIRECT"
ok "$QEMU_IMG" compare -f raw -F qcow2 view.raw top.qcow2
qemu_check top.qcow2
traced "$TD" amend -t none -o lazy_refcounts=on top.qcow2
[[ $RC == 0 ]] || fail "amend -t none: exit $RC, $(cat "$ERR")"
[[ $(direct_fds trace.txt top.qcow2) -ge 1 ]] || fail "amend -t none did not open top.qcow2 with O_DIRECT"
ok "$QEMU_IMG" info --output=json top.qcow2
[[ $(jq '."format-specific".data."lazy-refcounts"' "$OUT") == true ]] ||
  fail "amend -t none -o lazy_refcounts=on did not set it"
ok "$QEMU_IMG" compare -f raw -F qcow2 view.raw top.qcow2

log "bad -T and -t values"
capture "$TD" compare -T bogus a.qcow2 b.raw # compare's errors exit 2, as qemu-img's
[[ $RC == 2 ]] && grep -q "invalid -T 'bogus'" "$ERR" || fail "compare -T bogus: exit $RC, $(cat "$ERR")"
td_fails "invalid -T 'bogus'" "check -T bogus" check -T bogus a.qcow2
td_fails "invalid -t 'bogus'" "commit -t bogus" commit -t bogus top.qcow2
td_fails "invalid -t 'bogus'" "rebase -t bogus" rebase -t bogus -u -b base.qcow2 -F qcow2 top.qcow2
td_fails "invalid -T 'bogus'" "rebase -T bogus" rebase -T bogus -u -b base.qcow2 -F qcow2 top.qcow2
td_fails "invalid -t 'bogus'" "amend -t bogus" amend -t bogus -o lazy_refcounts=off top.qcow2
ok "$QEMU_IMG" compare -f raw -F qcow2 view.raw top.qcow2

echo PASS

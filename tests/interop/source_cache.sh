#!/usr/bin/env bash
# -T SRC_CACHE of compare and check, as qemu-img takes it: the images are
# read with that cache mode (none and directsync: O_DIRECT, as strace shows
# on their descriptors) and the answers are those without it, judged by
# qemu-img.
#   1. compare -T none: identical images exit 0, a changed byte exits 1
#      with qemu-img's mismatch offset; both files are read with O_DIRECT,
#      which the default (writeback) does not set.
#   2. check -T none on a clean image, and check -r leaks -T directsync on
#      an image with a leaked cluster (a refcount raised by hand): the leak
#      is reported and repaired through O_DIRECT, and qemu-img check then
#      finds the image clean.
#   3. a bad -T value is refused, naming it (compare exits 2, check 1).
source "$(dirname "$0")/lib.sh"
require_tool "$QEMU_IMG" "$QEMU_IO" strace python3
require_thindisk

# direct_fds TRACE FILE: how many descriptors of FILE were switched to
# O_DIRECT in an strace log of openat and fcntl.
direct_fds() {
  python3 - "$1" "$2" <<'EOF'
import re, sys
fds, direct = set(), 0
for line in open(sys.argv[1]):
    m = re.search(r'openat\(AT_FDCWD, "([^"]*)", .*\) = (\d+)$', line)
    if m:
        if m.group(1).endswith(sys.argv[2]):
            fds.add(m.group(2))
        else:
            fds.discard(m.group(2))
        continue
    m = re.search(r'fcntl\((\d+), F_SETFL, .*O_DIRECT', line)
    if m and m.group(1) in fds:
        direct += 1
print(direct)
EOF
}

# traced CMD...: runs CMD under strace (openat, fcntl) into trace.txt; sets RC.
traced() { capture strace -f -e trace=openat,fcntl -o trace.txt "$@"; }

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

log "bad -T values"
capture "$TD" compare -T bogus a.qcow2 b.raw # compare's errors exit 2, as qemu-img's
[[ $RC == 2 ]] && grep -q "invalid -T 'bogus'" "$ERR" || fail "compare -T bogus: exit $RC, $(cat "$ERR")"
td_fails "invalid -T 'bogus'" "check -T bogus" check -T bogus a.qcow2

echo PASS

#!/usr/bin/env bash
# `thindisk backup` makes the new backup durable before it resets the bitmap
# (docs/backup.md "Order"), watched with strace: the backup's data synced
# (fdatasync of the target) AND its name (fsync of the directory that holds
# the new file: fsync(2), "Calling fsync() does not necessarily ensure that
# the entry in the directory containing the file has also reached disk"),
# both before the first write to the source's bitmap (a local source) or the
# clear-bitmap request (a served disk). Otherwise a power loss right after
# the reset can leave a chain without its newest backup while the bitmap no
# longer marks what it held: the next incremental silently misses those
# changes. Covered: a full backup that adds the bitmap, an incremental of a
# local image, an incremental of a disk served with --control; each backup
# in a directory of its own, and the chain across them restores.
source "$(dirname "$0")/lib.sh"

require_thindisk
require_tool "$QEMU_IMG" "$QEMU_IO" strace python3 jq

M=$((1 << 20))

# traced TRACE ARGS...: `thindisk backup ARGS` under strace (threads
# followed, descriptors shown with their paths), must succeed. LeakSanitizer
# cannot run under ptrace (it stops with a fatal error), so a sanitized
# build's leak check is off here only; serve.backup and interop.bitmaps_copy
# run the same backups with it on.
traced() {
  local trace=$1
  shift
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" ok strace -f -y -qq -s 512 -o "$trace" \
    -e trace=openat,pwrite64,pwritev,pwritev2,write,fsync,fdatasync,syncfs,sync,sendto,sendmsg \
    "$TD" backup "$@"
}

# durable_first TRACE TARGET RESET: in TRACE, after TARGET was created,
# an fdatasync/fsync of TARGET and an fsync of its directory come before
# the first RESET syscall: "source:PATH" (a write or sync of the source
# image) or "clear" (the clear-bitmap request sent to the control socket).
durable_first() {
  python3 - "$@" <<'EOF'
import os, re, sys
trace, target, reset = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3]
directory = os.path.dirname(target)
lines = open(trace).read().splitlines()
def fd_path(line):
    m = re.match(r"\d+\s+\w+\(\d+<([^>]*)>", line)
    return m.group(1) if m else None
def call(line):
    m = re.match(r"\d+\s+(\w+)\(", line)
    return m.group(1) if m else None
created = next((i for i, l in enumerate(lines)
                if call(l) == "openat" and "O_CREAT" in l and ("<" + target + ">") in l), None)
if created is None:
    sys.exit(f"{trace}: no creation of {target}")
def is_reset(l):
    if reset == "clear":
        return call(l) in ("sendto", "sendmsg", "write") and "clear-bitmap" in l
    src = os.path.abspath(reset.split(":", 1)[1])
    return fd_path(l) == src and call(l) in ("pwrite64", "pwritev", "pwritev2", "write",
                                             "fdatasync", "fsync")
reset_at = next((i for i in range(created, len(lines)) if is_reset(lines[i])), None)
if reset_at is None:
    sys.exit(f"{trace}: the bitmap reset ({reset}) is not in the trace")
window = lines[created:reset_at]
synced = any(call(l) in ("fdatasync", "fsync") and fd_path(l) == target for l in window)
named = any((call(l) == "fsync" and fd_path(l) == directory) or call(l) in ("syncfs", "sync")
            for l in window)
print(f"{trace}: target created at line {created}, bitmap reset at line {reset_at}: "
      f"data synced before: {synced}, directory synced before: {named}")
if not synced:
    sys.exit(f"{target}: its data is not synced before the bitmap reset")
if not named:
    sys.exit(f"{target}: its directory {directory} is not synced before the bitmap reset: "
             "a power loss can lose the new backup's name while the bitmap is reset")
EOF
}

FAILED=()
mkdir full inc served
ok "$QEMU_IMG" create -q -f qcow2 disk.qcow2 64M
io_ok qemu-io disk.qcow2 "write -P 1 0 1M" "write -P 2 $((9 * M)) 64k"

log "a full backup that adds the bitmap"
traced full.trace --bitmap daily disk.qcow2 full/b0.qcow2
durable_first full.trace full/b0.qcow2 source:disk.qcow2 || FAILED+=("a full backup")

log "an incremental of a local image"
io_ok qemu-io disk.qcow2 "write -P 3 $((5 * M)) 4k"
traced inc.trace --bitmap daily --incremental full/b0.qcow2 disk.qcow2 inc/b1.qcow2
durable_first inc.trace inc/b1.qcow2 source:disk.qcow2 || FAILED+=("a local incremental")

log "an incremental of a served disk"
serve_unix sv "$TMP/s.sock" -B daily --control "$TMP/ctl.sock" disk.qcow2
wait_for_socket "$TMP/ctl.sock"
io_ok qemu-io-raw "nbd+unix:///?socket=$TMP/s.sock" "write -P 4 $((7 * M)) 4k"
traced served.trace --bitmap daily --incremental inc/b1.qcow2 --control "$TMP/ctl.sock" \
  "nbd+unix:///?socket=$TMP/s.sock" served/b2.qcow2
durable_first served.trace served/b2.qcow2 clear || FAILED+=("a served incremental")
stop_server "$SERVER_PID" sv
# The chain across directories (backing files named relative) restores.
ok "$QEMU_IMG" compare disk.qcow2 served/b2.qcow2
ok "$QEMU_IMG" info --output=json served/b2.qcow2
assert_eq "../inc/b1.qcow2" "$(jq -r '.["backing-filename"]' "$OUT")" "served/b2.qcow2's backing file"

((${#FAILED[@]} == 0)) || fail "the bitmap is reset before the new backup is durable in: ${FAILED[*]}"

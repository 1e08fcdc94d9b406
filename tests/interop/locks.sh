#!/usr/bin/env bash
# One writer per image, against qemu 7.2's own image locks (OFD byte-range
# locks, io/qemu_lock.h), in both directions:
#  - while `thindisk serve` holds a clone, qemu-io and qemu-img writes and a
#    qemu-nbd on it are refused, a second `thindisk serve` too, and the image
#    is byte-identical afterwards; `qemu-img info -U` / `qemu-io -r -U` read;
#  - while qemu-nbd holds it, every thindisk command that writes is refused
#    with "in use by another process" and changes nothing; readers without
#    -U are refused as qemu-img's are, `-U` readers read;
#  - after kill -9 of the holder the image opens for writing at once;
#  - two clones over one base are served at the same time (readers of a
#    backing file share it), and a writer of that base is refused meanwhile.
source "$(dirname "$0")/lib.sh"
require_tool "$QEMU_IMG" "$QEMU_IO" qemu-nbd nbdinfo cmp
require_thindisk

SIZE=16M

# read_shared TOOL FILE CMDS...: TOOL (qemu-io or thindisk) reads FILE with
# -r -U; every command must succeed and every pattern match.
read_shared() {
  local tool=$1 file=$2 c args=()
  shift 2
  for c in "$@"; do args+=(-c "$c"); done
  if [[ $tool == thindisk ]]; then
    ok "$TD" io -r -U "${args[@]}" "$file"
  else
    ok "$QEMU_IO" -r -U "${args[@]}" "$file"
  fi
  ! grep -qiE 'verification failed|error|failed' "$OUT" "$ERR" ||
    fail "$tool -r -U on $file: $(cat "$OUT" "$ERR")"
}

# refused WHAT CMD...: CMD must fail, saying the image is in use.
refused() {
  local what=$1
  shift
  capture timeout 20 "$@"
  [[ $RC -ne 0 ]] || fail "$what: succeeded while the image was held"
  [[ $RC -ne 124 ]] || fail "$what: hung instead of being refused"
  grep -qE 'in use by another process|Failed to get .*lock' "$ERR" ||
    fail "$what: exit $RC without saying the image is in use: $(cat "$ERR")"
}

# unchanged: every image is byte-identical to its snapshot in saved/.
snapshot_files() { rm -rf saved && mkdir saved && cp --sparse=always ./*.qcow2 saved/; }
unchanged() {
  local f
  for f in saved/*.qcow2; do assert_same_bytes "$f" "$(basename "$f")" "$1"; done
}

ok "$QEMU_IMG" create -q -f qcow2 base.qcow2 "$SIZE"
io_ok qemu-io base.qcow2 "write -P 0xba 0 1M"
for c in clone1 clone2; do
  ok "$QEMU_IMG" create -q -f qcow2 -b base.qcow2 -F qcow2 "$c.qcow2"
done
io_ok qemu-io clone1.qcow2 "write -P 0xc1 1M 64k"
ok "$QEMU_IMG" create -q -f qcow2 other.qcow2 "$SIZE"

log "thindisk serve holds clone1: qemu's writers are refused"
serve_unix td "$TMP/td.sock" -f qcow2 clone1.qcow2
TD_PID=$SERVER_PID
snapshot_files
refused "qemu-io write" "$QEMU_IO" -c "write -P 0xee 0 4k" clone1.qcow2
refused "qemu-img resize" "$QEMU_IMG" resize clone1.qcow2 +1M
refused "qemu-img snapshot -c" "$QEMU_IMG" snapshot -c s clone1.qcow2
refused "qemu-img commit" "$QEMU_IMG" commit clone1.qcow2
refused "qemu-img amend" "$QEMU_IMG" amend -o lazy_refcounts=on clone1.qcow2
refused "qemu-nbd" qemu-nbd -k "$TMP/q.sock" clone1.qcow2
refused "qemu-img info (no -U)" "$QEMU_IMG" info clone1.qcow2
refused "second thindisk serve" "$TD" serve -k "$TMP/td2.sock" clone1.qcow2
refused "second thindisk serve -r" "$TD" serve -r -k "$TMP/td2.sock" clone1.qcow2
[[ ! -S $TMP/td2.sock ]] || fail "the refused server left a socket"
log "-U readers read beside thindisk's writer"
ok "$QEMU_IMG" info -U clone1.qcow2
read_shared qemu-io clone1.qcow2 "read -P 0xc1 1M 64k" "read -P 0xba 0 1M"
log "readers of the base share it: clone2 is served and written beside clone1"
serve_unix td2 "$TMP/td2.sock" -f qcow2 clone2.qcow2
TD2_PID=$SERVER_PID
ok "$QEMU_IO" -f raw -c "write -P 0xc2 2M 64k" -c "read -P 0xba 0 1M" \
  "nbd+unix:///?socket=$TMP/td2.sock"
refused "qemu-io write into the shared base" "$QEMU_IO" -c "write 0 4k" base.qcow2
refused "thindisk io write into the shared base" "$TD" io -c "write 0 4k" base.qcow2
stop_server "$TD2_PID" td2
rm -f saved/clone2.qcow2
unchanged "qemu's refused writers"
nbdinfo --size "nbd+unix:///?socket=$TMP/td.sock" >/dev/null || fail "the holder stopped serving"

log "kill -9 of the holder: the image opens for writing at once"
kill_server "$TD_PID" KILL
io_ok qemu-io clone1.qcow2 "write -P 0xc3 3M 4k"
io_ok thindisk clone1.qcow2 "read -P 0xc3 3M 4k" "write -P 0xc4 4M 4k"

log "qemu-nbd holds clone1: thindisk's writers are refused, nothing changes"
qemu_nbd_unix qemu-nbd "$TMP/q.sock" -f qcow2 clone1.qcow2
Q_PID=$SERVER_PID
snapshot_files
refused "io" "$TD" io -c "write -P 0xee 0 4k" clone1.qcow2
refused "serve" "$TD" serve -k "$TMP/td3.sock" clone1.qcow2
refused "serve -r" "$TD" serve -r -k "$TMP/td3.sock" clone1.qcow2
refused "resize" "$TD" resize clone1.qcow2 +1M
refused "commit" "$TD" commit clone1.qcow2
refused "commit -b" "$TD" commit -b base.qcow2 clone1.qcow2
refused "rebase" "$TD" rebase -b "" clone1.qcow2
refused "rebase -u" "$TD" rebase -u -b other.qcow2 -F qcow2 clone1.qcow2
refused "amend" "$TD" amend -o lazy_refcounts=on clone1.qcow2
refused "snapshot -c" "$TD" snapshot -c s clone1.qcow2
refused "check -r leaks" "$TD" check -r leaks clone1.qcow2
refused "compact" "$TD" compact clone1.qcow2
refused "convert onto it" "$TD" convert -O qcow2 other.qcow2 clone1.qcow2
refused "io -r (no -U)" "$TD" io -r -c "read 0 4k" clone1.qcow2
refused "check (no -U)" "$TD" check clone1.qcow2
refused "snapshot -l (no -U)" "$TD" snapshot -l clone1.qcow2
refused "measure (no -U)" "$TD" measure -O qcow2 clone1.qcow2
refused "info (no -U)" "$TD" info clone1.qcow2
refused "map (no -U)" "$TD" map clone1.qcow2
refused "compare (no -U)" "$TD" compare clone1.qcow2 saved/clone1.qcow2
refused "convert's source (no -U)" "$TD" convert -O raw clone1.qcow2 copy.raw
assert_absent copy.raw "a convert refused its source"
log "-U is for reads only"
td_fails "read-only|only lists|cannot be used with -r" "io -U without -r" \
  io -U -c "write 0 4k" clone1.qcow2
td_fails "cannot be used with -r" "check -U -r" check -U -r leaks clone1.qcow2
td_fails "only lists" "snapshot -U -c" snapshot -U -c s clone1.qcow2
log "-U readers read beside qemu-nbd's writer"
read_shared thindisk clone1.qcow2 "read -P 0xc3 3M 4k" "read -P 0xc4 4M 4k" \
  "read -P 0xba 0 1M"
td check -U clone1.qcow2
td snapshot -U -l clone1.qcow2
td measure -U -O qcow2 clone1.qcow2
td info -U --output=json clone1.qcow2
td map -U --output=json clone1.qcow2
grep -q '"depth": 1' "$OUT" || fail "map -U shows no base data: $(cat "$OUT")"
td compare -U clone1.qcow2 saved/clone1.qcow2
td convert -U -O raw clone1.qcow2 copy.raw
ok "$QEMU_IMG" compare -U -f qcow2 -F raw clone1.qcow2 copy.raw
unchanged "thindisk's refused writers"
log "a writer of another clone of the same base works beside qemu-nbd"
io_ok thindisk clone2.qcow2 "write -P 0xd2 5M 4k" "read -P 0xba 0 1M"
stop_server "$Q_PID" qemu-nbd
log "after qemu-nbd exits, thindisk writes"
io_ok thindisk clone1.qcow2 "write -P 0xc5 6M 4k"
qemu_check clone1.qcow2 clone2.qcow2 base.qcow2
log "locks: all checks passed"

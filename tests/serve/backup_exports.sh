#!/usr/bin/env bash
# A backup of one export of a `thindisk serve --control` that serves
# several (--export NAME=IMAGE ..., each with -B daily): the export the URI
# names is the one backed up and the one whose bitmap is reset; the other
# export's bitmap keeps its marks. Judged by nbdcopy/qemu-img compare and
# nbdinfo --map.
source "$(dirname "$0")/lib.sh"
require_tool qemu-img qemu-io nbdinfo nbdcopy

M=$((1 << 20))
SOCK=$TMP/s.sock
CTL=$TMP/ctl.sock

# run WHAT CMD...: CMD must exit 0 within 60 s (its stderr shown if not).
run() {
  local what=$1 rc=0
  shift
  timeout 60 "$@" >run.out 2>run.err || rc=$?
  ((rc == 0)) || { cat run.out run.err >&2; fail "$what: exit $rc"; }
}

for n in a b; do
  run "create $n" "$TD" create -f qcow2 "$n.qcow2" 64M
  run "bitmap --add $n" "$TD" bitmap --add "$n.qcow2" daily
done
serve_unix server "$SOCK" -B daily --export a=a.qcow2 --export b=b.qcow2 --control "$CTL"
SERVER=$SERVER_PID
wait_for_socket "$CTL"
run "write to a" qemu-io -f raw "$(uri "$SOCK" a)" -c "write -q -P 1 $((3 * M)) 64k"
run "write to b" qemu-io -f raw "$(uri "$SOCK" b)" -c "write -q -P 2 0 1M"

log "full backup of export b"
run "nbdcopy b" nbdcopy "$(uri "$SOCK" b)" b0.raw
run "backup of export b" "$TD" backup --bitmap daily --control "$CTL" "$(uri "$SOCK" b)" b0.qcow2
run "compare" qemu-img compare -f qcow2 -F raw b0.qcow2 b0.raw

log "incremental backup of export b"
run "write to b" qemu-io -f raw "$(uri "$SOCK" b)" -c "write -q -P 3 $((7 * M + 100)) 5000"
run "nbdcopy b" nbdcopy "$(uri "$SOCK" b)" b1.raw
run "incremental of export b" "$TD" backup --bitmap daily --incremental b0.qcow2 --control "$CTL" \
  "$(uri "$SOCK" b)" b1.qcow2
run "compare" qemu-img compare -f qcow2 -F raw b1.qcow2 b1.raw

log "b's bitmap was reset, a's kept"
run "map of b" nbdinfo --map=qemu:dirty-bitmap:daily "$(uri "$SOCK" b)"
expect_eq "b's map" "$(awk '{print $1, $2, $3}' run.out)" "0 $((64 * M)) 0"
run "map of a" nbdinfo --map=qemu:dirty-bitmap:daily "$(uri "$SOCK" a)"
grep -qE "^ *$((3 * M)) +65536 +1 +dirty" run.out || { cat run.out >&2; fail "a's write is no longer dirty"; }
stop_server "$SERVER" server

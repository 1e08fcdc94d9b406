#!/usr/bin/env bash
# nbdinfo against `thindisk serve`: --json facts, --list of several exports,
# --map (base:allocation) against `thindisk map`, `qemu-img map` and
# qemu-nbd serving the same image, and --map=qemu:allocation-depth on a
# clone (against `thindisk map` and qemu-nbd).
source "$(dirname "$0")/lib.sh"
# qemu-nbd comes with qemu-img (qemu-utils, scripts/install-deps.sh): the
# qemu-side oracles below always run.
require_tool nbdinfo jq qemu-io qemu-img qemu-nbd

"$TD" create -f qcow2 disk.qcow2 64M >/dev/null
"$TD" create -f qcow2 other.qcow2 16M >/dev/null
qemu-img create -f raw plain.raw 8M >/dev/null

# --- --json of the default export
serve_unix s1 s1.sock -D "main disk" disk.qcow2
pid1=$SERVER_PID
grep -qx "nbd+unix:///?socket=s1.sock" s1.out || fail "URI not printed: $(cat s1.out)"
nbdinfo --json "$(uri s1.sock)" >info.json
expect_eq "export-size" "$(jq '.exports[0]["export-size"]' info.json)" 67108864
expect_eq "export-name" "$(jq -r '.exports[0]["export-name"]' info.json)" ""
expect_eq "description" "$(jq -r '.exports[0].description' info.json)" "main disk"
expect_eq "structured" "$(jq '.structured' info.json)" true
for flag in can_trim can_zero can_flush can_fua can_multi_conn; do
  expect_eq "$flag" "$(jq ".exports[0].$flag" info.json)" true
done
expect_eq "is_read_only" "$(jq '.exports[0].is_read_only' info.json)" false
jq -e '.exports[0].contexts | index("base:allocation")' info.json >/dev/null ||
  fail "base:allocation not offered"

# --- a fresh qcow2 disk maps as one hole+zero extent
nbdinfo --map --json "$(uri s1.sock)" >map0.json
expect_eq "fresh map extents" "$(jq length map0.json)" 1
expect_eq "fresh map type" "$(jq '.[0].type' map0.json)" 3
expect_eq "fresh map length" "$(jq '.[0].length' map0.json)" 67108864

# --- after writes the map matches thindisk map, qemu-img map and qemu-nbd
qemu-io -f raw "$(uri s1.sock)" \
  -c 'write -P 0x11 0 128k' -c 'write -P 0x22 1M 64k' -c 'write -z 2M 1M' \
  -c 'write -P 0x33 8M 2M' -c 'discard 8M 64k' -c 'write -P 0x44 63M 512k' \
  -c flush >/dev/null || fail "qemu-io writes failed"
nbdinfo --map --json "$(uri s1.sock)" >map1.json
stop_server "$pid1" s1
# type bits as NBD base:allocation: 1 hole, 2 zero; neighbours of one type merged.
merge='reduce .[] as $e ([]; if length > 0 and .[-1].type == $e.type
        then .[-1].length += $e.length else . + [$e] end)'
nbd_map="[.[] | {offset, length, type}] | $merge"
# `thindisk map` and `qemu-img map` print the same fields (start, data, zero).
img_map="[.[] | {offset: .start, length, type: ((if .data then 0 else 1 end) +
        (if .zero then 2 else 0 end))}] | $merge"
jq -c "$nbd_map" map1.json >got.json
"$TD" map --output=json disk.qcow2 >tdmap.json
jq -c "$img_map" tdmap.json >want.json
[[ $(jq length got.json) -gt 2 ]] || fail "map after writes too simple: $(cat got.json)"
cmp -s got.json want.json || fail "nbdinfo --map differs from thindisk map:
 nbd:   $(cat got.json)
 local: $(cat want.json)"
# The independent oracles: qemu reads the same file.
qemu-img map -f qcow2 --output=json disk.qcow2 >qimgmap.json
jq -c "$img_map" qimgmap.json >want_qemu.json
cmp -s got.json want_qemu.json || fail "nbdinfo --map differs from qemu-img map:
 thindisk: $(cat got.json)
 qemu-img: $(cat want_qemu.json)"
qemu_nbd_unix qemu-nbd-map "$TMP/qm.sock" -f qcow2 -r -t disk.qcow2
nbdinfo --map --json "$(uri qm.sock)" >qnbdmap.json
kill_server "$SERVER_PID"
jq -c "$nbd_map" qnbdmap.json >got_qemu_nbd.json
cmp -s got.json got_qemu_nbd.json || fail "base:allocation differs from qemu-nbd's:
 thindisk: $(cat got.json)
 qemu-nbd: $(cat got_qemu_nbd.json)"
check_clean disk.qcow2

# --- --list with several exports (and the right sizes)
serve_unix s2 s2.sock --export one=disk.qcow2 --export two=other.qcow2 --export raw=plain.raw
pid2=$SERVER_PID
for n in one two raw; do
  grep -qx "nbd+unix:///$n?socket=s2.sock" s2.out || fail "URI for $n not printed"
done
nbdinfo --list --json "$(uri s2.sock)" >list.json
expect_eq "export names" "$(jq -c '[.exports[]["export-name"]] | sort' list.json)" '["one","raw","two"]'
expect_eq "size of two" "$(jq '.exports[] | select(.["export-name"]=="two") | .["export-size"]' list.json)" 16777216
# Without -D no description (host paths are not shown to clients).
expect_eq "no description" "$(jq '.exports[] | select(.["export-name"]=="two") | .description' list.json)" null
expect_eq "size of raw" "$(nbdinfo --size "$(uri s2.sock raw)")" 8388608
# An export that does not exist is refused.
if nbdinfo --size "$(uri s2.sock nosuch)" >/dev/null 2>&1; then fail "unknown export accepted"; fi
stop_server "$pid2" s2
# nbdinfo --list ends with NBD_OPT_ABORT and hangs up without waiting for
# the ack, as the protocol allows: that is no error for the server to log.
! grep -iE "broken pipe|connection ended" s2.err ||
  fail "the server logged an error for a client that listed and left"

# --- qemu:allocation-depth on a clone: base data, clone data, neither
qemu-img create -f qcow2 base.qcow2 8M >/dev/null
qemu-io -f qcow2 base.qcow2 -c 'write -P 0x55 0 1M' -c 'write -P 0x66 4M 1M' >/dev/null
"$TD" create -f qcow2 -b base.qcow2 -F qcow2 clone.qcow2 >/dev/null
qemu-io -f qcow2 clone.qcow2 -c 'write -P 0x77 512k 1M' >/dev/null
serve_unix s3 s3.sock -r clone.qcow2
pid3=$SERVER_PID
nbdinfo --map=qemu:allocation-depth --json "$(uri s3.sock)" >depth.json
stop_server "$pid3" s3
jq -c "$nbd_map" depth.json >got_depth.json
# qemu:allocation-depth: 0 unallocated, 1 this image, 2 its backing file.
"$TD" map --output=json clone.qcow2 >clone_map.json
jq -c "[.[] | {offset: .start, length, type: (if .present then .depth + 1 else 0 end)}] | $merge" \
  clone_map.json >want_depth.json
cmp -s got_depth.json want_depth.json || fail "allocation-depth differs from thindisk map:
 nbd:   $(cat got_depth.json)
 local: $(cat want_depth.json)"
expect_eq "depth kinds" "$(jq -c '[.[].type] | unique' got_depth.json)" "[0,1,2]"
qemu_nbd_unix qemu-nbd "$TMP/q.sock" -f qcow2 -r -A -t clone.qcow2
nbdinfo --map=qemu:allocation-depth --json "$(uri q.sock)" >qdepth.json
kill_server "$SERVER_PID"
jq -c "$nbd_map" qdepth.json >q_depth.json
cmp -s got_depth.json q_depth.json || fail "allocation-depth differs from qemu-nbd's:
 thindisk: $(cat got_depth.json)
 qemu-nbd: $(cat q_depth.json)"
log "nbdinfo: ok"

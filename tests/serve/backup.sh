#!/usr/bin/env bash
# Incremental backup of a served disk, judged by tools no one here wrote
# (docs/backup.md). A 256 MiB qcow2 with an enabled bitmap `daily` is served
# by `thindisk serve -B daily --control CTL`; a seeded workload of writes
# (random data and patterns, 512 B .. 1 MiB, unaligned too), discards and
# write-zeroes goes through the export with qemu-io. Then a full backup and
# 5 rounds of {a workload batch; an incremental backup over the previous
# one}. At each backup point the export is copied raw with nbdcopy (the
# reference) and its dirty map recorded with nbdinfo. Afterwards, for every
# point k:
#   - qemu-img compare of bk.qcow2 (its chain) against copy k: identical;
#     `thindisk convert -O raw bk.qcow2` is byte-identical to copy k;
#   - qemu-img check of bk.qcow2 is clean, its backing file named relative;
#   - an incremental holds only its dirty ranges: each extent of its own
#     layer (qemu-img map, depth 0) lies inside the recorded dirty ranges
#     (rounded out to the 64 KiB granularity), and together they cover them;
#   - after each backup the export's map of `daily` is all clean.
# The generation guard: query-bitmaps says "tracked": true; a clear-bitmap
# with a generation taken before a write through the export fails with
# "BitmapChanged" and the write stays dirty. Then the local source: the
# server stopped, qemu-io writes into the image (qemu tracks `daily` too),
# and an incremental backup of the image file itself restores equal to an
# nbdcopy of the disk served by qemu-nbd, holding only what qemu-nbd's map
# of `daily` marks. THINDISK_SEED=N reruns a workload.
source "$(dirname "$0")/lib.sh"
require_tool qemu-img qemu-io qemu-nbd nbdinfo nbdcopy python3 jq cmp timeout

random_seed
RANDOM=$((SEED & 0x7fffffff)) # bash's generator: the whole workload follows from the seed

M=$((1 << 20))
SIZE=$((256 * M))
GRAN=65536
ROUNDS=5
SOCK=$TMP/s.sock
CTL=$TMP/ctl.sock
URI=$(uri "$SOCK")

# run WHAT CMD...: CMD must exit 0 within 120 s; its output lands in
# run.out/run.err, shown on failure.
run() {
  local what=$1 rc=0
  shift
  timeout 120 "$@" >run.out 2>run.err || rc=$?
  if ((rc != 0)); then
    sed 's/^/  stdout: /' run.out >&2
    sed 's/^/  stderr: /' run.err >&2
    fail "$what: exit $rc from: $*"
  fi
}

# ctl JSON: one request on the control socket; prints the answer line.
ctl() {
  timeout 20 python3 - "$CTL" "$1" <<'EOF'
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(15)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\n")
buf = b""
while not buf.endswith(b"\n"):
    chunk = s.recv(65536)
    if not chunk:
        break
    buf += chunk
sys.stdout.write(buf.decode())
EOF
}

# ---- The seeded workload ---------------------------------------------------

# Random data for `write -s` (qemu-io fills the buffer from the file).
python3 - "$SEED" <<'EOF'
import random, sys
rng = random.Random(int(sys.argv[1]))
for i in range(4):
    with open(f"rand{i}.bin", "wb") as f:
        f.write(rng.randbytes((1 << 20) + 4096))
EOF

# rnd N: R becomes a seeded random number in [0, N) (no subshell: the
# generator's state must advance in this shell).
rnd() { R=$((((RANDOM << 15) | RANDOM) % $1)); }

# batch N: the qemu-io arguments of N random operations, in BATCH.
batch() {
  local i kind off len
  BATCH=()
  for ((i = 0; i < $1; i++)); do
    rnd 100
    kind=$R
    rnd $((M - 511))
    len=$((512 + R))                              # 512 B .. 1 MiB, mostly unaligned
    ((kind % 4 == 0)) && len=$(((len + 4095) / 4096 * 4096))
    rnd 2
    if ((R)); then rnd $((16 * M)); else rnd "$SIZE"; fi # half in a hot 16 MiB
    off=$R
    ((kind % 3 == 0)) && off=$((off / 4096 * 4096))
    ((off + len > SIZE)) && off=$((SIZE - len))
    if ((kind < 35)); then
      rnd 255
      BATCH+=(-c "write -q -P $((R + 1)) $off $len")
    elif ((kind < 70)); then
      rnd 4
      BATCH+=(-c "write -q -s rand$R.bin $off $len")
    elif ((kind < 85)); then
      BATCH+=(-c "discard -q $off $len")
    elif ((kind < 93)); then
      BATCH+=(-c "write -q -z $off $len")
    else
      BATCH+=(-c "write -q -z -u $off $len")
    fi
  done
}

# workload N: N random operations through the export, one qemu-io run.
workload() {
  batch "$1"
  run "qemu-io workload of $1 operations" qemu-io -f raw "$URI" "${BATCH[@]}"
  ! grep -qiE 'error|failed' run.out run.err || { cat run.out run.err >&2; fail "qemu-io reported a failure"; }
}


# ---- Checks ------------------------------------------------------------------

# all_clean WHAT: the export's map of `daily` is one clean extent.
all_clean() {
  run "nbdinfo map ($1)" nbdinfo --map=qemu:dirty-bitmap:daily "$URI"
  expect_eq "$1: map of daily" "$(awk '{print $1, $2, $3}' run.out)" "0 $SIZE 0"
}

# dirty_at MAP OFFSET: the extent of nbdinfo map MAP holding OFFSET is dirty.
dirty_at() {
  awk -v o="$2" '$1 <= o && o < $1 + $2 && $3 == 1 {found = 1} END {exit !found}' "$1"
}

# holds_only K: bK.qcow2's own layer (qemu-img map, depth 0) lies inside
# the dirty ranges of dirtyK.map rounded out to GRAN, and covers them.
holds_only() {
  local k=$1
  run "qemu-img map b$k.qcow2" qemu-img map --output=json "b$k.qcow2"
  cp run.out "map$k.json"
  python3 - "dirty$k.map" "map$k.json" "$GRAN" "$SIZE" <<'EOF' || fail "b$k.qcow2 does not hold exactly its dirty ranges"
import json, sys
gran, size = int(sys.argv[3]), int(sys.argv[4])
def merged(ranges):
    out = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out
dirty = []
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 3 and f[2] == "1":
        dirty.append((int(f[0]), min(size, int(f[0]) + int(f[1]))))
allowed = merged((a // gran * gran, min(size, -(-b // gran) * gran)) for a, b in dirty)
own = merged((e["start"], e["start"] + e["length"])
             for e in json.load(open(sys.argv[2])) if e["depth"] == 0 and e["present"])
def inside(a, b, ranges):
    return any(x <= a and b <= y for x, y in ranges)
bad = [(a, b) for a, b in own if not inside(a, b, allowed)]
missed = [(a, b) for a, b in merged(dirty) if not inside(a, b, own)]
print(f"{sys.argv[2]}: {len(own)} own extents, {sum(b - a for a, b in own)} bytes; "
      f"dirty {sum(b - a for a, b in merged(dirty))} bytes in {len(merged(dirty))} ranges")
for a, b in bad:
    print(f"  extent [{a}, {b}) lies outside the dirty ranges", file=sys.stderr)
for a, b in missed:
    print(f"  dirty range [{a}, {b}) is not in the backup's own layer", file=sys.stderr)
sys.exit(1 if bad or missed else 0)
EOF
}

# verify K: bK.qcow2 restores to copyK.raw (qemu-img compare, thindisk
# convert), is clean, and an incremental names its backing relatively and
# holds only its dirty ranges.
verify() {
  local k=$1
  run "qemu-img compare b$k.qcow2 copy$k.raw" qemu-img compare -f qcow2 -F raw "b$k.qcow2" "copy$k.raw"
  grep -q "Images are identical" run.out || fail "b$k.qcow2 vs copy$k.raw: $(cat run.out)"
  run "thindisk convert b$k.qcow2" "$TD" convert -O raw "b$k.qcow2" "restored$k.raw"
  cmp "restored$k.raw" "copy$k.raw" >&2 || fail "thindisk convert of b$k.qcow2 differs from copy $k"
  rm -f "restored$k.raw"
  check_clean "b$k.qcow2"
  if ((k > 0)); then
    run "qemu-img info b$k.qcow2" qemu-img info --output=json "b$k.qcow2"
    expect_eq "b$k.qcow2 backing file" "$(jq -r '.["backing-filename"]' run.out)" "b$((k - 1)).qcow2"
    holds_only "$k"
  fi
}

# point K: records the dirty map and an nbdcopy of the export, then backs
# it up through the export into bK.qcow2 (full for K=0, else over b(K-1)).
point() {
  local k=$1 inc=()
  ((k == 0)) || inc=(--incremental "b$((k - 1)).qcow2")
  run "nbdinfo map before backup $k" nbdinfo --map=qemu:dirty-bitmap:daily "$URI"
  cp run.out "dirty$k.map"
  run "nbdcopy at point $k" nbdcopy "$URI" "copy$k.raw"
  run "backup $k" "$TD" backup --bitmap daily "${inc[@]}" --control "$CTL" --output=json \
    "$URI" "b$k.qcow2"
  echo "backup $k: $(jq -c '{mode, bytes, "data-written", zeroes}' run.out)"
  all_clean "after backup $k"
}

# ---- The scenario ----------------------------------------------------------

SECONDS=0
run "thindisk create" "$TD" create -f qcow2 disk.qcow2 "$SIZE"
run "thindisk bitmap --add" "$TD" bitmap --add disk.qcow2 daily
serve_unix server "$SOCK" -B daily --control "$CTL" disk.qcow2
SERVER=$SERVER_PID
wait_for_socket "$CTL"

log "generation guard: query-bitmaps"
answer=$(ctl '{"execute": "query-bitmaps"}')
echo "$answer"
expect_eq "query-bitmaps" "$(jq -c '.return | map({name, granularity, enabled, tracked})' <<<"$answer")" \
  '[{"name":"daily","granularity":65536,"enabled":true,"tracked":true}]'

log "workload, then the full backup"
workload 120
point 0
for ((k = 1; k <= ROUNDS; k++)); do
  log "round $k"
  workload 40
  point "$k"
done

log "generation guard: a clear with a stale generation"
answer=$(ctl '{"execute": "query-bitmaps"}')
gen=$(jq -e '.return[0].generation' <<<"$answer") || fail "no generation in: $answer"
GUARD=$((200 * M + 12345))
run "qemu-io write after query" qemu-io -f raw "$URI" -c "write -q -P 0x5a $GUARD 100"
answer=$(ctl "{\"execute\": \"clear-bitmap\", \"arguments\": {\"name\": \"daily\", \"generation\": $gen}}")
echo "$answer"
expect_eq "clear-bitmap with a stale generation" "$(jq -r '.error.class' <<<"$answer")" BitmapChanged
run "nbdinfo map after the refused clear" nbdinfo --map=qemu:dirty-bitmap:daily "$URI"
dirty_at run.out "$GUARD" || { cat run.out >&2; fail "the write at $GUARD is no longer dirty"; }
answer=$(ctl '{"execute": "query-bitmaps"}')
jq -e --argjson g "$gen" '.return[0] | .generation > $g and .["dirty-bytes"] >= 65536' \
  <<<"$answer" >/dev/null || fail "query-bitmaps after the write: $answer"

log "local source: the server stopped, qemu-io writes, a backup of the file"
stop_server "$SERVER" server
batch 30
run "qemu-io on the image" qemu-io -f qcow2 disk.qcow2 "${BATCH[@]}"
L=$((ROUNDS + 1))
rm -f q.sock
qemu_nbd_unix qnbd "$TMP/q.sock" -r -t -f qcow2 -B daily disk.qcow2
QNBD=$SERVER_PID
wait_accepting "$(uri "$TMP/q.sock")"
run "qemu-nbd map of daily" nbdinfo --map=qemu:dirty-bitmap:daily "$(uri "$TMP/q.sock")"
cp run.out "dirty$L.map"
dirty_at "dirty$L.map" "$GUARD" || fail "the refused clear's write is not dirty on disk"
run "nbdcopy from qemu-nbd" nbdcopy "$(uri "$TMP/q.sock")" "copy$L.raw"
kill_server "$QNBD"
run "local backup" "$TD" backup --bitmap daily --incremental "b$ROUNDS.qcow2" disk.qcow2 "b$L.qcow2"
cat run.out
run "thindisk convert of the disk" "$TD" convert -O raw disk.qcow2 final.raw
cmp final.raw "copy$L.raw" >&2 || fail "thindisk convert of the disk differs from qemu-nbd's nbdcopy"
rm -f final.raw
run "qemu-img info of the disk" qemu-img info --output=json disk.qcow2
expect_eq "the disk's bitmaps after the local backup" \
  "$(jq -c '.["format-specific"].data.bitmaps' run.out)" '[{"flags":["auto"],"name":"daily","granularity":65536}]'
rm -f q.sock
qemu_nbd_unix qnbd2 "$TMP/q.sock" -r -t -f qcow2 -B daily disk.qcow2
QNBD=$SERVER_PID
wait_accepting "$(uri "$TMP/q.sock")"
run "qemu-nbd map of daily after the local backup" nbdinfo --map=qemu:dirty-bitmap:daily "$(uri "$TMP/q.sock")"
expect_eq "daily after the local backup" "$(awk '{print $1, $2, $3}' run.out)" "0 $SIZE 0"
kill_server "$QNBD"

log "verify every backup point"
for ((k = 0; k <= L; k++)); do verify "$k"; done
check_clean disk.qcow2
echo "backup: ${SECONDS}s"

#!/usr/bin/env bash
# One writer per rados:// image across processes and hosts (issue 14, step
# 4; io/rados_lock.h), judged from outside: `rados` shows the cls lock and
# the watches, qemu-io (a client no one here wrote) writes through a served
# image, and the bytes that land are read back out of the pool.
#   1. a writer (thindisk serve) holds the lock; every other writer (a
#      second serve, io, resize, snapshot, convert onto it, rm) is refused
#      naming the holder, and nothing changes; readers are allowed.
#   2. lock ls shows the holder alive; lock break refuses it without --force.
#   3. a holder that is paused (SIGSTOP: a hung host) loses its watch; the
#      next writer fences it and takes the image; when the paused holder
#      resumes, the writes its clients queued while it was paused, and any
#      later one, fail and never land.
#   4. a holder killed with SIGKILL: lock ls shows it gone, lock break
#      fences it; a clean SIGTERM releases the lock at once.
#   5. serve --takeover: the serving holder drains, flushes and exits 0, the
#      new server serves what the old one wrote; a holder with other
#      exports refuses, and keeps serving.
# The test cluster's watch timeout is 5 s (scripts/ceph-cluster.sh).
source "$(dirname "$0")/../interop/lib.sh"
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

require_thindisk
require_tool "$QEMU_IMG" "$QEMU_IO" rados nbdinfo jq
require_test_cluster

POOL=thindisk
TAG=l$$
IMG=rados://$POOL/$TAG-disk
HEADER=$TAG-disk.header
QUEUED=()

# lockers: the JSON list `thindisk lock ls` prints.
lockers() {
  td lock ls --output=json "$IMG"
  cat "$OUT"
}

# read_at OFFSET: the first byte at OFFSET of the image, read out of the
# pool, in hex.
read_at() {
  td convert -O raw "$IMG" "$TMP/now.raw"
  od -An -tx1 -j "$1" -N1 "$TMP/now.raw" | tr -d ' '
}

td create -q -f qcow2 "$IMG" 64M
io_ok thindisk "$IMG" "write -P 0x11 0 64k"

log "a writer holds the lock"
sock=$TMP/a.sock
serve_unix a "$sock" "$IMG"
A=$SERVER_PID
rados_ lock info "$HEADER" thindisk >"$TMP/lock.json"
assert_eq 1 "$(jq '.lockers | length' "$TMP/lock.json")" "cls lockers while served"
assert_eq exclusive "$(jq -r .type "$TMP/lock.json")" "the lock's type"
rados_ listwatchers "$HEADER" | grep -q watcher || fail "the holder registered no watch"
holder=$(jq -r '.lockers[0].name' "$TMP/lock.json")
[[ $(lockers | jq -r '.[0].client') == "$holder" ]] || fail "lock ls names another holder"
assert_eq true "$(lockers | jq '.[0].alive')" "the serving holder is alive"
# ls names the holder too (JSON as lock ls prints it; a LOCK column).
td ls --output=json "rados://$POOL"
assert_eq "$holder true" \
  "$(jq -r --arg n "$TAG-disk" '.[] | select(.name == $n) | "\(.lock.client) \(.lock.alive)"' "$OUT")" \
  "the holder in ls"
td ls "rados://$POOL"
grep -qE "^$TAG-disk .* $holder \(alive\)" "$OUT" || fail "ls does not show the holder: $(cat "$OUT")"

td_fails "in use by $holder" "a second writer (io)" io -c "write -P 0x22 0 4k" "$IMG"
# A second server on the image (another host's): refused before it listens.
td_fails "in use by $holder" "a second server" serve -k "$TMP/second.sock" "$IMG"
[[ ! -S $TMP/second.sock ]] || fail "the refused second server left a socket"
td_fails "in use by $holder" "resize while served" resize "$IMG" 128M
td_fails "in use by $holder" "snapshot -c while served" snapshot -c s1 "$IMG"
td_fails "in use by $holder" "rm while served" rm "$IMG"
td create -q -f qcow2 -b "$IMG" -F qcow2 clone.qcow2
io_ok thindisk clone.qcow2 "write -P 0x66 0 4k"
td_fails "in use by $holder" "commit into a served base" commit clone.qcow2
td info --output=json "$IMG"
assert_eq 67108864 "$(jq '."virtual-size"' "$OUT")" "size after the refused resize"
# Readers are allowed beside the writer.
td io -r -c "read -P 0x11 0 64k" "$IMG"
ok nbdinfo --size "nbd+unix:///?socket=$sock"

log "a paused holder is fenced and its queued and late writes fail"
# The clusters the queued writes go to are written through the server first,
# so those writes allocate nothing (an allocation may flush, and a flush
# fails): a plain overwrite may be held in memory (docs/rados.md,
# "Write-back"), which a holder must stop doing once it may be fenced.
capture "$QEMU_IO" -f raw -c "write -P 0x12 0 64k" -c "write -P 0x12 1M 64k" \
  -c "write -P 0x12 2M 64k" -c flush "nbd+unix:///?socket=$sock"
assert_eq 0 "$RC" "writes through the holder before it is paused"
kill -STOP "$A"
# Writes a guest sends while its server is paused (a hung host) queue in the
# socket: three of them, each with a flush, that must all fail on resume.
# qemu-io flushes after every write by default (writethrough); two of them
# use `-t writeback`, so the write itself must fail, not only its flush.
for off in 0 1M 2M; do
  cache=(-t writeback)
  [[ $off == 1M ]] && cache=()
  timeout 120 "$QEMU_IO" -f raw "${cache[@]}" -c "write -P 0x44 $off 64k" -c flush \
    "nbd+unix:///?socket=$sock" >"queued-$off.out" 2>&1 &
  QUEUED+=($!)
done
wait_watch_gone "$HEADER"
td io -c "write -P 0x33 0 64k" -c "write -P 0x33 1M 64k" -c "write -P 0x33 2M 64k" "$IMG"
grep -q "fenced $holder" "$ERR" || fail "the new writer did not say it fenced $holder: $(cat "$ERR")"
assert_eq "[]" "$(lockers | jq -c .)" "lockers after the new writer closed"
kill -CONT "$A"
for q in "${QUEUED[@]}"; do wait "$q" || true; done  # judged by what they printed
for off in 0 1M 2M; do
  grep -qi 'write failed' "queued-$off.out" ||
    fail "a write queued at the paused holder (at $off) did not fail: $(cat "queued-$off.out")"
done
# The resumed holder still serves; a new write through it must fail too.
capture timeout 60 "$QEMU_IO" -f raw -c "write -P 0x44 0 64k" "nbd+unix:///?socket=$sock"
if ((RC == 0)) && ! grep -qiE 'error|failed' "$OUT" "$ERR"; then
  fail "a fenced holder accepted a write: $(cat "$OUT" "$ERR")"
fi
# None landed: the new writer's bytes everywhere.
td convert -O raw "$IMG" "$TMP/now.raw"
for off in 0 1048576 2097152; do
  assert_eq 33 "$(od -An -tx1 -j "$off" -N1 "$TMP/now.raw" | tr -d ' ')" \
    "the byte at $off after the fenced holder's writes"
done
kill_server "$A" KILL
grep -q "fenced (blocklisted)" a.err || fail "the fenced server did not log why it failed: $(cat a.err)"

log "a killed holder: lock ls and lock break"
serve_unix b "$TMP/b.sock" "$IMG"
B=$SERVER_PID
kill_server "$B" KILL
wait_watch_gone "$HEADER"
assert_eq false "$(lockers | jq '.[0].alive')" "a killed holder is gone"
td ls "rados://$POOL"
grep -qE "^$TAG-disk .* client\.[0-9]+ \(gone\)" "$OUT" || fail "ls does not show a gone holder: $(cat "$OUT")"
td lock break "$IMG"
grep -q "^Fenced client\." "$OUT" || fail "lock break printed: $(cat "$OUT")"
assert_eq "[]" "$(lockers | jq -c .)" "lockers after lock break"
td lock break "$IMG"
grep -q "the lock is free" "$OUT" || fail "lock break of a free lock printed: $(cat "$OUT")"

log "a live holder: break needs --force; SIGTERM releases"
serve_unix c "$TMP/c.sock" "$IMG"
C=$SERVER_PID
td_fails "is alive.*--force" "lock break of a live holder" lock break "$IMG"
stop_server "$C" c
assert_eq "[]" "$(lockers | jq -c .)" "lockers after a clean stop"
td ls --output=json "rados://$POOL"
assert_eq null "$(jq -c --arg n "$TAG-disk" '.[] | select(.name == $n) | .lock' "$OUT")" \
  "the lock in ls after a clean stop"
io_ok thindisk "$IMG" "write -P 0x55 64k 4k"
td io -r -c "read -P 0x33 0 64k" -c "read -P 0x55 64k 4k" "$IMG"

log "takeover: a live server hands the image over"
serve_unix d "$TMP/d.sock" "$IMG"
D=$SERVER_PID
io_ok qemu-io-raw "nbd+unix:///?socket=$TMP/d.sock" "write -P 0x77 128k 64k"
old_holder=$(lockers | jq -r '.[0].client')
serve_unix e "$TMP/e.sock" --takeover "$IMG"
E=$SERVER_PID
# The old server let go as on SIGTERM: drained, flushed, exited 0.
wait_exit "$D" "the old server" "handing over"
assert_eq 0 "$STOP_RC" "exit status of the server that handed over"
grep -q "handing the image over" d.err || fail "the old server did not say it handed over: $(cat d.err)"
new_holder=$(lockers | jq -r '.[0].client')
[[ $new_holder != "$old_holder" ]] || fail "the lock is still $old_holder's after the takeover"
io_ok qemu-io-raw "nbd+unix:///?socket=$TMP/e.sock" "read -P 0x77 128k 64k" "write -P 0x78 192k 4k"
stop_server "$E" e
td io -r -c "read -P 0x77 128k 64k" -c "read -P 0x78 192k 4k" "$IMG"

log "takeover refused by a server with other exports"
ok "$QEMU_IMG" create -f qcow2 -q other.qcow2 1M
serve_unix f "$TMP/f.sock" --export a="$IMG" --export b=other.qcow2
F=$SERVER_PID
td_fails "refused to hand the image over" "takeover from a server with two exports" \
  serve -k "$TMP/g.sock" --takeover "$IMG"
grep -q "refused to hand the image over" f.err || fail "the holder did not log its refusal: $(cat f.err)"
ok nbdinfo --size "nbd+unix:///a?socket=$TMP/f.sock"  # still serving
stop_server "$F" f

td_fails "not a rados:// image" "lock ls of a local file" lock ls local.qcow2
td_fails "no such image" "lock ls of a missing image" lock ls "rados://$POOL/$TAG-none"
td rm -q "$IMG"
echo "PASS"

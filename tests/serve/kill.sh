#!/usr/bin/env bash
# Crash safety of the real process: a seeded libnbd client (crash_client.c)
# writes into a qcow2 image through `thindisk serve` (several requests in
# flight, unaligned writes, write_zeroes, FUA, flushes) and logs what was
# acknowledged; the server is SIGKILLed at a random moment, and the image,
# which keeps accumulating history across kills (a third of the rounds have
# two clients at once), must then:
#   (a) pass `thindisk check` (leaks allowed: exit 0 or 3),
#   (b) pass `qemu-img check` (exit 0 or 3),
#   (c) read back every write acknowledged before a completed flush (or with
#       FUA) unless a later write covered it, and
#   (d) hold no byte that was never written there (zeros, backing data or a
#       value some write put in that very byte), and
#   (e) on the images that have persistent bitmaps (the default and the
#       standard layouts: two enabled bitmaps each, added when the image was
#       empty), qemu-img info lists them consistent (not in use) and
#       qemu-nbd -B exports each with every byte that holds data inside a
#       dirty granule: a kill never costs a bitmap, as it would qemu's.
# Rounds run on a fresh default-layout image, on qemu's default layout, on a
# compressed image and on a clone of a backing file, with server options
# (--aio=threads, where the other rounds read through a ring per
# connection; O_DIRECT, a small metadata cache, --discard=ignore) drawn
# from the seed.
# The last state is also read through qemu-img convert (an independent
# reader) and repaired.
#
# THINDISK_SEED=N reproduces a run (the kill moments are timing-dependent,
# the requests are not); THINDISK_KILLS=N sets the number of kills (50).
source "$(dirname "$0")/lib.sh"
require_tool qemu-img qemu-nbd nbdinfo python3
require_client CRASH_CLIENT

random_seed
KILLS=${THINDISK_KILLS:-50}
RANDOM=$((SEED & 0x7fffffff)) # the script's own choices follow the seed too

# An 8 GiB image (128 KiB clusters by default: one L2 table per GiB), written
# in five 1 MiB zones: the start, across the first L2 boundary, an unaligned
# spot, the middle and the end of the disk.
SIZE=$((8 << 30))
G=$((1 << 30)) M=$((1 << 20)) K=1024
ZONES_A="0+$M,$((2 * G + 300 * K))+$M,$((SIZE - M))+$M"
ZONES_B="$((G - M / 2))+$M,$((5 * G + 3 * M))+$M"
ZONES="$ZONES_A,$ZONES_B"
# The base of the clone holds data in the first half of each zone.
HALF_ZONES="0+$((M / 2)),$((G - M / 2))+$((M / 2)),$((2 * G + 300 * K))+$((M / 2))"
HALF_ZONES+=",$((5 * G + 3 * M))+$((M / 2)),$((SIZE - M))+$((M / 2))"

# Server options for one round, drawn from the script's seeded RANDOM.
round_options() {
  local opts=()
  ((RANDOM % 3 == 0)) && opts+=(--aio=threads)
  ((RANDOM % 4 == 0)) && opts+=(--cache=none)
  ((RANDOM % 3 == 0)) && opts+=(--cache-size 64k) # evictions write metadata early
  # unmap, the default, lets write_zeroes and trim deallocate; ignore keeps
  # every cluster, as zero flags
  ((RANDOM % 4 == 0)) && opts+=(--discard=ignore)
  echo "${opts[@]}"
}

# checks IMAGE: (a) and (b) on a stopped image, side by side.
checks() {
  local img=$1 rc=0 qrc=0 qpid
  qemu-img check -f qcow2 "$img" >qcheck.out 2>&1 &
  qpid=$!
  "$TD" check "$img" >tcheck.out 2>&1 || rc=$?
  wait $qpid || qrc=$?
  [[ $rc == 0 || $rc == 3 ]] || { cat tcheck.out >&2; fail "thindisk check $img exited $rc"; }
  [[ $qrc == 0 || $qrc == 3 ]] || { cat qcheck.out >&2; fail "qemu-img check $img exited $qrc"; }
}

# bitmap_checks IMAGE: (e), when IMAGE has bitmaps (BITMAPS names them).
BITMAPS=(bm64k bm4k)
bitmap_checks() {
  local img=$1 b
  qemu-img info --output=json -f qcow2 "$img" >qinfo.json 2>qinfo.err ||
    { cat qinfo.err >&2; fail "qemu-img info $img after round $ROUND"; }
  python3 - qinfo.json "${BITMAPS[@]}" <<'PY' || fail "(e) bitmaps of $img after round $ROUND"
import json, sys
info = json.load(open(sys.argv[1]))
got = {b["name"]: b["flags"] for b in info["format-specific"]["data"].get("bitmaps", [])}
for name in sys.argv[2:]:
    if got.get(name) != ["auto"]:
        sys.exit(f"bitmap {name}: flags {got.get(name)} (want ['auto']): {got}")
PY
  qemu-img map --output=json -f qcow2 "$img" >qmap.json
  spawn qn-$ROUND qemu-nbd -t -k "$PWD/qn.sock" -r -f qcow2 "${BITMAPS[@]/#/-B}" "$img"
  for ((b = 0; b < 200; b++)); do
    [[ -S qn.sock ]] && break
    kill -0 "$SERVER_PID" 2>/dev/null || fail "(e) qemu-nbd -B refuses $img after round $ROUND: $(cat qn-$ROUND.err)"
    sleep 0.05
  done
  [[ -S qn.sock ]] || fail "(e) qemu-nbd -B: no socket after 10 s"
  for b in "${BITMAPS[@]}"; do
    nbdinfo --json --map="qemu:dirty-bitmap:$b" "$(uri qn.sock)" >"dirty-$b.json" ||
      fail "nbdinfo --map of bitmap $b of $img after round $ROUND"
  done
  kill_server "$SERVER_PID"
  rm -f qn.sock
  # The image was empty when the bitmaps were added: what holds data now
  # and lies in no dirty granule must still read as zeros (a standard-L2
  # cluster is data as a whole though a write touched part of it).
  python3 - qmap.json "${BITMAPS[@]/#/dirty-}" >uncovered.txt <<'PY'
import json, sys
data = [(e["start"], e["start"] + e["length"]) for e in json.load(open(sys.argv[1]))
        if e.get("data")]
for name in sys.argv[2:]:
    dirty = sorted((e["offset"], e["offset"] + e["length"])
                   for e in json.load(open(name + ".json")) if e["type"] & 1)
    for a, b in data:
        pos = a
        for d0, d1 in dirty:
            if d1 <= pos or d0 >= b: continue
            if d0 > pos: print(pos, d0 - pos, name)
            pos = max(pos, d1)
        if pos < b: print(pos, b - pos, name)
PY
  local reads=() off len name
  while read -r off len name; do reads+=(-c "read -P 0 $off $len"); done <uncovered.txt
  ((${#reads[@]} == 0)) && return 0
  qemu-io -r -f qcow2 "${reads[@]}" "$img" >qio.out 2>&1 || true
  if grep -q -i "fail\|error" qio.out; then
    fail "(e) a bitmap of $img misses a change (round $ROUND, seed $SEED): $(grep -i -m1 'fail\|error' qio.out); uncovered: $(head -3 uncovered.txt)"
  fi
}

# verify SOCKET LOG: (c) and (d) through the running server.
verify() { crash_verify "$1" "$2" "$ZONES" "verify after round $ROUND (log $2)"; }

ROUND=0 MID_WRITE=0
# rounds IMAGE LOG COUNT: COUNT kill-restart-verify cycles on IMAGE.
rounds() {
  local img=$1 hlog=$2 count=$3 i c w sock opts qd ms crc cpids
  for ((i = 0; i < count; i++)); do
    ROUND=$((ROUND + 1))
    sock=r$ROUND.sock
    opts=$(round_options)
    # shellcheck disable=SC2086 # opts is a word list
    serve_unix r$ROUND "$sock" $opts "$img"
    verify "$sock" "$hlog"
    qd=$((1 + RANDOM % 16))
    rm -f ready.*
    if ((RANDOM % 3 == 0)); then
      # Two connections at once on disjoint zones, one shared log: a flush on
      # either covers what both had acknowledged (multi-conn).
      local first
      first=$(awk '$2 > m { m = $2 } END { print m + 1 }' "$hlog")
      echo S >>"$hlog"
      export CRASH_CLIENT_SAME_SERVER=1 CRASH_CLIENT_FIRST=$first
      CRASH_CLIENT_STRIDE=0/2 CRASH_CLIENT_READY=ready.0 "$CRASH_CLIENT" run "$(uri "$sock")" \
        "$hlog" "$SEED" "$ZONES_A" 100000 $qd >client.out 2>client.err &
      cpids=($!)
      CRASH_CLIENT_STRIDE=1/2 CRASH_CLIENT_READY=ready.1 "$CRASH_CLIENT" run "$(uri "$sock")" \
        "$hlog" "$SEED" "$ZONES_B" 100000 $qd >client2.out 2>client2.err &
      cpids+=($!)
      unset CRASH_CLIENT_SAME_SERVER CRASH_CLIENT_FIRST
    else
      CRASH_CLIENT_READY=ready.0 "$CRASH_CLIENT" run "$(uri "$sock")" "$hlog" "$SEED" "$ZONES" \
        100000 $qd >client.out 2>client.err &
      cpids=($!)
    fi
    # The kill clock starts once the clients are connected (or gone: their
    # exit status is judged below), within 30 s.
    for ((c = 0; c < ${#cpids[@]}; c++)); do
      for ((w = 0; w < 3000; w++)); do
        [[ -e ready.$c ]] || ! kill -0 "${cpids[c]}" 2>/dev/null && break
        sleep 0.01
      done
      ((w < 3000)) || fail "client $c neither connected nor exited within 30 s in round $ROUND"
    done
    ms=$((20 + RANDOM % 300))
    sleep "$(printf '0.%03d' "$ms")"
    # --aio=threads (drawn above): no ring; else one per client at most.
    if [[ $opts == *threads* ]]; then
      expect_no_uring "$SERVER_PID" "round $ROUND"
    else
      expect_rings_at_most "$SERVER_PID" "${#cpids[@]}" "round $ROUND"
    fi
    # Now and then the kill lands during the clean shutdown's final flush.
    if ((RANDOM % 5 == 0)); then
      kill -TERM "$SERVER_PID" 2>/dev/null || true
      sleep "0.00$((RANDOM % 10))"
    fi
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    forget_server "$SERVER_PID"
    for ((c = 0; c < ${#cpids[@]}; c++)); do
      crc=0
      wait "${cpids[c]}" || crc=$?
      case $crc in
        3) MID_WRITE=$((MID_WRITE + 1)) ;;
        0) ;;
        *) cat client*.err >&2; fail "client $c exited $crc in round $ROUND" ;;
      esac
    done
    checks "$img"
    [[ $img == disk.qcow2 || $img == std.qcow2 ]] && bitmap_checks "$img"
    echo "round $ROUND: killed after ${ms}ms, ${#cpids[@]} client(s), qd $qd, options '$opts'," \
      "$(grep -c '^A' "$hlog") acks so far"
  done
}

# The final state: verified through a fresh server, then through qemu-img's
# own reader (converted to raw and served raw), then repaired clean.
finish() {
  local img=$1 hlog=$2
  serve_unix fin-$img fin-$img.sock "$img"
  verify fin-$img.sock "$hlog"
  stop_server "$SERVER_PID" fin-$img
  qemu-img convert -f qcow2 -O raw "$img" "$img.raw"
  serve_unix raw-$img raw-$img.sock -f raw -r "$img.raw"
  verify raw-$img.sock "$hlog"
  stop_server "$SERVER_PID" raw-$img
  rm -f "$img.raw"
  "$TD" check -r leaks "$img" >repair.out 2>&1 || { cat repair.out >&2; fail "repair of $img"; }
  check_clean "$img"
}

# The base of the clone (and of the compressed image): data in the first
# half of each zone, flushed, logged as base.log.
"$TD" create -q base.qcow2 $SIZE
: >base.log
serve_unix base base.sock base.qcow2
"$CRASH_CLIENT" seq "$(uri base.sock)" base.log "$SEED" "$HALF_ZONES" $((192 * 1024)) >seq.out ||
  fail "filling the base image"
expect_eq "base fill" "$(cat seq.out)" "first_error=0 flush=0"
stop_server "$SERVER_PID" base

# Kills: half on the default layout (extended L2, 128 KiB clusters); on
# qemu's default layout (64 KiB clusters, standard L2: whole-cluster
# copy-on-write); on a copy of the base with every cluster compressed
# (overwrites free shared host clusters); and a quarter on a clone.
STD_KILLS=$((KILLS * 7 / 50)) COMP_KILLS=$((KILLS * 6 / 50)) CLONE_KILLS=$((KILLS / 4))
log "default layout: $((KILLS - STD_KILLS - COMP_KILLS - CLONE_KILLS)) kills"
"$TD" create -q disk.qcow2 $SIZE
"$TD" bitmap --add disk.qcow2 bm64k
"$TD" bitmap --add -g 4k disk.qcow2 bm4k
: >disk.log
rounds disk.qcow2 disk.log $((KILLS - STD_KILLS - COMP_KILLS - CLONE_KILLS))
finish disk.qcow2 disk.log

log "64 KiB clusters, standard L2: $STD_KILLS kills"
"$TD" create -q -o cluster_size=65536,extended_l2=off std.qcow2 $SIZE
qemu-img bitmap --add std.qcow2 bm64k  # qemu's bitmaps, kept by thindisk
qemu-img bitmap --add -g 4k std.qcow2 bm4k
: >std.log
rounds std.qcow2 std.log $STD_KILLS
finish std.qcow2 std.log

log "compressed clusters: $COMP_KILLS kills"
"$TD" convert -c -O qcow2 base.qcow2 comp.qcow2
cp base.log comp.log # the base's data is the copy's durable start
rounds comp.qcow2 comp.log $COMP_KILLS
finish comp.qcow2 comp.log

log "clone of a backing file: $CLONE_KILLS kills"
"$TD" create -q -b base.qcow2 -F qcow2 clone.qcow2
cp base.log clone.log
rounds clone.qcow2 clone.log $CLONE_KILLS
finish clone.qcow2 clone.log
# The clone's crashes never touched its base.
check_clean base.qcow2
serve_unix base-ro base-ro.sock -r base.qcow2
crash_verify base-ro.sock base.log "$ZONES" "the base image changed"
stop_server "$SERVER_PID" base-ro

log "kill: ok ($ROUND kills, $MID_WRITE clients cut mid-workload, seed $SEED)"

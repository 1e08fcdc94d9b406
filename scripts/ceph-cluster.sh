#!/usr/bin/env bash
# A throwaway one-node Ceph cluster for tests: one mon, one memstore osd,
# 127.0.0.1 only, no auth, one replicated pool, everything in one directory.
#
# Usage:
#   ceph-cluster.sh start DIR [POOL]  start a fresh cluster in DIR (wiped
#                                     first if it holds a stopped cluster);
#                                     ready when a `rados put/get` of POOL
#                                     (default thindisk) round-trips
#   ceph-cluster.sh stop DIR          stop the daemons started from DIR
#   ceph-cluster.sh stop-osd DIR      stop only the osd, cleanly, keeping its
#                                     data (memstore saves it to DIR/osd on
#                                     a clean stop: osd_fast_shutdown is
#                                     turned off first, through its admin
#                                     socket, as the default skips the save)
#   ceph-cluster.sh start-osd DIR     start that osd again (it loads the
#                                     saved data); ready as for start
#   ceph-cluster.sh env DIR           print CEPH_CONF=DIR/ceph.conf
#   ceph-cluster.sh report DIR        what a test that saw the cluster stall
#                                     needs to say why: health, the osd map's
#                                     flags and the osd's state, the osd's
#                                     fill and blocked requests, the daemons'
#                                     warnings, the host's disk and memory
#
# Clients find the cluster through CEPH_CONF=DIR/ceph.conf (ceph, rados, rbd,
# qemu, fio and librados' conf_read_file(nullptr) all honour it).
#
# Two clusters can run at once: the mon listens on two free ports picked at
# start (retried if another process takes them first), and the osd binds
# whatever free ports it finds. Stop sends TERM, then KILL after 10 s, only to
# the daemons whose pid file names a process whose command line holds this
# DIR's ceph.conf, so a reused pid or another cluster is never signalled.
# Every wait is bounded; a failed start stops what it started and exits 1
# with the daemon's log tail. The facts behind the settings:
# /work/shared/ceph/NOTES.md (paxos intervals: start-up in ~2 s, not ~9 s).
#
# Environment: CEPH_CLUSTER_MEMSTORE_BYTES (osd capacity held in RAM,
# default 4 GiB), CEPH_CLUSTER_START_TIMEOUT (seconds, default 60).
set -euo pipefail

usage() {
  echo "usage: $0 start DIR [POOL] | stop DIR | stop-osd DIR | start-osd DIR [POOL] | env DIR | report DIR" >&2
  exit 2
}
[[ $# -ge 2 ]] || usage
CMD=$1
DIR=$2
POOL=${3:-thindisk}
[[ $DIR == /* ]] || DIR=$PWD/$DIR
CONF=$DIR/ceph.conf
START_TIMEOUT=${CEPH_CLUSTER_START_TIMEOUT:-60}

log() { echo "ceph-cluster: $*" >&2; }
die() {
  log "$*"
  exit 1
}

# ---- stop -------------------------------------------------------------------

# ours PID: true when PID is alive and one of its arguments is exactly this
# conf's path (not a substring: /a/ceph.conf must not match /b/a/ceph.conf).
ours() {
  [[ $1 =~ ^[0-9]+$ && -r /proc/$1/cmdline ]] || return 1
  tr '\0' '\n' </proc/"$1"/cmdline 2>/dev/null | grep -qxF -- "$CONF"
}

# stop_daemon NAME: TERM the daemon in DIR/run/NAME.pid, KILL after 10 s.
stop_daemon() {
  local pidfile=$DIR/run/$1.pid pid i
  [[ -f $pidfile ]] || return 0
  pid=$(<"$pidfile")
  if ours "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
      ours "$pid" || break
      sleep 0.1
    done
    if ours "$pid"; then
      log "$1 (pid $pid) still running 10 s after TERM: KILL"
      kill -KILL "$pid" 2>/dev/null || true
      for ((i = 0; i < 50; i++)); do
        ours "$pid" || break
        sleep 0.1
      done
      ! ours "$pid" || log "$1 (pid $pid) survived KILL"
    fi
  fi
  rm -f "$pidfile"
}

stop_cluster() {
  # The osd first: a mon that goes first leaves it retrying for its timeout.
  stop_daemon osd.0
  stop_daemon mon.a
}

# ---- start ------------------------------------------------------------------

# port_free PORT: nothing accepts connections on 127.0.0.1:PORT.
port_free() { ! (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null; }

# pick_ports: sets MON_V2 and MON_V1 to two free ports in 20000-32699,
# below Linux's ephemeral range (32768-60999 by default), so no client's
# outgoing connection can take one between the pick and the mon's bind.
pick_ports() {
  local i p
  for ((i = 0; i < 50; i++)); do
    p=$((20000 + (RANDOM * 32768 + RANDOM) % 12700))
    if port_free "$p" && port_free $((p + 1)); then
      MON_V2=$p MON_V1=$((p + 1))
      return 0
    fi
  done
  die "no two free ports found on 127.0.0.1"
}

write_conf() {
  cat >"$CONF" <<EOF
[global]
fsid = $FSID
mon host = [v2:127.0.0.1:$MON_V2,v1:127.0.0.1:$MON_V1]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd pool default pg num = 8
osd pool default pgp num = 8
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon mgr mkfs grace = 86400
osd crush chooseleaf type = 0
paxos propose interval = 0.05
paxos min wait = 0.01
run dir = $DIR/run
crash dir = $DIR/crash
log file = $DIR/log/\$name.log
pid file = $DIR/run/\$name.pid
admin socket = $DIR/run/\$name.asok
keyring = /dev/null
# A writer that is gone loses its watch on an image (thindisk's lock, and
# RBD's) after this many seconds; then the next writer fences it. 30 s by
# default; short here so the lock tests wait seconds, not half minutes.
osd client watch timeout = 5
# Clients ping their watches once a tick (5 s by default): as long as the
# timeout above, so a watch lapsed every few seconds and a writer held back
# its write-back (io/rados_lock.h Confirmed: the OSD must have confirmed the
# watch within half the timeout). A tick of 1 s keeps it confirmed, as the
# defaults (5 s pings, 30 s timeout) do on a real cluster.
objecter tick interval = 1

[client]
# Clients are many short processes: no admin socket (one name for all
# would collide, "File exists" on every second client's stderr).
admin socket =
# A request the cluster leaves unanswered fails after this many seconds
# (ETIMEDOUT) instead of waiting for good (librados' default 0, which
# thindisk keeps): a stalled test cluster fails the tests that use it,
# with what "ceph-cluster.sh report DIR" prints, instead of hanging the
# run. Far above any outage a test makes on purpose (faults.sh: 3 s).
rados osd op timeout = 60

[mon]
mon data = $DIR/mon/\$name

[osd]
osd data = $DIR/osd/\$name
osd objectstore = memstore
memstore device bytes = ${CEPH_CLUSTER_MEMSTORE_BYTES:-4294967296}
# The osd's fill from the placement groups' byte counts, not from
# memstore's own counter: under concurrent transactions of different
# placement groups that one drifts (16.2.15: 16373, then 4085 bytes with
# an empty pool, then below zero), and once below zero the osd reads
# itself as over 100% full, engages its failsafe and drops every write
# while still serving reads (its log: "full status failsafe engaged,
# dropping updates, now -2147483648% full"). Three rounds of "rados bench
# 5 write -t 32 -b 4096" and a cleanup took it there here; a landing CI's
# TSan RADOS suite hung on it.
fake statfs for testing = ${CEPH_CLUSTER_MEMSTORE_BYTES:-4294967296}
osd journal size = 0
EOF
}

# ceph_cli ARGS...: the ceph CLI against this cluster, bounded.
ceph_cli() { timeout 30 ceph -c "$CONF" --connect-timeout 10 "$@"; }

# wait_pid_file NAME: the daemon wrote its pid file and runs (10 s at most).
wait_pid_file() {
  local i
  for ((i = 0; i < 100; i++)); do
    [[ -f $DIR/run/$1.pid ]] && ours "$(<"$DIR/run/$1.pid")" && return 0
    sleep 0.1
  done
  return 1
}

# log_tail NAME: the last lines of a daemon's log, for a failed start.
log_tail() { tail -n 20 "$DIR/log/$1.log" 2>/dev/null | sed 's/^/  | /' >&2 || true; }

# start_mon: mkfs and start the mon on free ports; retries with new ports if
# the mon dies at once (another process took a port between pick and bind).
start_mon() {
  local attempt
  for ((attempt = 1; attempt <= 5; attempt++)); do
    pick_ports
    write_conf
    rm -rf "$DIR/mon"
    mkdir -p "$DIR/mon"
    timeout 30 monmaptool --create --fsid "$FSID" \
      --addv a "[v2:127.0.0.1:$MON_V2,v1:127.0.0.1:$MON_V1]" "$DIR/monmap" >/dev/null
    timeout 30 ceph-mon --mkfs -i a --monmap "$DIR/monmap" --keyring /dev/null -c "$CONF" ||
      die "ceph-mon --mkfs failed"
    # Daemons get no terminal and none of our pipes (ctest waits for its
    # pipes to close): their stray stderr goes to a log of its own.
    # A mon that cannot bind may exit before it daemonizes: another try,
    # on other ports, as for one that dies just after.
    if ! ceph-mon -i a -c "$CONF" </dev/null >>"$DIR/log/daemons.out" 2>&1; then
      log "ceph-mon exited at start on ports $MON_V2/$MON_V1 (attempt $attempt)"
      log_tail mon.a
      tail -n 5 "$DIR/log/daemons.out" 2>/dev/null | sed 's/^/  | /' >&2 || true
      continue
    fi
    # The mon daemonizes; it dies soon if it cannot bind its ports.
    if wait_pid_file mon.a && sleep 0.3 && ours "$(<"$DIR/run/mon.a.pid")"; then
      return 0
    fi
    log "mon did not stay up on ports $MON_V2/$MON_V1 (attempt $attempt)"
    log_tail mon.a
    stop_daemon mon.a
  done
  die "mon failed to start after 5 attempts"
}

start_osd() {
  local uuid id
  uuid=$(cat /proc/sys/kernel/random/uuid)
  id=$(ceph_cli osd new "$uuid") || die "ceph osd new failed"
  [[ $id == 0 ]] || die "ceph osd new gave id '$id', expected 0"
  mkdir -p "$DIR/osd/osd.0"
  timeout 60 ceph-osd -i 0 --mkfs --osd-uuid "$uuid" -c "$CONF" >"$DIR/log/osd-mkfs.log" 2>&1 || {
    tail -n 20 "$DIR/log/osd-mkfs.log" | sed 's/^/  | /' >&2
    die "ceph-osd --mkfs failed"
  }
  ceph-osd -i 0 -c "$CONF" </dev/null >>"$DIR/log/daemons.out" 2>&1 ||
    die "ceph-osd failed to start"
  wait_pid_file osd.0 || {
    log_tail osd.0
    die "osd did not start"
  }
}

# wait_ready: a put/get round trip through the pool, within START_TIMEOUT.
wait_ready() {
  local deadline=$((SECONDS + START_TIMEOUT)) probe=$DIR/probe got=$DIR/probe.got
  echo "thindisk ceph-cluster probe $FSID" >"$probe"
  while ((SECONDS < deadline)); do
    if timeout 10 rados -c "$CONF" -p "$POOL" --rados-osd-op-timeout 5 put probe "$probe" \
      2>/dev/null &&
      timeout 10 rados -c "$CONF" -p "$POOL" --rados-osd-op-timeout 5 get probe "$got" \
        2>/dev/null && cmp -s "$probe" "$got"; then
      timeout 10 rados -c "$CONF" -p "$POOL" rm probe 2>/dev/null || true
      rm -f "$probe" "$got"
      return 0
    fi
    ours "$(<"$DIR/run/osd.0.pid")" || {
      log_tail osd.0
      die "osd exited during start-up"
    }
    sleep 0.2
  done
  log_tail osd.0
  die "pool $POOL not writable within ${START_TIMEOUT}s"
}

start_cluster() {
  local t0
  t0=$(date +%s%N)
  for tool in ceph ceph-mon ceph-osd monmaptool rados; do
    command -v "$tool" >/dev/null || die "$tool not installed (apt-get install ceph-mon ceph-osd ceph-common)"
  done
  if [[ -f $DIR/run/mon.a.pid ]] && ours "$(<"$DIR/run/mon.a.pid")"; then
    die "a cluster from $DIR is running: stop it first ($0 stop $DIR)"
  fi
  # Never wipe a directory that is not a cluster's: only an empty one or
  # one this script made (it has our ceph.conf).
  if [[ -d $DIR && -n $(ls -A "$DIR") && ! -f $CONF ]]; then
    die "$DIR is not empty and holds no ceph.conf: refusing to wipe it"
  fi
  stop_cluster # a leftover osd of a half-started cluster
  rm -rf "$DIR"
  mkdir -p "$DIR"/{run,log,crash}
  trap 'stop_cluster' EXIT # a failed start leaves no daemons
  FSID=$(cat /proc/sys/kernel/random/uuid)
  start_mon
  start_osd
  ceph_cli osd pool create "$POOL" 8 8 replicated >/dev/null 2>&1 ||
    die "ceph osd pool create $POOL failed"
  wait_ready
  trap - EXIT
  log "cluster up in $((($(date +%s%N) - t0) / 1000000)) ms: CEPH_CONF=$CONF (mon 127.0.0.1:$MON_V2, pool $POOL)"
}

# running NAME: the daemon in DIR/run/NAME.pid is ours and alive.
running() { [[ -f $DIR/run/$1.pid ]] && ours "$(<"$DIR/run/$1.pid")"; }

# stop_osd_keeping_data: the osd's clean shutdown (umount: memstore writes
# its objects to DIR/osd/osd.0) instead of the immediate exit that
# osd_fast_shutdown (on by default) makes of a TERM, which loses them.
stop_osd_keeping_data() {
  running osd.0 || die "no osd of $DIR is running"
  timeout 10 ceph --admin-daemon "$DIR/run/osd.0.asok" config set osd_fast_shutdown false \
    >/dev/null || die "osd_fast_shutdown could not be turned off: its data would be lost"
  stop_daemon osd.0
}

# start_osd_again: the osd of a cluster whose mon runs, on its saved data.
start_osd_again() {
  running mon.a || die "no mon of $DIR is running"
  ! running osd.0 || die "the osd of $DIR is running"
  FSID=$(awk '$1 == "fsid" { print $3 }' "$CONF")
  ceph-osd -i 0 -c "$CONF" </dev/null >>"$DIR/log/daemons.out" 2>&1 ||
    die "ceph-osd failed to start"
  wait_pid_file osd.0 || {
    log_tail osd.0
    die "osd did not start"
  }
  wait_ready
}

# report: bounded, and never fails (it runs after something already did).
report() {
  local asok=$DIR/run/osd.0.asok
  echo "--- ceph-cluster report of $DIR ($(date -u +%H:%M:%S))"
  running mon.a && echo "mon.a running" || echo "mon.a NOT running"
  running osd.0 && echo "osd.0 running" || echo "osd.0 NOT running"
  echo "--- health"
  ceph_cli health detail 2>&1 | head -20 || true
  echo "--- osd map"
  ceph_cli osd dump 2>&1 | grep -E '^(epoch|flags|full_ratio|nearfull_ratio|pool|osd\.0|blocklist)' |
    head -20 || true
  if [[ -S $asok ]]; then
    echo "--- osd fill (bytes: total used available)"
    timeout 10 ceph --admin-daemon "$asok" perf dump 2>/dev/null |
      python3 -c 'import json,sys; o=json.load(sys.stdin)["osd"]; print(o["stat_bytes"], o["stat_bytes_used"], o["stat_bytes_avail"])' ||
      true
    echo "--- osd state"
    timeout 10 ceph --admin-daemon "$asok" status 2>&1 | grep -E '"(state|newest_map|num_pgs)"' ||
      true
    echo "--- osd requests in flight, and scrubs"
    timeout 10 ceph --admin-daemon "$asok" dump_ops_in_flight 2>&1 | head -60 || true
    timeout 10 ceph --admin-daemon "$asok" dump_scrubs 2>&1 | head -20 || true
  fi
  local name
  for name in mon.a osd.0; do
    echo "--- $name log: last warnings"
    grep -aE 'WRN|ERR|full|slow|fail|shutdown|abort|timed out|scrub|wrongly|down' "$DIR/log/$name.log" 2>/dev/null |
      grep -avE 'rocksdb|Stalls|do_prune|_set_cache_ratios|audit|handle_command|create_pending' |
      tail -15 || true
  done
  echo "--- host"
  df -h "$DIR" 2>&1 | tail -1 || true
  free -m 2>&1 | head -2 || true
  return 0
}

case $CMD in
start) start_cluster ;;
report) report ;;
stop) stop_cluster ;;
stop-osd) stop_osd_keeping_data ;;
start-osd) start_osd_again ;;
env) echo "CEPH_CONF=$CONF" ;;
*) usage ;;
esac

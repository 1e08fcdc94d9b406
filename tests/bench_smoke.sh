#!/usr/bin/env bash
# smoke.bench: `thindisk bench` keeps running and reporting sane figures.
# In-process on a tiny image for every default workload, W9 on slow
# storage (--latency), --seed-demo at tiny size,
# bad options, and once with --uri against `thindisk serve` on a Unix
# socket. Figures are checked for presence and sanity with jq, never for
# speed (no timed assertions).
source "$(dirname "$0")/serve/lib.sh"
require_tool jq qemu-img  # qemu-img checks the served image at the end

# check JSON-FILE JQ-EXPR WHAT: the jq expression must be true.
check() {
  jq -e "$2" "$1" >/dev/null || { jq . "$1" >&2; fail "$3"; }
}

log "in-process, every workload, 4 MiB"
"$TD" bench "$TMP" --size 4M --qd 4 --seed 7 --output json -q >inproc.json
check inproc.json '.target == "in-process" and .size == 4194304 and .qd == 4
  and .layout.cluster_size == 131072 and .layout.extended_l2 == true' "report header"
check inproc.json '[.results[].id] == ["W1","W2","W2","W3","W4","W5","W6","W6","W6","W6"]' \
  "one result per workload variant"
check inproc.json '[.results[] | .variant] | .[1:3] == ["qd1","qd4"]' "W2 runs at QD 1 and at --qd"
check inproc.json 'all(.results[]; .ops > 0 and .bytes > 0 and .seconds > 0 and .mb_per_s > 0
  and .iops > 0 and .p50_us > 0 and .p99_us >= .p50_us and .cpu_us_per_op >= 0
  and .cpu_source == "self")' "rates and latencies are positive"
check inproc.json '.results[0].write_amplification == null and .results[0].bytes == 4194304' \
  "W1 reads the whole size and writes nothing"
check inproc.json 'all(.results[1:6][]; .write_amplification >= 0.99 and .write_amplification < 2
  and .space_amplification >= 0.99 and .space_amplification < 2)' "W2-W5 amplification is sane"
check inproc.json 'all(.results[6:][]; .output_ratio > 0 and .output_bytes > 0)' "W6 reports output size"
check inproc.json '[.results[6:][] | select(.variant | endswith("text")) | .output_ratio] | all(. < 0.7)' \
  "the text corpus compresses"
check inproc.json '[.results[6:][] | select(.variant | endswith("random")) | .output_ratio] | all(. > 0.95 and . < 1.2)' \
  "random data does not compress"
compgen -G "$TMP/thindisk-bench-*" >/dev/null && fail "bench left its images behind"

log "W9 on 1 ms storage, QD 1 and --qd"
"$TD" bench "$TMP" --latency 1ms --workloads W9 --size 1M --qd 8 --ops 64 --output json -q >w9.json
check w9.json '.latency_us == 1000 and [.results[] | [.id, .variant, .qd]] == [["W9","qd1",1],["W9","qd8",8]]' \
  "W9 reports QD 1 and QD --qd, and the latency"
check w9.json 'all(.results[]; .ops == 64 and .iops > 0 and .p50_us >= 1000
  and .write_amplification == null)' "W9 figures are positive, --ops caps each phase, reads wait the latency"
check inproc.json '.latency_us == 0' "no latency by default"

log "human output, layout options"
"$TD" bench "$TMP" --size 1M --workloads W2,W4 --cluster-size 64k --extended-l2 off -q >human.txt
grep -q "cluster_size 65536, extended_l2 off" human.txt || { cat human.txt >&2; fail "layout not reported"; }
grep -q "^W4 " human.txt || { cat human.txt >&2; fail "no W4 row"; }
"$TD" bench "$TMP" --size 1M --workloads W9 --qd 2 --latency 500us -q >human9.txt
grep -q ", latency 500us" human9.txt || { cat human9.txt >&2; fail "latency not reported"; }
grep -q "^W9  qd2 " human9.txt || { cat human9.txt >&2; fail "no W9 qd2 row"; }

log "--seed-demo, 1 MiB"
# At 1 MiB one 2 MiB L2 table and refcount block (written whole at the
# flush) weigh 4x the data: amplification up to ~5 is expected there.
"$TD" bench --seed-demo "$TMP" --size 1M --output json -q >demo.json
check demo.json '.seed_demo.size == 1048576 and (.seed_demo.layouts | length) == 2' "two layouts"
check demo.json '[.seed_demo.layouts[] | [.cluster_size, .extended_l2]] == [[131072, true], [2097152, false]]' \
  "the default and the large-cluster layout"
check demo.json 'all(.seed_demo.layouts[].passes[]; .kb_per_s > 0 and .bytes == 1048576
  and .write_amplification >= 0.99 and .write_amplification < 8)' "every pass has figures"
check demo.json '[.seed_demo.layouts[].passes | length] == [3, 3]' "three passes per layout"
# The explanations are computed from the figures (src/bench/seed_demo_test.cc
# shows them change with them): each opens with the figure it explains,
# rounded as printed, and the speed is set against the seed's 421 kB/s.
check demo.json '[.seed_demo.layouts[].passes[:2][] | (.speed_explanation
  | capture("^(?<r>[0-9]+) kB/s, ").r | tonumber) - .kb_per_s | fabs <= 0.51] | length == 4 and all' \
  "the 1 KiB speed explanations open with the measured kB/s"
check demo.json '[.seed_demo.layouts[].passes[2] | (.speed_explanation
  | capture("^(?<r>[0-9]+[.][0-9]) MB/s, ").r | tonumber) - .kb_per_s / 1000 | fabs <= 0.051] | length == 2 and all' \
  "the 1 MiB speed explanations open with the measured MB/s"
check demo.json 'all(.seed_demo.layouts[].passes[]; .speed_explanation | contains("421 kB/s"))' \
  "the speed explanations compare with the seed's rate"
check demo.json '[.seed_demo.layouts[].passes[] | (.amplification_explanation
  | capture("^(?<r>[0-9]+[.][0-9]{2})x: ").r | tonumber) - .write_amplification | fabs <= 0.0051]
  | length == 6 and all' "the amplification explanations open with the measured amplification"

log "bad options exit 1 with a message"
for args in "--workloads W7" "--latency fast" "--latency 1" "--latency 1ms --uri nbd://127.0.0.1" \
            "--uri nbd://127.0.0.1 --workloads W9" "--size 100" "--qd 0" "--output xml" "--seed-demo --uri nbd://127.0.0.1" \
            "--server-pid 1" "--uri nbd://127.0.0.1 --workloads W6" "-o backing_file=x"; do
  rc=0
  # shellcheck disable=SC2086  # split on purpose
  "$TD" bench $args >bad.out 2>bad.err || rc=$?
  [[ $rc == 1 ]] || fail "bench $args: exit $rc, want 1"
  grep -q "thindisk:" bad.err || fail "bench $args: no error message"
  [[ $args != --latency* ]] || grep -q -- "--latency" bad.err || fail "bench $args: error does not name --latency"
done
"$TD" bench --help | grep -q "Examples:" || fail "--help has no examples"

log "--uri against thindisk serve"
"$TD" create -q -f qcow2 disk.qcow2 64M
serve_unix srv "$TMP/nbd.sock" -f qcow2 disk.qcow2
rc=0
"$TD" bench --uri "$(uri "$TMP/nbd.sock")" --size 4M --qd 8 --server-pid "$SERVER_PID" \
  --image disk.qcow2 --output json -q >remote.json 2>remote.err || rc=$?
if [[ $rc != 0 ]] && grep -q "without it" remote.err; then
  skip_or_fail "thindisk was built without libnbd"
fi
[[ $rc == 0 ]] || { cat remote.err >&2; fail "bench --uri exited $rc"; }
check remote.json '[.results[].id] == ["W1","W2","W3","W4"] and (has("layout") | not)' "W1-W4 over NBD"
check remote.json 'all(.results[]; .ops > 0 and .iops > 0 and .p99_us >= .p50_us
  and .cpu_source == "server" and .cpu_us_per_op >= 0 and .allocated_bytes > 0)' "server figures"
check remote.json 'all(.results[1:][]; .space_amplification > 0 and .write_amplification >= 0)' \
  "space and write amplification over NBD"
stop_server "$SERVER_PID" srv
check_clean disk.qcow2
echo "PASS [$TEST_NAME]"

#!/usr/bin/env bash
# smoke.bench_mixed: bench/mixed runs end to end at a tiny size (every
# target, both rows, one run) and prints a complete table: the header, a
# figure in every column of the eight rows (IOPS and read latencies), the
# writer held at its rate, and thindisk's ratio lines; it leaves no work
# directory and no server.
# It judges nothing: figures from a run this small are noise.
#
# Environment: THINDISK (the binary), BENCH_SCRIPTS (the bench/ folder;
# default: beside tests/). Exit 0 pass, 1 fail, 77 skipped.
# shellcheck source=lib/common.sh
source "$(dirname "$0")/lib/common.sh"
BENCH_SCRIPTS=$(realpath "${BENCH_SCRIPTS:-$(dirname "$0")/../bench}")
require_thindisk
require_tool fio qemu-img qemu-nbd nbdkit nbdinfo jq python3 numfmt
enter_temp_dir td-bench-mixed

log "bench/mixed, one run at SIZE=16M"
rc=0
env -u KEEP -u REPORT -u RESULTS_OUT RUNS=1 SIZE=16M RUNTIME=2 RATE_M1=200 RATE_M2=100 \
  DROP_CACHES=0 THINDISK="$TD" BENCH_DIR="$TMP" RESULTS_OUT="$TMP/raw.txt" \
  bash "$BENCH_SCRIPTS/mixed" >mixed.out 2>mixed.err || rc=$?
[[ $rc == 0 ]] || { cat mixed.err mixed.out >&2; fail "bench/mixed exited $rc"; }

log "the table is complete"
python3 - mixed.out raw.txt <<'PY' || { cat mixed.out >&2; fail "incomplete table"; }
import re
import sys

lines = open(sys.argv[1]).read().splitlines()
raw = [l.split() for l in open(sys.argv[2])]
errors = []
need = lambda ok, what: ok or errors.append(what)
need(lines and lines[0].startswith("thindisk bench/mixed, "), "first line names the run")
for p in ("machine: ", "settings: ", "thindisk: "):
    need(any(l.startswith(p) for l in lines), f"a {p!r} line")
head = next((i for i, l in enumerate(lines) if l.startswith("row ")), None)
need(head is not None and all(c in lines[head] for c in ("thindisk", "qemu-nbd", "nbdkit raw")),
     "the column header")
for title in ("M1 reads beside flushed overwrites", "  M1 reads, 99th percentile",
              "  M1 reads, 99.9th percentile", "  M1 flushed overwrites",
              "M2 reads beside flushed first writes", "  M2 reads, 99th percentile",
              "  M2 reads, 99.9th percentile", "  M2 flushed first writes"):
    row = next((l for l in lines if l.startswith(title + " (")), None)
    figs = (row or "")[44:44 + 3 * 15].split()  # a 44-character title, three columns of 15
    need(len(figs) == 3 and all(re.fullmatch(r"\d+(\.\d+)?", f) for f in figs),
         f"{title.strip()}: figures {figs}")
got = sorted({(t, m) for _, t, m, _ in raw})
metrics = [f"{r}.{m}" for r in ("M1", "M2") for m in ("reads", "p99", "p999", "writes")]
need(got == sorted((t, m) for t in ("td", "qn", "nk") for m in metrics), f"raw results {got}")
need(all(float(v) > 0 for *_, v in raw), "a figure of zero")
# The writer is held to its rate (fio may fall short, never go past it).
for _, t, m, v in raw:
    limit = 200 if m == "M1.writes" else 100 if m == "M2.writes" else None
    need(limit is None or float(v) <= limit * 1.05, f"{t} {m} {v} above its rate")
for key in ("M1.reads", "M2.reads"):
    for peer in ("nbdkit raw", "qemu-nbd"):
        need(any(re.fullmatch(rf"{key}: thindisk \d+\.\d\dx {peer}", l) for l in lines),
             f"no ratio line for {key} against {peer}")
for e in errors:
    print("  " + e, file=sys.stderr)
sys.exit(1 if errors else 0)
PY
[[ -z $(ls -d "$TMP"/td-mixed-* 2>/dev/null) ]] || fail "bench/mixed left its work directory"
log "bench_mixed: ok"

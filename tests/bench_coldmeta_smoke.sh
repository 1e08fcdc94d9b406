#!/usr/bin/env bash
# smoke.bench_coldmeta: bench/coldmeta runs end to end at a tiny size (64
# L2 tables, every target, one run) and prints a complete table: the
# header, a figure in every column of its three rows, and the ratio lines
# of each thindisk target against qemu-nbd in the same cache mode; the
# image did not grow (the writer hit the written blocks), and no work
# directory or server is left. It judges nothing: figures from a run this
# small are noise.
#
# Environment: THINDISK (the binary), BENCH_SCRIPTS (the bench/ folder;
# default: beside tests/). Exit 0 pass, 1 fail, 77 skipped.
# shellcheck source=lib/common.sh
source "$(dirname "$0")/lib/common.sh"
BENCH_SCRIPTS=$(realpath "${BENCH_SCRIPTS:-$(dirname "$0")/../bench}")
require_thindisk
require_tool fio qemu-img qemu-io qemu-nbd nbdinfo jq python3 numfmt
enter_temp_dir td-bench-coldmeta

log "bench/coldmeta, one run of a 4 GiB image with 64 tables"
rc=0
env -u KEEP -u REPORT -u RESULTS_OUT -u TARGETS RUNS=1 VSIZE=4G STRIDE=64M RUNTIME=2 \
  DROP_CACHES=0 THINDISK="$TD" BENCH_DIR="$TMP" RESULTS_OUT="$TMP/raw.txt" \
  bash "$BENCH_SCRIPTS/coldmeta" >coldmeta.out 2>coldmeta.err || rc=$?
[[ $rc == 0 ]] || { cat coldmeta.err coldmeta.out >&2; fail "bench/coldmeta exited $rc"; }

log "the table is complete"
python3 - coldmeta.out raw.txt <<'PY' || { cat coldmeta.out >&2; fail "incomplete table"; }
import re
import sys

lines = open(sys.argv[1]).read().splitlines()
raw = [l.split() for l in open(sys.argv[2])]
errors = []
need = lambda ok, what: ok or errors.append(what)
need(lines and lines[0].startswith("thindisk bench/coldmeta, "), "first line names the run")
need(any(l.startswith("settings: ") and "(64 L2 tables)" in l and "warm" in l for l in lines),
     "a settings line with the table count, saying it ran warm")
head = next((l for l in lines if l.startswith("row ")), "")
need(all(c in head for c in ("thindisk", "td cache=none", "qemu-nbd", "qn cache=none")),
     "the column header")
for title in ("C1 cold random reads", "C2 cold reads beside cold writes", "  C2 the writes"):
    row = next((l for l in lines if l.startswith(title + " (")), None)
    figs = (row or "")[40:40 + 4 * 15].split()  # a 40-character title, four columns of 15
    need(len(figs) == 4 and all(re.fullmatch(r"\d+(\.\d+)?", f) for f in figs),
         f"{title.strip()}: figures {figs}")
metrics = ("C1.reads", "C2.reads", "C2.writes")
got = sorted({(t, m) for _, t, m, _ in raw})
need(got == sorted((t, m) for t in ("td", "tdn", "qn", "qnn") for m in metrics), f"raw results {got}")
need(all(float(v) > 0 for *_, v in raw), "a figure of zero")
for key in metrics:
    for mine, peer in (("thindisk", "qemu-nbd"), ("td cache=none", "qn cache=none")):
        need(any(re.fullmatch(rf"{key}: {mine} \d+\.\d\dx {peer}", l) for l in lines),
             f"no ratio line for {key}: {mine} against {peer}")
for e in errors:
    print("  " + e, file=sys.stderr)
sys.exit(1 if errors else 0)
PY
[[ -z $(ls -d "$TMP"/td-coldmeta-* 2>/dev/null) ]] || fail "bench/coldmeta left its work directory"
log "bench_coldmeta: ok"

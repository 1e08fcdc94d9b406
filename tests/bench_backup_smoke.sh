#!/usr/bin/env bash
# smoke.bench_backup: bench/backup runs end to end at a tiny size (one run)
# and prints a complete table: the header, every row with its figures, and
# a `targets: N PASS, M MISS` line counting the five checks; it leaves no
# work directory and no server. It never asks for PASS: figures from a run
# this small are noise.
#
# Environment: THINDISK (the binary), BENCH_SCRIPTS (the bench/ folder;
# default: beside tests/). Exit 0 pass, 1 fail, 77 skipped.
# shellcheck source=lib/common.sh
source "$(dirname "$0")/lib/common.sh"
BENCH_SCRIPTS=$(realpath "${BENCH_SCRIPTS:-$(dirname "$0")/../bench}")
require_thindisk
require_tool fio qemu-img qemu-nbd nbdinfo nbdcopy jq python3 numfmt
enter_temp_dir td-bench-backup

log "bench/backup, one run at SIZE=16M, VSIZE=64M"
rc=0
env -u KEEP -u REPORT -u RESULTS_OUT RUNS=1 SIZE=16M VSIZE=64M OPS=256 MAP_WRITES=200 \
  RUNTIME=20 DROP_CACHES=0 THINDISK="$TD" BENCH_DIR="$TMP" RESULTS_OUT="$TMP/raw.txt" \
  bash "$BENCH_SCRIPTS/backup" >backup.out 2>backup.err || rc=$?
[[ $rc == 0 ]] || { cat backup.err backup.out >&2; fail "bench/backup exited $rc"; }

log "the table is complete"
python3 - backup.out raw.txt <<'PY' || { cat backup.out >&2; fail "incomplete table"; }
import re
import sys

lines = open(sys.argv[1]).read().splitlines()
raw = [l.split() for l in open(sys.argv[2])]
errors = []
need = lambda ok, what: ok or errors.append(what)
need(lines and lines[0].startswith("thindisk bench/backup, "), "first line names the run")
for p in ("machine: ", "storage: ", "settings: ", "thindisk: "):
    need(any(l.startswith(p) for l in lines), f"a {p!r} line")
for title in ("W2 4K first writes", "W3 4K rewrites", "BK incremental backup, image file",
              "BK incremental backup, served disk", "MAP dirty map of 1 TiB, thindisk",
              "MAP dirty map of 1 TiB, qemu-nbd"):
    need(any(l.startswith(title) for l in lines), f"a row {title!r}")
got = sorted({(t, m) for _, t, m, _ in raw})
want = sorted([("none", "W2"), ("none", "W3"), ("bitmap", "W2"), ("bitmap", "W3"),
               ("tdlocal", "BK"), ("tdnbd", "BK"), ("nbdcopy", "BK"), ("tdmap", "MAP"),
               ("tdmap", "extents"), ("qnmap", "MAP")])
need(got == want, f"raw results {got}")
need(all(float(v) > 0 for *_, v in raw), "a figure of zero")
verdict = next((l for l in lines if l.startswith("targets: ")), None)
m = re.fullmatch(r"targets: (\d+) PASS, (\d+) MISS", verdict or "")
need(m is not None and int(m[1]) + int(m[2]) == 5, f"the verdict line: {verdict!r}")
for e in errors:
    print("  " + e, file=sys.stderr)
sys.exit(1 if errors else 0)
PY
[[ -z $(ls -d "$TMP"/td-backup-* 2>/dev/null) ]] || fail "bench/backup left its work directory"
log "bench_backup: ok"

#!/usr/bin/env bash
# smoke.bench_serve_memory: bench/serve-memory runs end to end at a tiny
# size and prints its table: the header, one row per --cache-size asked for
# and the qemu-nbd row, each with write IOPS, read IOPS and peak MiB, and
# the metadata line. Figures are checked for being there and positive,
# never for speed.
#
# Environment: THINDISK (the binary), BENCH_SCRIPTS (the bench/ folder;
# default: beside tests/). Exit 0 pass, 1 fail, 77 skipped.
# shellcheck source=lib/common.sh
source "$(dirname "$0")/lib/common.sh"
BENCH_SCRIPTS=$(realpath "${BENCH_SCRIPTS:-$(dirname "$0")/../bench}")
require_thindisk
require_tool fio qemu-img qemu-nbd numfmt python3
fio --enghelp=nbd >/dev/null 2>&1 || skip_or_fail "fio was built without its nbd engine"
enter_temp_dir td-bench

log "bench/serve-memory, 1 GiB image, 256 ops, two cache sizes"
rc=0
env VSIZE=1G OPS=256 CACHES="1M 4M" THINDISK="$TD" BENCH_DIR="$TMP" \
  bash "$BENCH_SCRIPTS/serve-memory" >memory.out 2>memory.err || rc=$?
[[ $rc == 0 ]] || { cat memory.err memory.out >&2; fail "bench/serve-memory exited $rc"; }

log "the table is complete"
python3 - memory.out <<'PY' || { cat memory.out >&2; fail "incomplete table"; }
import re
import sys

lines = open(sys.argv[1]).read().splitlines()
errors = []


def need(ok, what):
    if not ok:
        errors.append(what)


def first(prefix):
    return next((l for l in lines if l.startswith(prefix)), None)


need(bool(lines) and lines[0].startswith("thindisk bench/serve-memory, "), "first line names the run")
need(first("image 1G (sparse), 256 random 4 KiB writes") is not None, "an image line with VSIZE and OPS")
header = first("server ")
need(header is not None and header.split()[1:] == ["write", "IOPS", "read", "IOPS", "peak", "MiB"],
     f"the column header: {header!r}")
for name in ("thindisk 128k+xl2 --cache-size 1M", "thindisk 128k+xl2 --cache-size 4M",
             "qemu-nbd 64k (default cache)"):
    found = [l for l in lines if l.startswith(name + " ")]
    if len(found) != 1:
        errors.append(f"row '{name}': {len(found)} lines")
        continue
    figs = found[0][len(name):].split()
    need(len(figs) == 3 and all(re.fullmatch(r"\d+(\.\d+)?", f) and float(f) > 0 for f in figs),
         f"row '{name}': want write IOPS, read IOPS, peak MiB > 0, got {figs}")
need(re.search(r"^metadata for all of it \(128k\+xl2\): L2 \d+ MiB, refcounts \d+ MiB",
               "\n".join(lines), re.M) is not None, "the metadata line")

for e in errors:
    print("  " + e, file=sys.stderr)
sys.exit(1 if errors else 0)
PY
compgen -G "$TMP/td-memory-*" >/dev/null && fail "bench/serve-memory left its work directory behind"
echo "PASS [$TEST_NAME]"

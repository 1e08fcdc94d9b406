#!/usr/bin/env bash
# smoke.bench_compare: bench/compare runs end to end at a tiny size (every
# target, every workload, one run) and prints a complete table: the header,
# a figure in every column of every row that exists today (W9, W10 and W11:
# in the columns of their targets, "-" in the others), the W6 rows, the N1 row
# (convert off an NBD export), and a `targets: N PASS, M MISS` line that
# counts the checks the rows list. Then ROWS=W9 alone: the W9 row and no
# other; and an unknown row is refused.
# It never asks for PASS: figures from a run this small are noise.
#
# Environment: THINDISK (the binary), BENCH_SCRIPTS (the bench/ folder;
# default: beside tests/). Exit 0 pass, 1 fail, 77 skipped.
# shellcheck source=lib/common.sh
source "$(dirname "$0")/lib/common.sh"
BENCH_SCRIPTS=$(realpath "${BENCH_SCRIPTS:-$(dirname "$0")/../bench}")
require_thindisk
require_tool fio qemu-img qemu-nbd nbdkit nbdcopy jq python3 numfmt
fio --enghelp=nbd >/dev/null 2>&1 || skip_or_fail "fio was built without its nbd engine"
enter_temp_dir td-bench

log "bench/compare, one run at SIZE=8M"
# The knobs of its header (the settings: line echoes them), and the page
# cache left alone (dropping it needs root and slows everyone's machine).
settings=(RUNS=1 SIZE=8M VSIZE=64M OPS=128 RUNTIME=10 W6_SIZE=2M N1_SIZE=8M
  W9_OPS=64 W11_BASE=16M W11_READ=512K W11_WRITE=128K W10_SIZE=4M W10_OPS=64)
rc=0
# Every phase but rados (bench/rados has a smoke test of its own,
# smoke.bench_rados: it needs a Ceph cluster).
env -u KEEP -u REPORT -u RESULTS_OUT "${settings[@]}" W8_OPS=16 DROP_CACHES=0 THINDISK="$TD" BENCH_DIR="$TMP" \
  PHASES="targets convert nbd storm latency" \
  bash "$BENCH_SCRIPTS/compare" >compare.out 2>compare.err || rc=$?
[[ $rc == 0 ]] || { cat compare.err compare.out >&2; fail "bench/compare exited $rc"; }

log "the table is complete"
python3 - compare.out "${settings[*]}" "$TD" <<'PY' || { cat compare.out >&2; fail "incomplete table"; }
import re
import sys

lines = open(sys.argv[1]).read().splitlines()
settings, td = sys.argv[2], sys.argv[3]
errors = []


def need(ok, what):
    if not ok:
        errors.append(what)


def first(prefix):
    return next((i for i, l in enumerate(lines) if l.startswith(prefix)), None)


def is_num(tok):
    return re.fullmatch(r"-?\d+(\.\d+)?", tok) is not None


def is_fig(tok):
    return is_num(tok) or tok == "-"


# 1. The header: when, where, with what settings, which binary.
need(bool(lines) and lines[0].startswith("thindisk bench/compare, "), "first line names the run")
need(first("machine: ") is not None, "a machine: line")
i = first("settings: ")
need(i is not None and all(f" {kv} " in lines[i].replace(";", " ") for kv in settings.split()),
     f"a settings: line with {settings}")
need(first(f"thindisk: {td} (") is not None, f"a thindisk: line naming {td}")
i = first("host write amp: ")
host_amp = i is not None and "not measured" not in lines[i]

# 2. The main table, from its column header to the W6 header. Rows are
#    "TITLE (UNIT)", one figure per column ("-": not measured), then the
#    targets; under each rate row, td128's and td64's ratios to the peers.
head, w6 = first("row "), first("W6 convert -c")
if head is None or w6 is None or w6 < head:
    print("  no main table (row ...) followed by a W6 table", file=sys.stderr)
    sys.exit(1)
COLS = ["td 128k+xl2", "td 64k", "qnbd 64k", "qnbd 128k+xl2", "qnbd raw", "nbdkit raw", "raw file",
        "raw O_DIRECT"]
need(lines[head].rstrip().endswith("  target") and all(c in lines[head] for c in COLS),
     f"the column header names {COLS} and target")
ROW = re.compile(r"(?P<title>\S.*?\((?P<unit>MB/s|IOPS|x|us)\))\s+(?P<rest>.*)")
rows, ncols = {}, set()
for n in range(head + 1, w6):
    l = lines[n]
    if not l.strip() or l.startswith("  "):
        continue
    m = ROW.fullmatch(l)
    if not m:
        errors.append(f"unparsed row '{l}'")
        continue
    toks = m["rest"].split()
    k = next((j for j, t in enumerate(toks) if not is_fig(t)), len(toks))
    rows[m["title"]] = (n, m["unit"], toks[:k], " ".join(toks[k:]))
    ncols.add(k)
need(len(ncols) == 1, f"every row has the same number of figures (got {sorted(ncols)})")
k = max(ncols, default=0)
need(k >= len(COLS), f"{k} figures per row for at least {len(COLS)} columns")

# Rows that exist today: a title pattern, and whether it carries a target.
# Dashes are answers only in CPU rows (us) for the raw-file columns, which
# have no server, and in the columns a row does not run on (ONLY);
# everything else is a number.
REQUIRED = [
    (r"W1 .*QD1 \(MB/s\)", False), (r"W1 .*QD16 \(MB/s\)", True),
    (r"W2 .*QD1 \(IOPS\)", False), (r"W2 .*QD16 \(IOPS\)", True),
    (r"W2 space amplification \(x\)", True),
    (r"W3 .*QD1 \(IOPS\)", False), (r"W3 .*QD16 \(IOPS\)", True),
    (r"W4 .*QD1 \(MB/s\)", False), (r"W4 .*QD16 \(MB/s\)", True),
    (r".*read-back .*QD1 \(MB/s\)", False), (r".*read-back .*QD16 \(MB/s\)", True),
    (r"W5 .*QD1 \(IOPS\)", False), (r"W5 .*QD16 \(IOPS\)", True),
    (r"W8 .*\(IOPS\)", False),
    (r"server CPU .*\(W2\) \(us\)", False), (r"server CPU .*\(W3\) \(us\)", False),
    (r"W9 .*\(IOPS\)", True), (r"W11 .*\(IOPS\)", True),
    (r"W10 .*write QD1 \(IOPS\)", False), (r"W10 .*write QD32 \(IOPS\)", True),
    (r"W10 .*read QD1 \(IOPS\)", False), (r"W10 .*read QD32 \(IOPS\)", True),
]
ONLY = [(r"W9 .*", {"td 128k+xl2", "qnbd 64k", "qnbd 128k+xl2", "nbdkit raw"}),
        (r"W11 .*", {"td 128k+xl2", "qnbd 64k", "qnbd 128k+xl2"}),
        (r"W10 .*", {"td 128k+xl2"})]
if host_amp:  # the host write amplification rows need a block device
    REQUIRED += [(r"W5 host write amp QD1 \(x\)", False), (r"W5 host write amp QD16 \(x\)", True),
                 (r"W8 host write amp \(x\)", False)]
for pattern, has_target in REQUIRED:
    found = [t for t in rows if re.fullmatch(pattern, t)]
    if len(found) != 1:
        errors.append(f"{len(found)} rows match '{pattern}': {found}")
        continue
    n, unit, figs, targets = rows[found[0]]
    need(not has_target or re.search(r"\b(PASS|MISS)\b", targets), f"row '{found[0]}' lists no target")
for title, (n, unit, figs, targets) in rows.items():
    only = next((cols for pattern, cols in ONLY if re.fullmatch(pattern, title)), None)
    for j, f in enumerate(figs):
        col = COLS[j] if j < len(COLS) else f"column {j + 1}"
        if only is not None:
            need(is_num(f) if col in only else f == "-", f"row '{title}', {col}: '{f}'")
            continue
        dash_ok = unit == "us" and j >= COLS.index("raw file")
        need(is_num(f) or (dash_ok and f == "-"), f"row '{title}', {col}: '{f}'")
    if unit in ("IOPS", "MB/s"):
        nxt = lines[n + 1] if n + 1 < len(lines) else ""
        ratios = nxt.split()[3:]
        need(nxt.startswith("  td128 / peer") and len(ratios) == k - 2
             and all(t == "-" or (t.endswith("x") and is_num(t[:-1])) for t in ratios),
             f"row '{title}': no td128 / peer line with {k - 2} ratios under it")

# 3. W6: td and qemu-img MB/s, speed ratio, both output ratios; the zstd
#    rows carry the targets.
for inp in ("corpus", "random"):
    for ct in ("zlib", "zstd"):
        title = f"  {inp} {ct}"
        found = [l for l in lines[w6:] if l.startswith(title + " ")]
        if len(found) != 1:
            errors.append(f"W6 row '{title.strip()}': {len(found)} lines")
            continue
        toks = found[0][len(title):].split()
        need(len(toks) >= 5 and is_num(toks[0]) and is_num(toks[1]) and toks[2].endswith("x")
             and is_num(toks[2][:-1]) and is_num(toks[3]) and is_num(toks[4]),
             f"W6 row '{title.strip()}': {toks[:5]}")
        need(ct != "zstd" or re.search(r"\b(PASS|MISS)\b", found[0]),
             f"W6 row '{title.strip()}' lists no target")

# 4. N1: td, qemu-img and nbdcopy MB/s, td's allocation per virtual byte
#    (about 0.5 of a half-sparse input), and two targets.
found = [l for l in lines[w6:] if l.startswith("  -> qcow2 (nbdcopy: raw) ")]
if len(found) != 1 or first("N1 convert off NBD") is None:
    errors.append(f"N1: a header and one row expected, got {len(found)} rows")
else:
    toks = found[0][len("  -> qcow2 (nbdcopy: raw) "):].split()
    need(len(toks) >= 4 and all(is_num(t) for t in toks[:4]), f"N1 row: {toks[:4]}")
    need(len(toks) >= 4 and is_num(toks[3]) and 0.3 < float(toks[3]) < 0.8,
         f"N1: thindisk's destination is not about half allocated: {toks[3:4]}")
    need(len(re.findall(r"\b(PASS|MISS)\b", found[0])) == 2, "N1 row lists no two targets")

# 5. The verdict line counts every check listed above it (each says PASS or
#    MISS once); each MISS is named after it.
totals = [n for n, l in enumerate(lines) if re.fullmatch(r"targets: \d+ PASS, \d+ MISS", l)]
if len(totals) != 1:
    errors.append(f"{len(totals)} 'targets: N PASS, M MISS' lines")
else:
    end = totals[0]
    npass, nmiss = map(int, re.findall(r"\d+", lines[end]))
    listed = [v for l in lines[head:end] for v in re.findall(r"\b(PASS|MISS)\b", l)]
    need(npass + nmiss == len(listed), f"targets line says {npass} + {nmiss}, the rows list {len(listed)}")
    need(listed.count("MISS") == nmiss, f"targets line says {nmiss} MISS, the rows list {listed.count('MISS')}")
    misses = [l for l in lines[end + 1:] if l.startswith("  MISS ")]
    need(len(misses) == nmiss, f"{len(misses)} MISS lines after the verdict for {nmiss} MISS")

for e in errors:
    print("  " + e, file=sys.stderr)
sys.exit(1 if errors else 0)
PY
compgen -G "$TMP/td-compare-*" >/dev/null && fail "bench/compare left its work directory behind"

log "ROWS=W9: that row alone, on its four targets"
rc=0
env -u KEEP -u REPORT -u RESULTS_OUT "${settings[@]}" PHASES=targets ROWS=W9 DROP_CACHES=0 \
  THINDISK="$TD" BENCH_DIR="$TMP" bash "$BENCH_SCRIPTS/compare" >rows.out 2>rows.err || rc=$?
[[ $rc == 0 ]] || { cat rows.err rows.out >&2; fail "bench/compare ROWS=W9 exited $rc"; }
python3 - rows.out <<'PY' || { cat rows.out >&2; fail "ROWS=W9 did not print the W9 row alone"; }
import re
import sys

# Table rows: "TITLE (UNIT)" then the 8 columns; W9 has figures in 4.
rows = [l for l in open(sys.argv[1]).read().splitlines()
        if re.match(r"(W\d+|server CPU) .*\((MB/s|IOPS|x|us)\) ", l)]
figs = rows[0].split("(IOPS)", 1)[1].split()[:8] if rows else []
nums = [t for t in figs if re.fullmatch(r"\d+(\.\d+)?", t)]
sys.exit(0 if len(rows) == 1 and rows[0].startswith("W9 ") and len(nums) == 4 else 1)
PY
[[ $(grep -c '^compare: run 1/1: ' rows.err) == 4 ]] || { cat rows.err >&2; fail "ROWS=W9 ran other targets"; }
rc=0
ROWS="W9 W99" THINDISK="$TD" BENCH_DIR="$TMP" bash "$BENCH_SCRIPTS/compare" >/dev/null 2>rows.err || rc=$?
if [[ $rc != 2 ]] || ! grep -q "unknown row 'W99'" rows.err; then
  cat rows.err >&2
  fail "ROWS=W99 was not refused (exit $rc)"
fi
compgen -G "$TMP/td-compare-*" >/dev/null && fail "bench/compare left its work directory behind"
echo "PASS [$TEST_NAME]"

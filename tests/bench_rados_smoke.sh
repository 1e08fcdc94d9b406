#!/usr/bin/env bash
# smoke.bench_rados: bench/rados runs end to end at a tiny size (its own
# throwaway one-node Ceph cluster, every target, every row, one run) and
# prints a complete table: the header, a figure in every column of every
# row that target runs ("-" in the others: only W5 has a thindisk clone over
# an RBD image), the OSD write amplification, and a `targets: N PASS, M
# MISS` line that counts the checks the rows list; it stops its cluster and
# leaves no work directory. It never asks for PASS: figures from a run this
# small are noise.
#
# Environment: THINDISK (the binary), BENCH_SCRIPTS (the bench/ folder;
# default: beside tests/). Exit 0 pass, 1 fail, 77 skipped.
# shellcheck source=lib/common.sh
source "$(dirname "$0")/lib/common.sh"
BENCH_SCRIPTS=$(realpath "${BENCH_SCRIPTS:-$(dirname "$0")/../bench}")
require_thindisk
require_tool fio qemu-img qemu-nbd rados rbd ceph ceph-mon ceph-osd jq python3 numfmt
[[ ,${THINDISK_TEST_DENY:-}, != *,ceph,* ]] || skip_or_fail "ceph denied by THINDISK_TEST_DENY"
fio --enghelp 2>/dev/null | grep -qx $'\trbd' || skip_or_fail "fio was built without its rbd engine"
# qemu-img --help lists rbd even when its module (qemu-block-extra) is missing.
ls /usr/lib/*/qemu/block-rbd.so >/dev/null 2>&1 ||
  skip_or_fail "qemu has no rbd driver (qemu-block-extra)"
enter_temp_dir td-bench-rados

log "bench/rados, one run at SIZE=8M"
rc=0
env -u KEEP -u REPORT -u RESULTS_OUT -u CEPH_CONF -u CEPH_ARGS RUNS=1 SIZE=8M VSIZE=64M OPS=128 \
  RUNTIME=20 DROP_CACHES=0 THINDISK="$TD" BENCH_DIR="$TMP" RESULTS_OUT="$TMP/raw.txt" \
  bash "$BENCH_SCRIPTS/rados" >rados.out 2>rados.err || rc=$?
[[ $rc == 0 ]] || { cat rados.err rados.out >&2; fail "bench/rados exited $rc"; }

log "the table is complete"
python3 - rados.out raw.txt <<'PY' || { cat rados.out >&2; fail "incomplete table"; }
import re
import sys

lines = open(sys.argv[1]).read().splitlines()
raw = [l.split() for l in open(sys.argv[2])]
errors = []
need = lambda ok, what: ok or errors.append(what)
need(lines and lines[0].startswith("thindisk bench/rados, "), "first line names the run")
for p in ("machine: ", "cluster: ", "settings: ", "thindisk: "):
    need(any(l.startswith(p) for l in lines), f"a {p!r} line")
cols = ["td rados://", "td over rbd:", "qemu-nbd rbd:", "fio rbd", "td cache=none", "qemu-nbd wb"]
head = next((i for i, l in enumerate(lines) if l.startswith("row ")), None)
need(head is not None and all(c in lines[head] for c in cols), "the column header")
# Row title -> which of the six columns hold a figure.
want = {
    "W2 4K rand first write QD16": [1, 0, 1, 1, 1, 1],
    "W3 4K rewrite QD16": [1, 0, 1, 1, 1, 1],
    "W4 seq write 1M+flush QD1": [1, 0, 1, 1, 1, 1],
    "W4 seq write 1M+flush QD16": [1, 0, 1, 1, 1, 1],
    "W7 read-back 1M QD1": [1, 0, 1, 1, 1, 1],
    "W7 read-back 1M QD16": [1, 0, 1, 1, 1, 1],
    "W5 4K clone first write QD16": [1, 1, 1, 1, 1, 1],
    "W5 OSD write amp QD16": [1, 1, 1, 1, 1, 1],
}
for title, mask in want.items():
    row = next((l for l in lines if l.startswith(title + " (")), None)
    if row is None:
        errors.append(f"no row {title!r}")
        continue
    figs = row[38:38 + 6 * 15].split()  # a 38-character title, six columns of 15
    for c, has, tok in zip(cols, mask, figs):
        ok = re.fullmatch(r"\d+(\.\d+)?", tok) is not None if has else tok == "-"
        need(ok, f"{title}: column {c} shows {tok!r}")
# Copy-on-write: every target sent the OSD something for its W5 writes.
amp = {t: float(v) for _, t, m, v in raw if m == "W5.hostamp.qd16"}
need(sorted(amp) == ["fiorbd", "qnrbd", "qnwb", "tdnone", "tdrados", "tdrbd"],
     f"W5 amplification of {sorted(amp)}")
need(all(v > 0 for v in amp.values()), f"a W5 amplification of zero: {amp}")
verdict = next((l for l in lines if l.startswith("targets: ")), None)
m = re.fullmatch(r"targets: (\d+) PASS, (\d+) MISS", verdict or "")
need(m is not None, f"the verdict line: {verdict!r}")
end = next((i for i, l in enumerate(lines) if l.startswith("figures: ")), len(lines))
if m and head is not None:
    listed = [v for l in lines[head:end] for v in re.findall(r"\b(PASS|MISS)\b", l)]
    need(int(m[1]) + int(m[2]) == len(listed) > 0, f"{verdict!r}, the rows list {len(listed)}")
    need(listed.count("MISS") == int(m[2]), f"{verdict!r}, the rows list {listed.count('MISS')} MISS")
for e in errors:
    print("  " + e, file=sys.stderr)
sys.exit(1 if errors else 0)
PY
compgen -G "$TMP/td-rados-*" >/dev/null && fail "bench/rados left its work directory behind"
pgrep -f "$TMP/td-rados" >/dev/null && fail "bench/rados left a daemon running"
echo "PASS"

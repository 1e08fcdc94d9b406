#!/usr/bin/env bash
# smoke.bench_tls: bench/tls runs end to end at a tiny size (its own
# throwaway CA, every target, both rows, one run) and prints a complete
# table: the header, a figure in every column of both rows, and a
# `targets: N PASS, M MISS` line that counts the checks the rows list, and
# the CPU rows (server and fio, per W2 write and per W4 MiB); it
# leaves no work directory and no server. It never asks for PASS: figures
# from a run this small are noise.
#
# Environment: THINDISK (the binary), BENCH_SCRIPTS (the bench/ folder;
# default: beside tests/). Exit 0 pass, 1 fail, 77 skipped.
# shellcheck source=lib/common.sh
source "$(dirname "$0")/lib/common.sh"
BENCH_SCRIPTS=$(realpath "${BENCH_SCRIPTS:-$(dirname "$0")/../bench}")
require_thindisk
require_tool fio qemu-img qemu-nbd nbdkit certtool setpriv jq python3 numfmt
[[ $(id -u) == 0 ]] || skip_or_fail "bench/tls runs fio as nobody: needs root"
enter_temp_dir td-bench-tls
chmod 711 "$TMP"

log "bench/tls, one run at SIZE=16M"
rc=0
env -u KEEP -u REPORT -u RESULTS_OUT RUNS=1 SIZE=16M VSIZE=64M OPS=256 RUNTIME=20 \
  DROP_CACHES=0 THINDISK="$TD" BENCH_DIR="$TMP" RESULTS_OUT="$TMP/raw.txt" \
  bash "$BENCH_SCRIPTS/tls" >tls.out 2>tls.err || rc=$?
[[ $rc == 0 ]] || { cat tls.err tls.out >&2; fail "bench/tls exited $rc"; }

log "the table is complete"
python3 - tls.out raw.txt <<'PY' || { cat tls.out >&2; fail "incomplete table"; }
import re
import sys

lines = open(sys.argv[1]).read().splitlines()
raw = [l.split() for l in open(sys.argv[2])]
errors = []
need = lambda ok, what: ok or errors.append(what)
need(lines and lines[0].startswith("thindisk bench/tls, "), "first line names the run")
for p in ("machine: ", "tls: ", "settings: ", "thindisk: "):
    need(any(l.startswith(p) for l in lines), f"a {p!r} line")
cols = ["td TLS", "td plain", "qemu-nbd TLS", "nbdkit TLS"]
head = next((i for i, l in enumerate(lines) if l.startswith("row ")), None)
need(head is not None and all(c in lines[head] for c in cols), "the column header")
for title in ("W2 4K rand first write QD16", "W4 seq write 1M+flush QD16"):
    row = next((l for l in lines if l.startswith(title + " (")), None)
    if row is None:
        errors.append(f"no row {title!r}")
        continue
    figs = row[34:34 + 4 * 15].split()  # a 34-character title, four columns of 15
    need(len(figs) == 4 and all(re.fullmatch(r"\d+(\.\d+)?", f) for f in figs),
         f"{title}: figures {figs}")
for title in ("  W2 server CPU per write", "  W2 fio CPU per write",
              "  W4 server CPU per MiB", "  W4 fio CPU per MiB"):
    row = next((l for l in lines if l.startswith(title + " (")), None)
    figs = (row or "")[34:34 + 4 * 15].split()
    need(len(figs) == 4 and all(re.fullmatch(r"\d+(\.\d+)?", f) for f in figs),
         f"{title.strip()}: figures {figs}")
got = sorted({(t, m) for _, t, m, _ in raw})
metrics = ("W2.qd16", "W4.qd16", "W2.server_us", "W2.client_us", "W4.server_ms", "W4.client_ms")
need(got == sorted((t, m) for t in ("tdtls", "tdplain", "qntls", "nktls") for m in metrics),
     f"raw results {got}")
# Speeds are never zero; CPU time may round to zero in a run this small
# (the kernel counts it in 10 ms ticks).
need(all(float(v) > 0 for _, _, m, v in raw if m.endswith("qd16")), "a speed of zero")
need(all(float(v) >= 0 for *_, v in raw), "a negative CPU time")
verdict = next((l for l in lines if l.startswith("targets: ")), None)
m = re.fullmatch(r"targets: (\d+) PASS, (\d+) MISS", verdict or "")
need(m is not None and int(m[1]) + int(m[2]) == 5, f"the verdict line: {verdict!r}")
for e in errors:
    print("  " + e, file=sys.stderr)
sys.exit(1 if errors else 0)
PY
[[ -z $(ls -d "$TMP"/td-tls-* 2>/dev/null) ]] || fail "bench/tls left its work directory"
log "bench_tls: ok"

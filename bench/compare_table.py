#!/usr/bin/env python3
# The table and verdicts of bench/compare: medians over the runs of one or
# more results files (lines "RUN TARGET METRIC VALUE"), each target with the
# range of its per-run ratios. Usage: compare_table.py RESULTS_FILE...
# (bench/compare runs it at its end, and alone with REPORT="FILES").
import sys

from results import Results, checks_text, fmt, span, summary

res = Results(sys.argv[1:])
vals, med, run_ratios = res.vals, res.med, res.ratios

PEERS = ["qn64", "qn128", "qnraw", "nbdkit", "rawfio", "rawdio"]
COLS = ["td128", "td64"] + PEERS
# Short column names: "qnbd" is qemu-nbd.
NAMES = {"td128": "td 128k+xl2", "td64": "td 64k", "qn64": "qnbd 64k",
         "qn128": "qnbd 128k+xl2", "qnraw": "qnbd raw", "nbdkit": "nbdkit raw",
         "rawfio": "raw file", "rawdio": "raw O_DIRECT"}
# Row -> (title, unit, [(peer, limit, issue)]): td128 / peer >= limit, or for
# "max" an absolute limit, for "cpu" td128 / qemu-nbd <= limit. Targets marked
# #13 belong to the in-flight issue (slow storage, sync writes, cold reads).
ROWS = [
    ("W1.qd1", "W1 1M read of holes QD1", "MB/s", []),
    ("W1.qd16", "W1 1M read of holes QD16", "MB/s", [("qn64", 1.0, ""), ("qn128", 1.0, "")]),
    ("W2.qd1", "W2 4K rand first write QD1", "IOPS", []),
    ("W2.qd16", "W2 4K rand first write QD16", "IOPS",
     [("qn64", 2.0, ""), ("qn128", 1.5, ""), ("nbdkit", 0.9, "")]),
    ("W2.space.qd16", "W2 space amplification", "x", [("max", 1.15, "")]),
    ("W3.qd1", "W3 4K rewrite QD1", "IOPS", []),
    ("W3.qd16", "W3 4K rewrite QD16", "IOPS", [("qn128", 1.5, ""), ("nbdkit", 0.9, "")]),
    ("W4.qd1", "W4 seq write 1M+flush QD1", "MB/s", []),
    ("W4.qd16", "W4 seq write 1M+flush QD16", "MB/s", [("rawfio", 0.8, "")]),
    ("RB.qd1", "W7 cold read-back 1M QD1", "MB/s", [("nbdkit", 1.0, "#13")]),
    ("RB.qd16", "W7 cold read-back 1M QD16", "MB/s", [("nbdkit", 0.9, "")]),
    ("W5.qd1", "W5 4K clone write QD1", "IOPS", []),
    ("W5.qd16", "W5 4K clone write QD16", "IOPS", [("qn64", 3.0, ""), ("qn128", 1.5, "")]),
    ("W5.hostamp.qd1", "W5 host write amp QD1", "x", []),
    ("W5.hostamp.qd16", "W5 host write amp QD16", "x", [("max", 1.15, "")]),
    ("W8.qd1", "W8 4K first write+flush QD1", "IOPS", [("nbdkit", 0.9, "#13")]),
    ("W8.hostamp.qd1", "W8 host write amp", "x", [("max", 2.0, "#13")]),
    ("W9", "W9 cold 4K rand read 4xQD8", "IOPS", [("nbdkit", 1.2, "#13")]),
    ("W10.W2.qd1", "W10 1ms storage 4K write QD1", "IOPS", []),
    ("W10.W2.qd32", "W10 1ms storage 4K write QD32", "IOPS", [("gain:W10.W2.qd1", 20.0, "#13")]),
    ("W10.W9.qd1", "W10 1ms storage 4K read QD1", "IOPS", []),
    ("W10.W9.qd32", "W10 1ms storage 4K read QD32", "IOPS", [("gain:W10.W9.qd1", 20.0, "#13")]),
    ("W11", "W11 boot storm, 8 clones", "IOPS", [("qn64", 2.0, "#13")]),
    ("CPU.W2.qd16", "server CPU per 4K write (W2)", "us", [("cpu", 0.5, "")]),
    ("CPU.W3.qd16", "server CPU per 4K write (W3)", "us", [("cpu", 0.5, "")]),
]

w = 14
print()
print(f"{'row':34}" + "".join(f"{NAMES[c][:w-1]:>{w}}" for c in COLS) + "  target")
verdicts = []
for key, title, unit, targets in ROWS:
    row = {c: med.get((c, key)) for c in COLS}
    if all(v is None for v in row.values()): continue
    checks = []  # (what, ok, got, issue)
    td = row["td128"]
    for peer, limit, issue in targets:
        if td is None: continue
        if peer == "max":
            xs = list(vals[("td128", key)].values())
            checks.append((f"<= {limit}", td <= limit, f"{td:.3f}" + span(xs, "{:.3f}"), issue))
        elif peer == "cpu":
            for q in ("qn64", "qn128"):
                if row[q]:
                    r = td / row[q]
                    checks.append((f"<= {limit}x {NAMES[q]}", r <= limit,
                                   f"{r:.2f}x" + span(run_ratios("td128", q, key)), issue))
        elif peer.startswith("gain:"):  # over another row of the same target
            base = med.get(("td128", peer[5:]))
            if base:
                a, b = vals.get(("td128", key), {}), vals.get(("td128", peer[5:]), {})
                xs = [a[k] / b[k] for k in a if k in b and b[k]]
                checks.append((f">= {limit:g}x QD1", td / base >= limit,
                               f"{td / base:.2f}x" + span(xs), issue))
        elif row.get(peer):
            r = td / row[peer]
            checks.append((f">= {limit}x {NAMES[peer]}", r >= limit,
                           f"{r:.2f}x" + span(run_ratios("td128", peer, key)), issue))
    tgt = checks_text(checks)
    print(f"{title + ' (' + unit + ')':34}" + "".join(f"{fmt(row[c]):>{w}}" for c in COLS)
          + ("  " + tgt if tgt else ""))
    if unit in ("IOPS", "MB/s"):
        for mine in ("td128", "td64"):
            if row[mine] is None: continue
            ratios = "".join(f"{(fmt(row[mine] / row[p]) + 'x') if row[p] else '-':>{w}}"
                             for p in PEERS)
            print(f"{'  ' + mine + ' / peer':34}{'':>{2 * w}}{ratios}")
    verdicts += [(title, c) for c in checks]

# W6: convert -c.
print()
print(f"{'W6 convert -c':34}{'td MB/s':>{w}}{'qemu MB/s':>{w}}{'speed':>{w}}"
      f"{'td ratio':>{w}}{'qemu ratio':>{w}}  target")
for inp in ("corpus", "random"):
    for ct in ("zlib", "zstd"):
        key = f"W6.{inp}.{ct}.mbps"
        tm, qm = med.get(("td", key)), med.get(("qemu", key))
        tr, qr = med.get(("td", f"W6.{inp}.{ct}.ratio")), med.get(("qemu", f"W6.{inp}.{ct}.ratio"))
        if tm is None or qm is None: continue
        got = f"{tm / qm:.2f}x" + span(run_ratios("td", "qemu", key))
        checks = []
        if ct == "zstd" and inp == "corpus":
            checks.append((">= 2x qemu-img zstd at no worse ratio", tm / qm >= 2 and tr <= qr, got, ""))
        if ct == "zstd" and inp == "random":
            checks.append((">= 1.0x qemu-img zstd", tm / qm >= 1.0, got, ""))
        tgt = checks_text(checks)
        print(f"{'  ' + inp + ' ' + ct:34}{fmt(tm):>{w}}{fmt(qm):>{w}}{fmt(tm / qm) + 'x':>{w}}"
              f"{tr:>{w}.3f}{qr:>{w}.3f}" + ("  " + tgt if tgt else ""))
        verdicts += [(f"W6 {inp} {ct}", c) for c in checks]

# N1: convert off an NBD export.
key = "N1.mbps"
if ("td", key) in med:
    print()
    print(f"{'N1 convert off NBD (half sparse)':34}{'td MB/s':>{w}}{'qemu MB/s':>{w}}"
          f"{'nbdcopy MB/s':>{w}}{'td alloc':>{w}}  target")
    tm, qm, nm = med.get(("td", key)), med.get(("qemu", key)), med.get(("nbdcopy", key))
    checks = []
    for peer, pm, limit, name in (("qemu", qm, 1.0, "qemu-img"), ("nbdcopy", nm, 0.8, "nbdcopy")):
        if pm:
            checks.append((f">= {limit}x {name}", tm / pm >= limit,
                           f"{tm / pm:.2f}x" + span(run_ratios("td", peer, key)), ""))
    tgt = checks_text(checks)
    print(f"{'  -> qcow2 (nbdcopy: raw)':34}{fmt(tm):>{w}}{fmt(qm):>{w}}{fmt(nm):>{w}}"
          f"{med.get(('td', 'N1.alloc'), 0):>{w}.3f}" + ("  " + tgt if tgt else ""))
    verdicts += [("N1 convert off NBD", c) for c in checks]
summary(res, verdicts)

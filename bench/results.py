# bench/results.py: what the benchmark tables share (bench/compare_table.py
# and the tables of bench/rados, bench/tls and bench/backup). Results files
# hold one figure a line, "RUN TARGET METRIC VALUE"; a table shows medians
# over every run of every file given, and beside each ratio to a peer the
# range of the per-run ratios (runs of different files stay apart).
import statistics
from collections import defaultdict


class Results:
    def __init__(self, paths):
        self.vals = defaultdict(dict)  # (target, metric) -> {(file, run): value}
        for n, path in enumerate(paths):
            for line in open(path):
                run, target, metric, value = line.split()
                self.vals[(target, metric)][(n, run)] = float(value)
        self.runs = {k for v in self.vals.values() for k in v}
        self.med = {k: statistics.median(v.values()) for k, v in self.vals.items()}

    def ratios(self, mine, peer, key):
        """mine / peer in each run that measured both."""
        a, b = self.vals.get((mine, key), {}), self.vals.get((peer, key), {})
        return [a[k] / b[k] for k in a if k in b and b[k]]


def fmt(v, small="{:.2f}"):
    if v is None: return "-"
    if v >= 1000: return f"{v:.0f}"
    if v >= 10: return f"{v:.1f}"
    return small.format(v)


def span(xs, f="{:.2f}"):
    return f" ({f.format(min(xs))}-{f.format(max(xs))})" if len(xs) > 1 else ""


# A check is (what, ok, got, issue): "what" the target says (">= 2x qnbd
# 64k"), "got" the figure with its range, "issue" a tag ("#13") or "".
def checks_text(checks):
    return "; ".join(f"{c[0]}: {c[2]} {'PASS' if c[1] else 'MISS'}{' ' + c[3] if c[3] else ''}"
                     for c in checks)


def summary(results, verdicts):
    """The closing lines; verdicts are (row title, check)."""
    print()
    print(f"figures: medians of {len(results.runs)} runs; in brackets: the range of the per-run ratio")
    passed = sum(1 for _, c in verdicts if c[1])
    print(f"targets: {passed} PASS, {len(verdicts) - passed} MISS")
    for title, c in verdicts:
        if not c[1]: print(f"  MISS {title}: {c[0]} (got {c[2]}){' ' + c[3] if c[3] else ''}")


def targets_table(results, cols, names, rows, title_width, width=15):
    """One column per target in cols, one line per row (key, title, unit,
    targets) with a figure; each target (mine, peer, limit[, what]) checks
    mine / peer >= limit, or with peer "max" mine <= limit. Prints the table
    and its summary."""
    med = results.med
    print()
    print(f"{'row':{title_width}}" + "".join(f"{names[c]:>{width}}" for c in cols) + "  target")
    verdicts = []
    for key, title, unit, targets in rows:
        row = {c: med.get((c, key)) for c in cols}
        if all(v is None for v in row.values()): continue
        checks = []
        for mine, peer, limit, *what in targets:
            if row[mine] is None: continue
            if peer == "max":
                xs = list(results.vals[(mine, key)].values())
                checks.append((what[0] if what else f"{names[mine]} <= {limit}",
                               row[mine] <= limit, f"{row[mine]:.3f}" + span(xs, "{:.3f}"), ""))
            elif row[peer]:
                r = row[mine] / row[peer]
                checks.append((what[0] if what else f"{names[mine]} >= {limit}x {names[peer]}",
                               r >= limit, f"{r:.2f}x" + span(results.ratios(mine, peer, key)), ""))
        tgt = checks_text(checks)
        print(f"{title + ' (' + unit + ')':{title_width}}"
              + "".join(f"{fmt(row[c]):>{width}}" for c in cols) + ("  " + tgt if tgt else ""))
        verdicts += [(title, c) for c in checks]
    summary(results, verdicts)

"""python -m mlajit.plot REPORT.json -o sweep.png [--device N]

Draws a tuning report (`mlajit tune CONFIG.json --json > REPORT.json`): one panel per tuning
group, every timed candidate's median time (min..max as an error bar) against its knobs, sorted by
time, the winner marked in red and the default spec outlined. Needs matplotlib.
"""
import argparse
import json
import math
import sys


def _label(knobs):
    return ",".join(f"{k}={v}" for k, v in sorted(knobs.items())) or "default"


def _device_timing(c, device):
    for d in c.get("devices", []):
        if d.get("device") == device and d.get("status") in ("ok", "db_hit") and d.get("median_ms"):
            return d["median_ms"], d.get("min_ms", d["median_ms"]), d.get("max_ms", d["median_ms"])
    return None


def plot(report, out, device=0):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = report.get("groups", [])
    if not groups:
        raise SystemExit("plot: the report has no groups (was it made by `mlajit tune --json`?)")
    cols = 1 if len(groups) == 1 else 2
    rows = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(8 * cols, 3.6 * rows), squeeze=False)
    for ax, g in zip([a for r in axes for a in r], groups):
        winner = next((d.get("winner") for d in g.get("devices", []) if d.get("device") == device), None)
        pts = []
        for i, c in enumerate(g["candidates"]):
            t = _device_timing(c, device)
            if t is not None:
                pts.append((t[0], t[1], t[2], i, c))
        pts.sort(key=lambda p: p[0])
        xs = range(len(pts))
        med = [p[0] for p in pts]
        err = [[p[0] - p[1] for p in pts], [p[2] - p[0] for p in pts]]
        ax.errorbar(xs, med, yerr=err, fmt="o", color="tab:blue", ms=4, capsize=2, label="candidate (median, min..max)")
        for x, p in zip(xs, pts):
            if p[4].get("is_default"):
                ax.plot(x, p[0], "o", mfc="none", mec="black", ms=10, label="default")
            if p[3] == winner:
                ax.plot(x, p[0], "*", color="red", ms=16, label=f"winner {_label(p[4]['knobs'])}")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([_label(p[4]["knobs"]) for p in pts], rotation=60, ha="right", fontsize=6)
        ax.set_ylabel("median time (ms)")
        untimed = len(g["candidates"]) - len(pts)
        ax.set_title(f"{g['name']}  shape {g.get('shape')}" + (f"  ({untimed} untimed)" if untimed else ""),
                     fontsize=8)
        handles, labels = ax.get_legend_handles_labels()
        uniq = dict(zip(labels, handles))
        ax.legend(uniq.values(), uniq.keys(), fontsize=6)
    for ax in [a for r in axes for a in r][len(groups):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m mlajit.plot", description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report", help="JSON of `mlajit tune CONFIG.json --json`")
    ap.add_argument("-o", "--output", required=True, help="image file (.png, .svg, .pdf)")
    ap.add_argument("--device", type=int, default=0, help="device ordinal whose timings to draw (default 0)")
    a = ap.parse_args(argv)
    with open(a.report) as f:
        report = json.load(f)
    print(plot(report, a.output, a.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())

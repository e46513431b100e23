"""The allocation study's figure (docs/results.md, "Where allocation should pay"): from the run
folders of `agentrl ablate --preset allocation`, three panels, one colour per arm:

1. held-out success at each check, mean over seeds (the shaded band: ± its standard error);
2. the paired gain over the reference (GRPO) in the mean of checks, points ± its standard
   error over seeds, with the share of mixed-outcome groups and the critic's rank of the tree's
   states (`focus/critic_rank`, Spearman's rho) written above each bar;
3. where each tree arm launched its continuations: the share at depth 0 (the root, before the
   decisive first decision), 1 and 2+.

    python benchmarks/allocation_map.py --reference grpo runs/alloc-early --out docs/figures/allocation-early.png
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
from collections import defaultdict
from pathlib import Path

from agentrl_cli.reporting.metrics import read_metrics

_spec = importlib.util.spec_from_file_location(
    "methods_table", Path(__file__).resolve().parent / "methods_table.py")
mt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mt)


def curves(run_dirs: list[Path]) -> dict[str, dict[int, list[float]]]:
    """arm -> step -> the held-out success of each seed at that check."""
    out: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in run_dirs:
        if not (run / "summary.json").is_file():
            continue
        label = run.parent.name if run.name.startswith("seed-") else run.name
        for r in read_metrics(run / "metrics.jsonl"):
            if "eval/success" in r:
                out[label][r["step"]].append(r["eval/success"])
    return out


def gains(runs: list[dict], reference: str) -> dict[str, tuple[float, float, int]]:
    """arm -> (paired gain over `reference` in points, its standard error, seeds)."""
    by = defaultdict(list)
    for r in runs:
        by[r["label"]].append(r)
    out = {}
    for label, rs in by.items():
        if label != reference and reference in by:
            diff = mt.paired(rs, by[reference])
            if diff is not None:
                out[label] = (100 * diff[0], 100 * diff[1], diff[2])
    return out


def plot(run_dirs: list[Path], reference: str, out: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in (mt.load_run(p) for p in run_dirs) if r is not None]
    if not runs:
        raise SystemExit("no finished runs (summary.json) among the given folders")
    cur = curves(run_dirs)
    arms = sorted(cur, key=lambda a: (a != reference, a))
    colour = {a: f"C{i}" for i, a in enumerate(arms)}
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    for a in arms:
        steps = sorted(cur[a])
        mean = [statistics.mean(cur[a][s]) for s in steps]
        se = [statistics.stdev(cur[a][s]) / len(cur[a][s]) ** 0.5 if len(cur[a][s]) > 1 else 0.0
              for s in steps]
        n = max(len(v) for v in cur[a].values())
        ax[0].plot(steps, mean, marker="o", ms=3, color=colour[a], label=f"{a} ({n} seeds)")
        ax[0].fill_between(steps, [m - e for m, e in zip(mean, se)],
                           [m + e for m, e in zip(mean, se)], color=colour[a], alpha=0.15)
    ax[0].set(xlabel="training step", ylabel="held-out success", title="held-out checks")
    ax[0].legend(fontsize=8)
    g = gains(runs, reference)
    names = [a for a in arms if a in g]
    by = defaultdict(list)
    for r in runs:
        by[r["label"]].append(r)
    ax[1].bar(names, [g[a][0] for a in names], yerr=[g[a][1] for a in names], capsize=4,
              color=[colour[a] for a in names])
    for i, a in enumerate(names):
        mixed = [r["mixed"] for r in by[a] if r["mixed"] is not None]
        rho = [r["critic_rank"] for r in by[a] if r["critic_rank"] is not None]
        note = "\n".join(([f"mixed {statistics.mean(mixed):.2f}"] if mixed else [])
                         + ([f"critic rho {statistics.mean(rho):.2f}"] if rho else []))
        if note:
            ax[1].annotate(note, (i, g[a][0] + g[a][1]), ha="center", va="bottom", fontsize=8)
    ax[1].axhline(0, color="k", lw=0.8)
    ref_mixed = [r["mixed"] for r in by.get(reference, []) if r["mixed"] is not None]
    ax[1].set(ylabel=f"vs {reference}: mean of checks (points, paired ± se)",
              title=f"gain over {reference}" + (f" (its mixed groups {statistics.mean(ref_mixed):.2f})"
                                                if ref_mixed else ""))
    ax[1].tick_params(axis="x", labelrotation=20)
    tree = [a for a in arms if any(r["depths"] for r in by[a])]
    bottom = [0.0] * len(tree)
    for d, name in ((0, "depth 0 (root)"), (1, "depth 1"), (2, "depth 2+")):
        share = []
        for a in tree:
            rows = [r["depths"] for r in by[a] if r["depths"]]
            share.append(statistics.mean(
                sum(v for k, v in row.items() if (k >= 2 if d == 2 else k == d)) for row in rows))
        ax[2].bar(tree, share, bottom=bottom, label=name)
        bottom = [b + s for b, s in zip(bottom, share)]
    ax[2].set(ylabel="share of continuations", title="where continuations start")
    ax[2].tick_params(axis="x", labelrotation=20)
    ax[2].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="agentrl ablate folders or run folders")
    ap.add_argument("--reference", default="grpo")
    ap.add_argument("--out", type=Path, required=True, help="the PNG to write")
    ap.add_argument("--title", default="allocation study")
    args = ap.parse_args()
    plot(mt.runs_under(args.runs), args.reference, args.out, args.title)
    print(f"figure: {args.out}")


if __name__ == "__main__":
    main()

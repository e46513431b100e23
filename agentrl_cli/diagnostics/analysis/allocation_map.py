"""The allocation study's figure (docs/results.md, "Where allocation should pay"; `agentrl
diagnose allocation-map`): from the run folders of `agentrl ablate --preset allocation`, three
panels, one colour per arm:

1. held-out success at each check, mean over seeds (the shaded band: ± its standard error);
2. the paired gain over the reference (GRPO) in the mean of checks, points ± its standard
   error over seeds, with the share of mixed-outcome groups and the critic's rank of the tree's
   states (`focus/critic_rank`, Spearman's rho) written above each bar;
3. where each tree arm launched its continuations: the share at depth 0 (the root, before the
   decisive first decision), 1 and 2+."""
from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from ...reporting.run_reader import read_run
from . import verdict_table as vt
from ...reporting.plots import plt


def curves(run_dirs: list[Path]) -> dict[str, dict[int, list[float]]]:
    """arm -> step -> the held-out success of each seed at that check."""
    out: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for path in run_dirs:
        run = read_run(path)
        if run is None:
            continue
        label = path.parent.name if path.name.startswith("seed-") else path.name
        for r in run.checks():
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
            diff = vt.paired(rs, by[reference])
            if diff is not None:
                out[label] = (100 * diff[0], 100 * diff[1], diff[2])
    return out


def _checks_panel(ax, cur: dict, arms: list[str], colour: dict) -> None:
    for a in arms:
        steps = sorted(cur[a])
        mean = [statistics.mean(cur[a][s]) for s in steps]
        se = [statistics.stdev(cur[a][s]) / len(cur[a][s]) ** 0.5 if len(cur[a][s]) > 1 else 0.0
              for s in steps]
        n = max(len(v) for v in cur[a].values())
        ax.plot(steps, mean, marker="o", ms=3, color=colour[a], label=f"{a} ({n} seeds)")
        ax.fill_between(steps, [m - e for m, e in zip(mean, se)],
                        [m + e for m, e in zip(mean, se)], color=colour[a], alpha=0.15)
    ax.set(xlabel="training step", ylabel="held-out success", title="held-out checks")
    ax.legend(fontsize=8)


def _gain_panel(ax, runs: list[dict], by: dict, arms: list[str], colour: dict, reference: str) -> None:
    g = gains(runs, reference)
    names = [a for a in arms if a in g]
    ax.bar(names, [g[a][0] for a in names], yerr=[g[a][1] for a in names], capsize=4,
           color=[colour[a] for a in names])
    for i, a in enumerate(names):
        mixed = [r["mixed"] for r in by[a] if r["mixed"] is not None]
        rho = [r["critic_rank"] for r in by[a] if r["critic_rank"] is not None]
        note = "\n".join(([f"mixed {statistics.mean(mixed):.2f}"] if mixed else [])
                         + ([f"critic rho {statistics.mean(rho):.2f}"] if rho else []))
        if note:
            ax.annotate(note, (i, g[a][0] + g[a][1]), ha="center", va="bottom", fontsize=8)
    ax.axhline(0, color="k", lw=0.8)
    ref_mixed = [r["mixed"] for r in by.get(reference, []) if r["mixed"] is not None]
    ax.set(ylabel=f"vs {reference}: mean of checks (points, paired ± se)",
           title=f"gain over {reference}" + (f" (its mixed groups {statistics.mean(ref_mixed):.2f})"
                                             if ref_mixed else ""))
    ax.tick_params(axis="x", labelrotation=20)


def _depth_panel(ax, by: dict, arms: list[str]) -> None:
    tree = [a for a in arms if any(r["depths"] for r in by[a])]
    bottom = [0.0] * len(tree)
    for d, name in ((0, "depth 0 (root)"), (1, "depth 1"), (2, "depth 2+")):
        share = []
        for a in tree:
            rows = [r["depths"] for r in by[a] if r["depths"]]
            share.append(statistics.mean(
                sum(v for k, v in row.items() if (k >= 2 if d == 2 else k == d)) for row in rows))
        ax.bar(tree, share, bottom=bottom, label=name)
        bottom = [b + s for b, s in zip(bottom, share)]
    ax.set(ylabel="share of continuations", title="where continuations start")
    ax.tick_params(axis="x", labelrotation=20)
    ax.legend(fontsize=8)


def plot(run_dirs: list[Path], reference: str, out: Path, title: str) -> None:
    """The three panels of the runs in `run_dirs`, written to `out` (PNG)."""
    runs = vt.load_runs(run_dirs)
    cur = curves(run_dirs)
    arms = sorted(cur, key=lambda a: (a != reference, a))
    colour = {a: f"C{i}" for i, a in enumerate(arms)}
    by = defaultdict(list)
    for r in runs:
        by[r["label"]].append(r)
    fig, ax = plt().subplots(1, 3, figsize=(15, 4.2))
    _checks_panel(ax[0], cur, arms, colour)
    _gain_panel(ax[1], runs, by, arms, colour, reference)
    _depth_panel(ax[2], by, arms)
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt().close(fig)

"""How much of its own consequences a FOCUS segment's credit keeps, per baseline setting, read
from the trees a run saved (`<run>/traces/step-*.json`).

    python benchmarks/credit_retention.py runs/long/cells/focus/seed-*/
    python benchmarks/credit_retention.py --json out.json <run> [<run> ...]

A segment's advantage is a return minus a baseline, `A_k = R - b(s_k)`. An action's effect
reaches its advantage only through the return when the baseline does not see it; a baseline
that mixes in outcomes of samples that took the same action (the samples below the state
s_{k+1} the segment led to) takes part of the effect back. Since the refined values are linear
in the leaves' rewards, that part is measurable on a saved tree: raise every outcome below
s_{k+1} by 1 and see how much the baseline of s_k moves (W_k). `1 - W_k` is the share of the
segment's own consequence its credit keeps: 1 for a baseline blind to it, 7/8 for GRPO's group
mean over 8 episodes (the episode's own reward is one of eight). Averaged over the trained
segments of every saved tree, weighted by their tokens (the context a segment adds, its
observation included), for each `algo.focus_baseline` x `algo.focus_prior` setting on the same
trees (with the run's kappa and gamma).
"""
from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from agentrl_cli.credit.focus_credit import FocusTree, path_values, path_values_loo, tree_values
from agentrl_cli.reporting.traces import read_trace, trace_steps

SETTINGS = {"refined": ("refined", "critic"), "loo": ("loo", "critic"),
            "prior=tree": ("refined", "tree"), "loo, prior=tree": ("loo", "tree")}


def focus_tree(tree: dict) -> FocusTree:
    """A saved tree (traces JSON) as the arrays credit reads."""
    nodes = sorted(tree["nodes"], key=lambda n: n["id"])
    return FocusTree(parent=[n["parent"] for n in nodes], reward=[n["reward"] for n in nodes],
                     critic=[n["v"] for n in nodes], position=[n["position"] for n in nodes],
                     creator=[n["path"] for n in nodes],
                     paths={int(p): ids for p, ids in tree["paths"].items()})


def baselines(tree: FocusTree, algo) -> dict[int, list[float]]:
    vals = tree_values(tree, algo)
    if algo.focus_baseline == "loo":
        return {p: path_values_loo(tree, vals, p, algo.kappa, algo.gamma) for p in tree.paths}
    return {p: path_values(tree, vals, p) for p in tree.paths}


def retention(tree: FocusTree, algo) -> list[tuple[int, float]]:
    """[(tokens, 1 - W_k)] over the segments the tree trains (each on the path that made it)."""
    base = baselines(tree, algo)
    below: dict[int, list[int]] = {i: [] for i in range(len(tree.parent))}
    for ids in tree.paths.values():
        for n in ids:
            below[n].append(ids[-1])
    moved: dict[int, dict[int, list[float]]] = {}   # leaf -> path -> baseline change per segment
    for leaf in {ids[-1] for ids in tree.paths.values()}:
        reward = list(tree.reward)
        reward[leaf] = float(reward[leaf]) + 1.0
        shifted = baselines(replace(tree, reward=reward), algo)
        moved[leaf] = {p: [a - b for a, b in zip(shifted[p], base[p])] for p in tree.paths}
    out = []
    for p, ids in tree.paths.items():
        for k in range(len(ids) - 1):
            nxt = ids[k + 1]
            if tree.creator[nxt] != p:
                continue                       # inherited: trained on the path that made it
            w = sum(moved[leaf][p][k] for leaf in set(below[nxt]))
            tokens = max(1, tree.position[nxt] - tree.position[ids[k]])
            out.append((tokens, 1.0 - w))
    return out


def run_retention(run: Path) -> dict:
    """The run's token-weighted mean retention per setting (kappa and gamma: the run's)."""
    cfg = json.loads((run / "config.json").read_text())["algo"]
    trees = [focus_tree(t) for f in trace_steps(run).values() for t in read_trace(f).get("trees", [])]
    if not trees:
        raise SystemExit(f"{run}: no saved trees")
    out = {"run": str(run), "trees": len(trees)}
    for name, (baseline, prior) in SETTINGS.items():
        algo = SimpleNamespace(kappa=cfg["kappa"], gamma=cfg["gamma"], focus_baseline=baseline,
                               focus_prior=prior)
        segs = [x for t in trees for x in retention(t, algo)]
        out[name] = sum(n * r for n, r in segs) / sum(n for n, _ in segs)
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="FOCUS run folders with traces/")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args(argv)
    infos = [run_retention(r) for r in args.runs]
    print("| run | trees | " + " | ".join(SETTINGS) + " |")
    print("|---|---|" + "---|" * len(SETTINGS))
    for i in infos:
        print(f"| {Path(i['run']).parent.name}/{Path(i['run']).name} | {i['trees']} | "
              + " | ".join(f"{i[s]:.2f}" for s in SETTINGS) + " |")
    if len(infos) > 1:
        print("mean over runs: " + ", ".join(
            f"{s} {statistics.fmean(i[s] for i in infos):.2f}" for s in SETTINGS))
    if args.json:
        args.json.write_text(json.dumps(infos, indent=1))
    return infos


if __name__ == "__main__":
    main()

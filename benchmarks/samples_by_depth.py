"""Where a method's generated tokens go, per decision: how many times a training step trains
the k-th decision (segment k, from the state k segments below the task's start) of one task,
read from the traces a run saved (`<run>/traces/step-*.json`).

    python benchmarks/samples_by_depth.py runs/long-grpo/cells/grpo/seed-* runs/long-focus/cells/focus/seed-*
    python benchmarks/samples_by_depth.py --steps 1-30 --json out.json <run> [<run> ...]

A FOCUS tree trains each segment once, on the path that generated it (a continuation inherits
its prefix untrained), so decision k of a task is trained once per path that generated a
segment from a state at depth k. A linear method (GRPO and its kin) trains every segment of its
group's episodes: decision k once per episode with more than k segments. Traces keep every tree
of a sample of tasks but only a sample of a linear step's episodes; each task of a linear step
has `rollout.group_size` episodes (the run's config.json), so decision k is trained
group_size x (the sampled episodes' share with more than k segments) times per task. At matched tokens per step the sums agree; the shape says which
decisions a method trains more often.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from agentrl_cli.reporting.traces import read_trace, trace_steps

DEPTHS = 11   # decisions 0..10 (`search-long`'s longest solved episode: 10 tool calls + the answer)


def tree_counts(tree: dict) -> list[int]:
    """Segments trained per depth in one FOCUS tree (a segment belongs to the path that created
    the node it leads to)."""
    nodes = {n["id"]: n for n in tree["nodes"]}
    out = [0] * DEPTHS
    for p, ids in tree["paths"].items():
        for a, b in zip(ids, ids[1:]):
            d = nodes[a]["depth"]
            if nodes[b]["path"] == int(p) and d < DEPTHS:
                out[d] += 1
    return out


def step_counts(trace: dict, group_size: int) -> list[float] | None:
    """Trained segments per task per depth in one saved step (None: nothing to read)."""
    if trace.get("trees"):
        per_tree = [tree_counts(t) for t in trace["trees"]]
        return [statistics.fmean(c[d] for c in per_tree) for d in range(DEPTHS)]
    episodes = trace.get("episodes") or []
    if not episodes:
        return None
    scale = group_size / len(episodes)
    out = [0.0] * DEPTHS
    for e in episodes:
        for k in range(min(len(e["turns"]), DEPTHS)):
            out[k] += scale
    return out


def run_counts(run: Path, lo: int, hi: int) -> dict:
    """A run's trained segments per task per depth, averaged over its saved steps in [lo, hi]."""
    cfg = json.loads((run / "config.json").read_text())
    group = cfg["rollout"]["group_size"]
    rows = []
    for step, f in sorted(trace_steps(run).items()):
        if lo <= step <= hi:
            c = step_counts(read_trace(f), group)
            if c is not None:
                rows.append(c)
    if not rows:
        raise SystemExit(f"{run}: no saved steps in {lo}-{hi}")
    counts = [statistics.fmean(r[d] for r in rows) for d in range(DEPTHS)]
    return {"run": str(run), "method": cfg.get("method", "?"), "steps": len(rows), "counts": counts}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders with traces/")
    ap.add_argument("--steps", default="1-1000000", help="saved steps to read, LO-HI")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args(argv)
    lo, hi = (int(x) for x in args.steps.split("-"))
    infos = [run_counts(r, lo, hi) for r in args.runs]
    by_method: dict[str, list[list[float]]] = {}
    for i in infos:
        by_method.setdefault(i["method"], []).append(i["counts"])
    print("| method | runs | " + " | ".join(f"d{d}" for d in range(DEPTHS)) + " | sum |")
    print("|---|---|" + "---|" * (DEPTHS + 1))
    for m, rows in by_method.items():
        mean = [statistics.fmean(r[d] for r in rows) for d in range(DEPTHS)]
        print(f"| `{m}` | {len(rows)} | " + " | ".join(f"{x:.1f}" for x in mean)
              + f" | {sum(mean):.1f} |")
    if args.json:
        args.json.write_text(json.dumps(infos, indent=1))
    return infos


if __name__ == "__main__":
    main()

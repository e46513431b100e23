"""Where did a FOCUS step's continuations go? Counts the continuations launched from tree nodes
at each depth (segments taken before the node) in `agentrl rollout --method focus` JSONL files.

    agentrl rollout --method focus --checkpoint runs/r/checkpoints/step-000010 --n 8 \
        --set rollout.budget_tokens=2566 --set algo.focus_allocator=focus --out focus.jsonl
    (the same with algo.focus_allocator=uniform --out uniform.jsonl)
    python benchmarks/focus_depths.py focus.jsonl uniform.jsonl

Measured on 8 tasks from one checkpoint (docs/results.md): FOCUS's gain launched 89 of 168 continuations (53%)
from depth 4 (the state before the answer), the uniform allocator 20 of 104 (19%).
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path


def depths(path: Path) -> tuple[Counter, list[float]]:
    """(continuations launched per node depth, |v - cbar| of every internal node with both)."""
    launched: Counter = Counter()
    gaps = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        for nd in json.loads(line)["nodes"]:
            if nd.get("launched"):
                launched[nd["depth"]] += nd["launched"]
            if nd.get("reward") is None and nd.get("v") is not None and nd.get("cbar") is not None:
                gaps.append(abs(nd["v"] - nd["cbar"]))
    return launched, gaps


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="+", type=Path, help="tree JSONL files")
    args = ap.parse_args(argv)
    for path in args.trees:
        launched, gaps = depths(path)
        total = sum(launched.values())
        cells = ", ".join(f"{d}: {n} ({n / total:.0%})"
                          for d, n in sorted(launched.items())) if total else "-"
        mean_depth = sum(d * n for d, n in launched.items()) / total if total else float("nan")
        gap = sum(gaps) / len(gaps) if gaps else float("nan")
        print(f"{path.name}: {total} continuations by depth {{{cells}}}; mean depth "
              f"{mean_depth:.2f}; mean |v - cbar| {gap:.3f}")


if __name__ == "__main__":
    main()

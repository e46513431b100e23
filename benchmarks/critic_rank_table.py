"""The critic-rank table of docs/results.md: `agentrl diagnose critic-rank --json` outputs of a
method's seeds merged per checkpoint step (Spearman's rho per seed and its mean, mean |V - MC|,
mean critic value, mean Monte Carlo value).

    python benchmarks/critic_rank_table.py rank-seed-0.json rank-seed-1.json rank-seed-2.json
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def merge(docs: list[dict]) -> dict[int, list[dict]]:
    """step -> the checkpoints of every seed at that step."""
    rows: dict[int, list[dict]] = {}
    for d in docs:
        for c in d["checkpoints"]:
            rows.setdefault(c["step"], []).append(c)
    return rows


def table(docs: list[dict]) -> str:
    lines = ["| step | Spearman rho (per seed) | mean rho | mean abs(V - MC) | mean V | mean MC value |",
             "|---|---|---|---|---|---|"]
    for step, cs in sorted(merge(docs).items()):
        rho = [c["spearman"] for c in cs if c["spearman"] is not None]
        mean_rho = f"{statistics.mean(rho):.2f}" if rho else "–"
        lines.append(f"| {step} | {' / '.join(f'{x:.2f}' for x in rho) or '–'} | {mean_rho} | "
                     f"{statistics.mean(c['mae'] for c in cs):.2f} | "
                     f"{statistics.mean(c['mean_critic'] for c in cs):.2f} | "
                     f"{statistics.mean(c['mean_target'] for c in cs):.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path, help="critic-rank --json outputs, one per seed")
    args = ap.parse_args()
    print(table([json.loads(f.read_text()) for f in args.files]))


if __name__ == "__main__":
    main()

"""Print a markdown table of finished `agentrl train` runs (the per-method learning tables of
docs/results.md come from here).

    python benchmarks/learning_table.py runs/cmp/*/           # one row per run
    python benchmarks/learning_table.py --mean runs/cmp/*/    # mean ± std per method

Columns: held-out success at every eval step (from metrics.jsonl), base -> final, generated
tokens per training step (mean over steps) and tokens per held-out question at the end.
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def load(run: Path) -> dict | None:
    if not (run / "summary.json").is_file():
        return None
    summary = json.loads((run / "summary.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    curve = {r["step"]: r["eval/success"] for r in rows if "eval/success" in r}
    tokens = [r["rollout/tokens"] for r in rows if "rollout/tokens" in r]
    return {"run": run.name, "method": summary["method"], "seed": summary["seed"],
            "base": summary["base_success"], "final": summary["final_success"], "curve": curve,
            "tokens_per_step": sum(tokens) / max(len(tokens), 1),
            "tpq": summary["final_tokens_per_question"], "wall": summary["wall_seconds"]}


def fmt(xs: list[float], digits: int = 3) -> str:
    if len(xs) == 1:
        return f"{xs[0]:.{digits}f}"
    return f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs):.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--mean", action="store_true", help="one row per method: mean ± std over seeds")
    args = ap.parse_args()
    runs = [r for r in (load(p) for p in args.runs) if r is not None]
    if not runs:
        raise SystemExit("no finished runs (summary.json) among the given folders")
    steps = sorted(set().union(*(r["curve"] for r in runs)))
    head = ["method", "seeds" if args.mean else "seed"] + [f"step {s}" for s in steps] + [
        "final - base", "gen. tokens / step", "tokens / eval question", "wall s"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    if not args.mean:
        for r in sorted(runs, key=lambda r: (r["method"], r["seed"])):
            cells = [r["method"], str(r["seed"])] + [
                f"{r['curve'][s]:.3f}" if s in r["curve"] else "" for s in steps] + [
                f"{r['final'] - r['base']:+.3f}", f"{r['tokens_per_step']:.0f}", f"{r['tpq']:.1f}",
                f"{r['wall']:.0f}"]
            print("| " + " | ".join(cells) + " |")
        return
    by = defaultdict(list)
    for r in runs:
        by[r["method"]].append(r)
    for method, rs in sorted(by.items()):
        cells = [method, ",".join(str(r["seed"]) for r in sorted(rs, key=lambda r: r["seed"]))]
        cells += [fmt([r["curve"][s] for r in rs if s in r["curve"]]) if any(s in r["curve"] for r in rs)
                  else "" for s in steps]
        cells += [fmt([r["final"] - r["base"] for r in rs]), fmt([r["tokens_per_step"] for r in rs], 0),
                  fmt([r["tpq"] for r in rs], 1), fmt([r["wall"] for r in rs], 0)]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

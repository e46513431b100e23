"""The verdict table of docs/results.md: one row per method (or sweep cell) over its seeds,
each compared with a reference method seed by seed.

    python benchmarks/methods_table.py runs/methods               # an `agentrl ablate` folder
    python benchmarks/methods_table.py --reference grpo runs/a runs/b/cells/*/seed-*/
    python benchmarks/methods_table.py --checks 110-200 runs/a runs/b   # a window of the checks

Columns: the mean of a run's held-out checks after step 0 (mean ± sample std over seeds), the
final check minus the base (step 0), the paired difference of the mean of checks against the
reference method on the same seeds (mean ± its standard error, std / sqrt(seeds)) and the
verdict it gives (ahead / behind when the difference exceeds its standard error, else level),
the same paired difference at the last check,
generated tokens per training step, generated tokens per held-out question at the last check,
seconds per training step (the step's own time, checks excluded) and the mean standard error
of one check (task-clustered, when the run logged it). `--checks LO-HI` takes the mean of
checks (and its paired difference) over the checks at steps LO to HI only.
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def load_run(run: Path, lo: int = 1, hi: int | None = None) -> dict | None:
    """A finished run's numbers (None without summary.json); the mean of checks over the checks
    at steps lo..hi (default: every check after step 0)."""
    if not (run / "summary.json").is_file():
        return None
    summary = json.loads((run / "summary.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    checks = {r["step"]: r for r in rows if "eval/success" in r}
    steps = [r for r in rows if "rollout/tokens" in r]
    last = max(checks)
    label = run.parent.name if run.name.startswith("seed-") else summary["method"]
    return {"label": label, "seed": summary["seed"], "base": checks[0]["eval/success"],
            "final": checks[last]["eval/success"],
            "mean_checks": statistics.mean(r["eval/success"] for s, r in checks.items()
                                           if max(lo, 1) <= s <= (hi if hi is not None else s)),
            "tokens_per_step": statistics.mean(r["rollout/tokens"] for r in steps),
            "tpq": checks[last]["eval/tokens_per_question"],
            "s_per_step": statistics.mean(r["time/step"] for r in steps if "time/step" in r),
            "se": statistics.mean(r["eval/success_se"] for r in checks.values())
            if all("eval/success_se" in r for r in checks.values()) else None}


def paired(runs: list[dict], ref: list[dict], key: str = "mean_checks") -> tuple[float, float, int] | None:
    """(mean, standard error, seeds) of the differences in `key` (default the mean of checks)
    on the seeds both share."""
    theirs = {r["seed"]: r[key] for r in ref}
    d = [r[key] - theirs[r["seed"]] for r in runs if r["seed"] in theirs]
    if len(d) < 2:
        return None
    return statistics.mean(d), statistics.stdev(d) / len(d) ** 0.5, len(d)


def verdict(diff: tuple[float, float, int] | None) -> str:
    if diff is None:
        return "–"
    mean, se, _ = diff
    return "ahead" if mean > se else "behind" if mean < -se else "level"


def _ms(xs: list[float], scale: float = 1.0, digits: int = 3, sign: str = "") -> str:
    xs = [x * scale for x in xs]
    if len(xs) == 1:
        return f"{xs[0]:{sign}.{digits}f}"
    return f"{statistics.mean(xs):{sign}.{digits}f} ± {statistics.stdev(xs):.{digits}f}"


def table(runs: list[dict], reference: str) -> list[str]:
    by = defaultdict(list)
    for r in runs:
        by[r["label"]].append(r)
    head = ["method", "seeds", "mean of checks", "final - base (points)",
            f"vs {reference} (points, paired)", "verdict", f"last check vs {reference}",
            "gen. tokens / step",
            "tokens / eval question", "s / step", "se of one check"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    order = sorted(by, key=lambda k: -statistics.mean(r["mean_checks"] for r in by[k]))
    for label in order:
        rs = sorted(by[label], key=lambda r: r["seed"])
        diff = None if label == reference or reference not in by else paired(rs, by[reference])
        last = None if label == reference or reference not in by else paired(rs, by[reference], "final")
        ses = [r["se"] for r in rs if r["se"] is not None]
        lines.append("| " + " | ".join([
            f"`{label}`", ",".join(str(r["seed"]) for r in rs),
            _ms([r["mean_checks"] for r in rs]),
            _ms([r["final"] - r["base"] for r in rs], 100, 1, "+"),
            "reference" if label == reference else
            ("–" if diff is None else f"{100 * diff[0]:+.1f} ± {100 * diff[1]:.1f}"),
            "–" if label == reference else verdict(diff),
            "–" if last is None else f"{100 * last[0]:+.1f} ± {100 * last[1]:.1f}",
            _ms([r["tokens_per_step"] for r in rs], digits=0),
            _ms([r["tpq"] for r in rs], digits=1),
            _ms([r["s_per_step"] for r in rs], digits=2),
            f"{statistics.mean(ses):.3f}" if ses else "–"]) + " |")
    return lines


def runs_under(paths: list[Path]) -> list[Path]:
    """Run folders: an ablate folder's cells/*/seed-*, or the folders given."""
    out = []
    for p in paths:
        out += sorted(p.glob("cells/*/seed-*")) if (p / "cells").is_dir() else [p]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders or agentrl ablate folders")
    ap.add_argument("--reference", default="grpo", help="the method every row is paired with")
    ap.add_argument("--checks", default=None, help="LO-HI: the mean of checks over these steps only")
    args = ap.parse_args()
    lo, hi = (int(x) for x in args.checks.split("-")) if args.checks else (1, None)
    runs = [r for r in (load_run(p, lo, hi) for p in runs_under(args.runs)) if r is not None]
    if not runs:
        raise SystemExit("no finished runs (summary.json) among the given folders")
    print("\n".join(table(runs, args.reference)))


if __name__ == "__main__":
    main()

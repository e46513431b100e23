"""A sweep's results: per cell, the mean and sample std over its finished seeds of the final
held-out success, tokens generated and tokens per held-out question, the mean tasks a step
learnt from and share of mixed-outcome groups, and the method's tuned values (`collect`), written as
summary.json, summary.csv and the figures of `reporting.ablation` (`write_results`)."""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from ..reporting.ablation import plot_curves, plot_final_vs_param, tuned_label
from ..reporting.metrics import read_metrics
from ..train.run_folder import atomic_write_text
from .plan import Sweep
from .run import status


def _mean_std(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, 0.0
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def collect(sweep: Sweep) -> dict:
    """Per-cell results from the finished runs' summary.json and metrics.jsonl."""
    cells, envs = [], set()
    for cell in sweep.cells:
        runs = []
        for seed in sweep.seeds:
            d = sweep.run_dir(cell, seed)
            if status(d) != "finished":
                continue
            s = json.loads((d / "summary.json").read_text())
            rows = read_metrics(d / "metrics.jsonl") if (d / "metrics.jsonl").is_file() else []
            runs.append({"seed": seed, "summary": s,
                         "curve": [(r["step"], r["eval/success"]) for r in rows if "eval/success" in r],
                         "tokens_per_step": [r["rollout/tokens"] for r in rows if "rollout/tokens" in r],
                         "tasks": [r["rollout/tasks"] for r in rows if "rollout/tasks" in r],
                         "mixed": [r["rollout/mixed_groups"] for r in rows
                                   if "rollout/mixed_groups" in r]})
        envs |= {r["summary"].get("env") for r in runs}
        row = {"name": cell.name, "method": cell.method, "params": dict(cell.params),
               "tuned": dict(cell.tuned),
               "seeds": [r["seed"] for r in runs], "dirs": [str(sweep.run_dir(cell, r["seed"])) for r in runs]}
        for key, src in (("final_success", "final_success"), ("tokens", "tokens_generated"),
                         ("tokens_per_question", "final_tokens_per_question"),
                         ("base_success", "base_success")):
            vals = [float(r["summary"][src]) for r in runs]
            row[key] = vals
            row[f"{key}_mean"], row[f"{key}_std"] = _mean_std(vals)
        tps = [t for r in runs for t in r["tokens_per_step"]]
        row["tokens_per_step_mean"] = sum(tps) / len(tps) if tps else None
        # distinct tasks a step learnt from, and the share of a step's groups (a GRPO group, a
        # task's tree) with mixed outcomes, over every step of every finished seed
        for key, src in (("tasks_per_step_mean", "tasks"), ("mixed_groups_mean", "mixed")):
            xs = [t for r in runs for t in r[src]]
            row[key] = sum(xs) / len(xs) if xs else None
        row["curves"] = [r["curve"] for r in runs]
        cells.append(row)
    done = [c for c in cells if c["final_success_mean"] is not None]
    best = max(done, key=lambda c: c["final_success_mean"])["name"] if done else None
    return {"out": str(sweep.out), "budget_tokens": sweep.budget, "seeds": sweep.seeds,
            "env": ",".join(sorted(e for e in envs if e)) or None,
            "axes": sorted({k for c in sweep.cells for k in c.params}), "cells": cells, "best": best}


def write_results(res: dict, out: Path) -> None:
    """summary.json, summary.csv, learning_curves.png, final_vs_param.png in `out`."""
    atomic_write_text(out / "summary.json", json.dumps(res, indent=2))
    top = max((c["final_success_mean"] for c in res["cells"] if c["final_success_mean"] is not None),
              default=None)
    cols = ["cell", "method", *res["axes"], "seeds", "final_success_mean", "final_success_std",
            "tokens_mean", "tokens_std", "tokens_per_step_mean", "tasks_per_step_mean",
            "mixed_groups_mean", "tuned", "tokens_per_question_mean",
            "tokens_per_question_std", "base_success_mean", "best"]
    table = io.StringIO(newline="")
    w = csv.writer(table)
    w.writerow(cols)
    for c in res["cells"]:
        w.writerow([c["name"], c["method"], *[c["params"].get(a, "") for a in res["axes"]],
                    len(c["seeds"]), c["final_success_mean"], c["final_success_std"],
                    c["tokens_mean"], c["tokens_std"], c["tokens_per_step_mean"],
                    c["tasks_per_step_mean"], c["mixed_groups_mean"], tuned_label(c),
                    c["tokens_per_question_mean"], c["tokens_per_question_std"],
                    c["base_success_mean"],
                    top is not None and c["final_success_mean"] == top])
    atomic_write_text(out / "summary.csv", table.getvalue())
    plot_curves(res, out / "learning_curves.png")
    plot_final_vs_param(res, out / "final_vs_param.png")

"""Per-run training diagnostics of finished `agentrl train` runs, from their metrics.jsonl: the
mean of the held-out checks after step 0, the gradient norms before the clip, on how many steps
a clip would bind, and FOCUS's critic error and launch depth.

    python benchmarks/run_stats.py runs/cmp/cells/*/seed-*/

Columns: `grad_norm` (the policy's; runs from before the clip was split logged the joint norm
of policy and critic here), `critic/grad_norm` (the critic's own parameters), `joint > clip` (steps
where the norm of both together exceeds `train.grad_clip`: where one joint clip would have cut
the policy's step), `|v - c̄|` (FOCUS: critic vs own-sample mean at tree nodes), launch depth.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path


def _mean(xs: list[float]) -> float | None:
    return statistics.mean(xs) if xs else None


def stats(run: Path) -> dict:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    cfg = json.loads((run / "config.json").read_text()) if (run / "config.json").is_file() else {}
    clip = cfg.get("train", {}).get("grad_clip", 1.0) or math.inf
    checks = [r["eval/success"] for r in rows if "eval/success" in r and r["step"] > 0]
    steps = [r for r in rows if "grad_norm" in r]
    policy = [r["grad_norm"] for r in steps]
    critic = [r.get("critic/grad_norm", 0.0) for r in steps]
    return {"run": str(run), "checks": _mean(checks), "grad_norm": _mean(policy),
            "critic/grad_norm": _mean(critic) if any(critic) else None,
            "joint > clip": sum(math.hypot(a, b) > clip for a, b in zip(policy, critic)),
            "steps": len(steps),
            "|v - c̄|": _mean([r["focus/abs_v_minus_cbar"] for r in rows
                              if "focus/abs_v_minus_cbar" in r]),
            "launch depth": _mean([r["focus/launch_depth_mean"] for r in rows
                                   if "focus/launch_depth_mean" in r])}


def _fmt(v) -> str:
    if v is None:
        return "–"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    args = ap.parse_args(argv)
    rows = [stats(r) for r in args.runs if (r / "metrics.jsonl").is_file()]
    if not rows:
        raise SystemExit("no run folder with a metrics.jsonl")
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(_fmt(r[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()

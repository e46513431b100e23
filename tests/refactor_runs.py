"""Short runs of every method, for refactors that must not change numbers.

Usage: OMP_NUM_THREADS=1 python tests/refactor_runs.py OUT [--compare REF] [--methods a,b]
Trains each method (and FOCUS with a user allocator file, and PPO with the critic warm-up
crossed) for 3 steps on the shipped search agent into OUT/<name>; with --compare REF each
run's metrics.jsonl is compared with REF/<name>/metrics.jsonl (`compare_metrics.differences`,
wall-clock keys ignored) and the script exits 1 on any difference.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from compare_metrics import differences, rows  # noqa: E402

COMMON = ["--seed", "0", "--steps", "3", "--set", "train.eval_tasks=6", "--set", "train.eval_every=2",
          "--set", "rollout.tasks_per_step=2", "--set", "rollout.group_size=4",
          "--set", "train.trace_every=1"]
RUNS = {m: ["--method", m] for m in
        ("grpo", "dr_grpo", "rloo", "dapo", "gspo", "ppo", "vineppo", "mpo", "trace", "focus")}
RUNS["ppo_warm1"] = ["--method", "ppo", "--set", "train.critic_warmup=1"]
RUNS["focus_random"] = ["--method", "focus", "--set", "algo.focus_allocator=random"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--compare", type=Path)
    ap.add_argument("--methods", default="")
    a = ap.parse_args()
    names = [n for n in a.methods.split(",") if n] or list(RUNS)
    bad = 0
    for name in names:
        out = a.out / name
        if not (out / "metrics.jsonl").exists():
            cmd = [sys.executable, "-c", "from agentrl_cli.cli.main import app; app()", "train", *RUNS[name], *COMMON, "--out", str(out)]
            r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            if r.returncode:
                print(f"{name}: exit {r.returncode}\n{r.stderr[-2000:]}")
                bad += 1
                continue
        if a.compare:
            diff = differences(rows(a.compare / name / "metrics.jsonl"), rows(out / "metrics.jsonl"))
            print(f"{name}: " + ("equal" if not diff else "\n  ".join(["DIFFERENT", *diff[:8]])))
            bad += bool(diff)
        else:
            print(f"{name}: done")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

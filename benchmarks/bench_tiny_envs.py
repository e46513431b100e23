"""Where the tiny built-in agent lands on the built-in envs: untrained model, warmed-up tiny
model, and the scripted expert, on the same held-out tasks.

For each env this builds the tiny model with the default recipe (warm-up steps capped by
`--warmup-steps`; the warm-up stops at the first check on its dev questions that reaches
`model.tiny_target_success`, and a warm-up shorter than the recipe's first check is checked
once, at its last step), then samples `--samples` episodes (temperature 1) on `--tasks`
held-out tasks. The untrained row is the same architecture and tokenizer with no warm-up
(random weights). Builds go to `$AGENTRL_CACHE` (a fresh folder is a good idea); each one
takes several minutes of one CPU core.

    OMP_NUM_THREADS=1 AGENTRL_CACHE=runs/tiny-envs-cache python benchmarks/bench_tiny_envs.py \
        [--envs locate rules math] [--warmup-steps 700] [--tasks 60] [--samples 4] \
        [--set env.repos=shared ...]
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from agentrl_cli import config
from agentrl_cli.evaluation.runner import run_eval
from agentrl_cli.app.tiny_build import ensure_model
from agentrl_cli.context import make_spec


def expert_success(cfg, n_tasks: int) -> float:
    spec = make_spec(cfg)
    rng = random.Random(0)
    ok = 0.0
    tasks = spec.tasks("eval", n_tasks)
    for task in tasks:
        env = spec.make()
        env.reset(task)
        while True:
            res = env.step(spec.expert(env, rng, 0.0))
            if res.terminated or res.truncated:
                break
        ok += res.reward
    return ok / len(tasks)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", nargs="+", default=["locate", "rules", "math"])
    ap.add_argument("--warmup-steps", type=int, default=700)
    ap.add_argument("--tasks", type=int, default=60)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--set", action="append", default=[], dest="sets",
                    help="extra config key=value for every build and evaluation (repeatable)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for env in args.envs:
        row = {"env": env}
        for name, steps in (("untrained", 0), ("tiny", args.warmup_steps)):
            cfg = config.load(sets=[f"env.name={env}", f"model.tiny_warmup_steps={steps}", *args.sets])
            t0 = time.time()
            path = ensure_model(cfg, log=lambda s: print(f"  [{env}] {s}", flush=True))
            built = time.time() - t0
            info = json.loads((Path(path) / "recipe.json").read_text())
            res = run_eval(cfg, n=args.samples, k_max=args.samples, n_tasks=args.tasks)
            row[name] = res["mean@1"]
            row[f"{name} pass@{args.samples}"] = res["pass@k"][str(args.samples)]
            if name == "tiny":
                row["warm-up steps"] = info["warmup_steps"]
                row["build s"] = round(built)
            print(f"  [{env}] {name}: mean@1 {res['mean@1']:.3f} pass@{args.samples} "
                  f"{res['pass@k'][str(args.samples)]:.3f} tool calls {res['tool_calls']:.2f}",
                  flush=True)
        row["expert"] = expert_success(cfg, args.tasks)
        rows.append(row)
    print()
    print(f"held-out mean@1 ({args.tasks} tasks x {args.samples} samples, temperature 1)")
    print(f"{'env':8} {'untrained':>10} {'tiny':>8} {'expert':>8} {'warm-up steps':>14} {'build s':>8}")
    for r in rows:
        print(f"{r['env']:8} {r['untrained']:10.3f} {r['tiny']:8.3f} {r['expert']:8.3f} "
              f"{r['warm-up steps']:14d} {r['build s']:8d}")


if __name__ == "__main__":
    main()

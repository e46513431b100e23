"""What a controller's steps hold: main episodes, groups, generated tokens and the tokens spent
beyond the trained episodes (value continuations, refills), for the first steps of a run.

    python benchmarks/controller_counts.py --method vineppo --budget 2663 --steps 3

Runs `--steps` training steps (no held-out checks, no checkpoints) in a scratch folder and
prints one line per step.
"""
from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

from agentrl_cli import config
from agentrl_cli.rollout.controllers import CONTROLLERS
from agentrl_cli.train.loop import train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="vineppo")
    ap.add_argument("--budget", type=int, default=0)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cfg = config.load(method=args.method, seed=args.seed, sets=[
        f"rollout.budget_tokens={args.budget}", f"train.steps={args.steps}",
        "train.eval_every=0", "train.eval_tasks=4", "train.save_every=0"])
    name = cfg.algo.controller
    inner = CONTROLLERS.get(name)
    seen = []

    def counted(ctx, tasks, *a, **k):
        res = inner.run(ctx, tasks, *a, **k)
        seen.append((len(res.episodes), len({e.group for e in res.episodes}), res.tokens,
                     res.extra_tokens))
        return res

    CONTROLLERS._items[name] = dataclasses.replace(inner, run=counted)
    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, Path(tmp) / "run", log=lambda s: None)
    print(f"{args.method} ({name} controller), budget {args.budget or 'none'}:")
    for i, (n, g, tok, extra) in enumerate(seen, 1):
        print(f"  step {i}: {n} trained episodes in {g} groups, {tok} generated tokens, "
              f"{extra} of them not in a trained episode")


if __name__ == "__main__":
    main()

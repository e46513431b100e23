"""FOCUS overhead: the share of rollout wall time spent in the allocator and tree bookkeeping
(gains, candidate scans, node creation and updates, refined values) rather than in the engine
and the env. Target: under 5%.

Runs the "focus" controller for a few steps on the tiny model with a random value head, so the
critic disagrees with the outcomes and the allocator branches. The untrained model
(`--warmup-steps 0`, the fast default) made no continuations when rechecked on the v8 build
(the bookkeeping share is then of root paths only); `--warmup-steps 4800` (the default `model.tiny_warmup_steps`) uses the default build,
whose trees branch. The model is always loaded with the default env settings (the tiny
recipe's key, so the cached default build is reused); `--max-turns` (default 6) caps episodes
only in the rollouts measured here.

    python benchmarks/bench_focus_overhead.py [--tasks 4] [--group-size 8] [--steps 2]
                                              [--warmup-steps 0] [--allocator focus] [--threads 1]
                                              [--max-turns 6]
                                              [--critic head|separate|both]

`--critic both` also runs every step with a separate critic model that copies the policy and
the head (so the trees are the same) and prints its rollout wall time next to the head's: the
cost of reading a separate critic inside the trees (one critic forward per new node's context).
"""
from __future__ import annotations

import argparse
import time

import torch

from agentrl_cli import config
from agentrl_cli.engines.base import SamplingParams
from agentrl_cli.engines.hf import HFEngine
from agentrl_cli.models.critic import ValueHead, build_critic
from agentrl_cli.app.tiny_build import load_policy
from agentrl_cli.rollout.controllers import CONTROLLERS, RolloutContext
from agentrl_cli.context import make_spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--roots", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup-steps", type=int, default=0, help="tiny model warm-up (0: untrained)")
    ap.add_argument("--allocator", default="focus")
    ap.add_argument("--max-turns", type=int, default=6,
                    help="episode turn cap in the measured rollouts (not in the model's recipe)")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--same-tasks", action="store_true", help="the same tasks every step")
    ap.add_argument("--critic", default="head", choices=("head", "separate", "both"))
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (1: immune to OpenMP stalls on a shared machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    sets = [f"model.tiny_warmup_steps={args.warmup_steps}",
            f"algo.focus_roots={args.roots}", f"algo.focus_allocator={args.allocator}"]
    # env settings are part of the tiny recipe's key: the model comes from a config without the
    # turn cap, so `--warmup-steps 4800` loads the cached default build instead of training another
    model, _, fmt, _ = load_policy(config.load(sets=sets, method="focus"), log=print)
    cfg = config.load(sets=sets + [f"env.max_turns={args.max_turns}"], method="focus")
    spec = make_spec(cfg)
    torch.manual_seed(0)
    head = ValueHead(model.config.hidden_size)
    torch.nn.init.normal_(head.weight, std=0.3)
    torch.nn.init.constant_(head.bias, 0.5)
    critics = {"head": head}
    if args.critic != "head":
        sep = build_critic("separate", model)
        sep.head.load_state_dict(head.state_dict())
        critics = {"separate": sep} if args.critic == "separate" else {"head": head, "separate": sep}
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    controller = CONTROLLERS.get("focus")
    pool = spec.tasks("train")
    wall = book = 0.0
    tokens = paths = conts = nodes = 0
    per_critic = {name: 0.0 for name in critics}
    for step in range(args.steps + 1):  # step 0 warms up (allocations, first-call overheads)
        tasks = pool[(step * args.tasks) % 64:(step * args.tasks) % 64 + args.tasks] if not args.same_tasks else pool[:args.tasks]
        runs = {}
        for name, critic in critics.items():   # the same seed: the same trees for every form
            ctx = RolloutContext(HFEngine(model, fmt.pad_id), fmt, spec, params, args.group_size,
                                 cfg.rollout.max_tokens, args.batch_size, 0,
                                 torch.Generator().manual_seed(step), algo=cfg.algo, critic=critic)
            t0 = time.perf_counter()
            runs[name] = (controller(ctx, tasks), time.perf_counter() - t0)
            if step > 0:
                per_critic[name] += runs[name][1]
        res, dt = next(iter(runs.values()))      # the step's numbers: the first form's run
        if step == 0:
            continue
        m = res.metrics
        print(f"  step {step}: {dt:.2f} s, {res.tokens} tokens, {len(res.episodes)} paths, "
              f"bookkeeping {100 * res.timing.bookkeeping_seconds / dt:.2f}%")
        wall += dt
        book += res.timing.bookkeeping_seconds
        tokens += res.tokens
        paths += len(res.episodes)
        conts += m["focus/continuations"]
        nodes += m["focus/nodes"]
    print(f"FOCUS rollout, {args.steps} steps x {args.tasks} tasks x {args.group_size} paths "
          f"(roots {args.roots}/task, capacity {args.batch_size}, allocator {args.allocator})")
    print(f"  paths {paths}  continuations {conts}  nodes {nodes}  generated tokens {tokens}")
    print(f"  rollout wall {wall:.2f} s  ({tokens / max(wall, 1e-9):.0f} tokens/s)")
    print(f"  allocator + tree bookkeeping {book * 1e3:.1f} ms = {100 * book / max(wall, 1e-9):.2f}% "
          f"of rollout wall time (target < 5%)")
    if len(per_critic) > 1:
        ratio = per_critic["separate"] / max(per_critic["head"], 1e-9)
        print(f"  rollout wall, value head {per_critic['head']:.2f} s vs separate critic model "
              f"{per_critic['separate']:.2f} s: {ratio:.2f}x")


if __name__ == "__main__":
    main()

"""What each critic form (`model.critic`) costs per training update, side by side in one run.

    python benchmarks/bench_critic_forms.py [--method mpo] [--reps 5] [--threads 1] \
        [--set KEY=VALUE ...]

One batch of real episodes (`rollout.tasks_per_step x rollout.group_size` episodes of the
configured model, default the tiny build, sampled once), then for each form a learner built
from the same weights; the timed unit is what the trainer does after a rollout: `score` (old
log-probs and values) + the estimator + `update` (PPO epochs x minibatches). The forms take
turns within every repetition, so machine noise hits them alike; the median seconds per update
and the ratio to `head` are printed, with each learner's trainable parameters and its AdamW
state after the updates.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl_cli import config  # noqa: E402
from agentrl_cli.credit.estimators import ESTIMATORS  # noqa: E402
from agentrl_cli.engines.base import SamplingParams  # noqa: E402
from agentrl_cli.engines.hf import HFEngine  # noqa: E402
from agentrl_cli.app.tiny_build import load_policy  # noqa: E402
from agentrl_cli.rollout.runner import run_episodes  # noqa: E402
from agentrl_cli.train.batch import collate  # noqa: E402
from agentrl_cli.context import make_spec  # noqa: E402
from agentrl_cli.train.learner import build_learner, score, update  # noqa: E402

FORMS = ("head", "detached", "separate")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", default="mpo", help="a method with a critic (ppo, mpo, focus)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    base = config.load(sets=args.sets, method=args.method)
    model, _, fmt, _ = load_policy(base, log=lambda s: None)
    spec = make_spec(base)
    r = base.rollout
    tasks = spec.tasks("train", r.tasks_per_step)
    pairs = [(t, g) for g, t in enumerate(tasks) for _ in range(r.group_size)]
    eps = run_episodes(HFEngine(model, fmt.pad_id), fmt, spec, pairs,
                       SamplingParams(r.temperature, r.top_p, r.max_new_tokens), r.max_tokens,
                       r.batch_size, torch.Generator().manual_seed(0))
    tokens = sum(len(e.token_ids) for e in eps)
    print(f"{args.method}: {len(eps)} episodes, {tokens} tokens per batch, "
          f"{sum(e.reward for e in eps) / len(eps):.2f} mean reward, {args.threads} thread(s)")

    learners, cfgs = {}, {}
    for form in FORMS:
        cfgs[form] = config.load(sets=args.sets + [f"model.critic={form}", "train.critic_warmup=0"],
                                 method=args.method)
        learners[form] = build_learner(cfgs[form], copy.deepcopy(model), log=lambda s: None)

    def one(form: str, step: int) -> float:
        learner, cfg = learners[form], cfgs[form]
        t0 = time.perf_counter()
        batch = collate(copy.deepcopy(eps), fmt.pad_id)
        score(learner, batch, cfg)
        c = ESTIMATORS.get(cfg.algo.estimator)(batch, cfg.algo)
        batch.advantages, batch.returns, batch.value_mask = c.advantages, c.returns, c.value_mask
        update(learner, batch, cfg, step)
        return time.perf_counter() - t0

    for form in FORMS:                       # untimed: allocator and AdamW state warm-up
        one(form, 1)
    secs: dict[str, list[float]] = {f: [] for f in FORMS}
    for rep in range(args.reps):
        for form in FORMS:
            secs[form].append(one(form, rep + 2))
    head = statistics.median(secs["head"])
    print(f"{'form':<10} {'s/update':>9} {'vs head':>8} {'trainable params':>17} {'AdamW state MB':>15}")
    for form in FORMS:
        learner = learners[form]
        n = sum(p.numel() for p in learner.params)
        state = sum(t.numel() * t.element_size() for s in learner.optimizer.state.values()
                    for t in s.values() if torch.is_tensor(t))
        med = statistics.median(secs[form])
        print(f"{form:<10} {med:>9.3f} {med / head:>7.2f}x {n:>17,} {state / 2**20:>15.1f}")


if __name__ == "__main__":
    main()

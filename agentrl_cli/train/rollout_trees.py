"""FOCUS trees for `agentrl rollout --method focus`, grown from the critic `agentrl train` would
start from (a checkpoint's own critic, else the recipe's initial critic): choosing that critic is
the trainer's business, so this lives in `train/`."""
from __future__ import annotations

from pathlib import Path

import torch

from ..config import RunConfig
from ..models.critic import critic_from_checkpoint
from ..rollout.controllers import CONTROLLERS, RolloutContext
from ..rollout.matched_budget import matched_budget
from ..rollout.runtime import build_runtime
from . import checkpoint
from .learner import initial_critic


def collect_trees(cfg: RunConfig, n: int, split: str = "eval", group_size: int | None = None,
                  log=print):
    """FOCUS tree rollouts: `n` trees, one per task (the first `n` tasks of `split`) ->
    (episodes, trees, budget). Each tree grows as a training step would grow it for its task,
    with `group_size` (default `rollout.group_size`) standing for the episodes per task of
    the GRPO step it is matched to.

    The critic is the one `agentrl train` would use: a checkpoint's own (value head or separate
    critic model) when `cfg.model.name` is a checkpoint folder, else the recipe's initial
    critic (`train.learner.initial_critic`: for FOCUS on the tiny build, its fitted value head).
    The budget is `rollout.budget_tokens`; when that is 0 and the recipe matches budgets
    (`rollout.budget_match`, FOCUS's default), it is what a GRPO step would generate on these
    tasks (`rollout.matched_budget`, one linear episode per task sampled first, same seed,
    scaled to n x `group_size` episodes), as `train` sets it from the base policy. Without
    either, each tree completes `group_size` paths (so with `group_size` 1 it cannot branch)."""
    group_size = cfg.rollout.group_size if group_size is None else group_size
    rt = build_runtime(cfg)
    tasks = rt.spec.tasks(split, n)
    ckpt = Path(cfg.model.name)
    if (ckpt / checkpoint.STATE_FILE).is_file():
        critic = critic_from_checkpoint(checkpoint.load_state(ckpt), rt.model)
    else:
        critic = initial_critic(cfg, rt.model, rt.model_path, log)
    budget = cfg.rollout.budget_tokens
    if budget <= 0 and cfg.rollout.budget_match:
        budget = matched_budget(rt, tasks, group_size, cfg.seed, sampled_per_task=1)
        log(f"budget: {budget} tokens ({len(tasks)} tasks x {group_size} x "
            f"{budget / max(1, len(tasks) * group_size):.1f} tokens per linear episode: a GRPO "
            "step on these tasks)")
    ctx = RolloutContext(rt.engine, rt.fmt, rt.spec, rt.params, group_size, cfg.rollout.max_tokens,
                         cfg.rollout.batch_size, budget,
                         torch.Generator().manual_seed(cfg.seed), algo=cfg.algo,
                         critic=critic)
    result = CONTROLLERS.get(cfg.algo.controller)(ctx, tasks)
    return result.episodes, result.extras["trees"], budget

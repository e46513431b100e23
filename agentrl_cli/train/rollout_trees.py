"""FOCUS trees for `agentrl rollout --method focus`, grown from the critic `agentrl train` would
start from (a checkpoint's own critic, else the recipe's initial critic): choosing that critic is
the trainer's business, so this lives in `train/`."""
from __future__ import annotations

from pathlib import Path

import torch

from ..config import RunConfig
from ..context import make_spec
from ..engines import build_engine, sampling_params
from ..models.critic import critic_from_checkpoint
from ..models.loading import load_policy, model_path
from ..rollout.controllers import CONTROLLERS, RolloutContext
from ..rollout.runner import run_episodes
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
    tasks: n x `group_size` x the mean generated tokens of one linear episode per task
    (sampled first, same seed), as `train` sets it from the base evaluation. Without either,
    each tree completes `group_size` paths (so with `group_size` 1 it cannot branch)."""
    group_size = cfg.rollout.group_size if group_size is None else group_size
    spec = make_spec(cfg)
    tasks = spec.tasks(split, n)
    model, _, fmt, _ = load_policy(cfg)
    ckpt = Path(cfg.model.name)
    if (ckpt / checkpoint.STATE_FILE).is_file():
        critic = critic_from_checkpoint(checkpoint.load_state(ckpt), model)
    else:
        critic = initial_critic(cfg, model, model_path(cfg), log)
    engine = build_engine(cfg, model, fmt)
    params = sampling_params(cfg)
    budget = cfg.rollout.budget_tokens
    if budget <= 0 and cfg.rollout.budget_match:
        lin = run_episodes(engine, fmt, spec, [(t, g) for g, t in enumerate(tasks)], params,
                           cfg.rollout.max_tokens, cfg.rollout.batch_size,
                           torch.Generator().manual_seed(cfg.seed))
        per_ep = sum(e.generated_tokens for e in lin) / max(1, len(lin))
        budget = max(1, round(len(tasks) * group_size * per_ep))
        log(f"budget: {budget} tokens ({len(tasks)} tasks x {group_size} x "
            f"{per_ep:.1f} tokens per linear episode: a GRPO step on these tasks)")
    ctx = RolloutContext(engine, fmt, spec, params, group_size, cfg.rollout.max_tokens,
                         cfg.rollout.batch_size, budget,
                         torch.Generator().manual_seed(cfg.seed), algo=cfg.algo,
                         critic=critic)
    result = CONTROLLERS.get(cfg.algo.controller)(ctx, tasks)
    return result.episodes, result.extras["trees"], budget

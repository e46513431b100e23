"""`agentrl rollout`'s library functions: episodes from the model or the env's expert, and FOCUS
trees when the method's controller is "focus"."""
from __future__ import annotations

import torch

from ..config import RunConfig
from ..types import Episode


def collect(cfg: RunConfig, n: int, policy: str = "model", split: str = "eval",
            group_size: int = 1) -> list[Episode]:
    from ..engines.hf import ENGINES, SamplingParams
    from ..models.loading import load_policy
    from ..train.loop import make_spec
    from .runner import run_episodes, run_expert

    spec = make_spec(cfg)
    n_tasks = -(-n // group_size)
    tasks = spec.tasks(split, n_tasks)
    pairs = [(t, g) for g, t in enumerate(tasks) for _ in range(group_size)][:n]
    if policy == "expert":
        return run_expert(expert_format(cfg, spec), spec, pairs, cfg.rollout.max_tokens,
                          seed=cfg.seed)
    model, _, fmt, _ = load_policy(cfg)
    engine = ENGINES.get(cfg.rollout.engine)(model, fmt.pad_id, next(model.parameters()).device)
    params = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens)
    return run_episodes(engine, fmt, spec, pairs, params, cfg.rollout.max_tokens,
                        cfg.rollout.batch_size, torch.Generator().manual_seed(cfg.seed))


def expert_format(cfg: RunConfig, spec):
    """The chat format an expert rollout records its token ids with (the expert needs no
    model). `tiny` is built for the built-in envs; on a real benchmark's env (BFCL, a qa
    benchmark: see benchmarks.yaml) or an env without a train split, `tiny` means a byte-level
    tokenizer with the tiny chat template (one token per byte)."""
    from transformers import AutoTokenizer

    from ..config import ConfigError
    from ..envs.benchmarks import real_benchmark_envs
    from ..models.chat import ChatFormat
    from ..models.loading import model_path

    if cfg.model.name == "tiny":
        bytes_only = cfg.env.name in real_benchmark_envs()
        if not bytes_only:
            try:
                spec.tasks("train", 1)
            except ConfigError:
                bytes_only = True
        if bytes_only:
            from ..models.tiny import train_tokenizer

            return ChatFormat.from_tokenizer(train_tokenizer([], vocab_size=0))
    return ChatFormat.from_tokenizer(AutoTokenizer.from_pretrained(model_path(cfg)))


def collect_trees(cfg: RunConfig, n: int, split: str = "eval", group_size: int = 1):
    """FOCUS tree rollouts on ceil(n / group_size) tasks (n paths, as many episodes as a linear
    rollout) -> (episodes, trees). Node values come from the checkpoint's critic (a value head
    or a separate critic model) when `cfg.model.name` is a checkpoint folder that has one, else
    v = 0.5 everywhere."""
    from pathlib import Path

    from ..engines.hf import ENGINES, SamplingParams
    from ..models.critic import critic_from_checkpoint
    from ..models.loading import load_policy
    from ..train import checkpoint
    from ..train.loop import make_spec
    from .controllers import CONTROLLERS, RolloutContext

    spec = make_spec(cfg)
    tasks = spec.tasks(split, -(-n // group_size))
    model, _, fmt, _ = load_policy(cfg)
    ckpt = Path(cfg.model.name)
    critic = (critic_from_checkpoint(checkpoint.load_state(ckpt), model)
              if (ckpt / checkpoint.STATE_FILE).is_file() else None)
    engine = ENGINES.get(cfg.rollout.engine)(model, fmt.pad_id, next(model.parameters()).device)
    params = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens)
    ctx = RolloutContext(engine, fmt, spec, params, group_size, cfg.rollout.max_tokens,
                         cfg.rollout.batch_size, cfg.rollout.budget_tokens,
                         torch.Generator().manual_seed(cfg.seed), algo=cfg.algo,
                         critic=critic)
    result = CONTROLLERS.get(cfg.algo.controller)(ctx, tasks)
    return result.episodes, result.extras["trees"]

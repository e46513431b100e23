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

    from ..errors import ConfigError
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


def collect_trees(cfg: RunConfig, n: int, split: str = "eval", group_size: int = 1,
                  log=print):
    """FOCUS tree rollouts on ceil(n / group_size) tasks -> (episodes, trees, budget).

    The critic is the one `agentrl train` would use: a checkpoint's own (value head or separate
    critic model) when `cfg.model.name` is a checkpoint folder, else the recipe's initial
    critic (`train.loop.initial_critic`: for FOCUS on the tiny build, its fitted value head).
    The budget is `rollout.budget_tokens`; when that is 0 and the recipe matches budgets
    (`rollout.budget_match`, FOCUS's default), it is what a GRPO step would generate on these
    tasks: tasks x `rollout.group_size` x the mean generated tokens of one linear episode per
    task (sampled first, same seed), as `train` sets it from the base evaluation. Without
    either, the step completes `n` paths (so with `group_size` 1 it cannot branch)."""
    from pathlib import Path

    from ..engines.hf import ENGINES, SamplingParams
    from ..models.critic import critic_from_checkpoint
    from ..models.loading import load_policy, model_path
    from ..train import checkpoint
    from ..train.loop import initial_critic, make_spec
    from .controllers import CONTROLLERS, RolloutContext
    from .runner import run_episodes

    spec = make_spec(cfg)
    tasks = spec.tasks(split, -(-n // group_size))
    model, _, fmt, _ = load_policy(cfg)
    ckpt = Path(cfg.model.name)
    if (ckpt / checkpoint.STATE_FILE).is_file():
        critic = critic_from_checkpoint(checkpoint.load_state(ckpt), model)
    else:
        critic = initial_critic(cfg, model, model_path(cfg, log), log)
    engine = ENGINES.get(cfg.rollout.engine)(model, fmt.pad_id, next(model.parameters()).device)
    params = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens)
    budget = cfg.rollout.budget_tokens
    if budget <= 0 and cfg.rollout.budget_match:
        lin = run_episodes(engine, fmt, spec, [(t, g) for g, t in enumerate(tasks)], params,
                           cfg.rollout.max_tokens, cfg.rollout.batch_size,
                           torch.Generator().manual_seed(cfg.seed))
        per_ep = sum(e.generated_tokens for e in lin) / max(1, len(lin))
        budget = max(1, round(len(tasks) * cfg.rollout.group_size * per_ep))
        log(f"budget: {budget} tokens ({len(tasks)} tasks x {cfg.rollout.group_size} x "
            f"{per_ep:.1f} tokens per linear episode: a GRPO step on these tasks)")
    ctx = RolloutContext(engine, fmt, spec, params, group_size, cfg.rollout.max_tokens,
                         cfg.rollout.batch_size, budget,
                         torch.Generator().manual_seed(cfg.seed), algo=cfg.algo,
                         critic=critic)
    result = CONTROLLERS.get(cfg.algo.controller)(ctx, tasks)
    return result.episodes, result.extras["trees"], budget


def tree_rows(trees, episodes: list[Episode]) -> list[dict]:
    """JSONL rows of FOCUS trees: the task's question and gold answer first, the nodes (leaves
    with the model's final answer on their path), then the paths' episodes by path id."""
    rows = []
    for tree in trees:
        row = tree.to_json()
        first = episodes[int(next(iter(row["paths"])))] if row["paths"] else None
        for nd in row["nodes"]:
            if nd["reward"] is not None:
                nd["model_answer"] = episodes[nd["path"]].model_answer
        rows.append({"task_id": row.pop("task_id"),
                     "question": first.question if first else None,
                     "gold_answer": first.answer if first else None, **row,
                     "episodes": {k: episodes[int(k)].to_json() for k in row["paths"]}})
    return rows

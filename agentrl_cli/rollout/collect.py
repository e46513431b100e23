"""`agentrl rollout`'s library function: episodes from the model or the env's expert."""
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
        from ..models.chat import ChatFormat
        from ..models.loading import model_path
        from transformers import AutoTokenizer

        fmt = ChatFormat.from_tokenizer(AutoTokenizer.from_pretrained(model_path(cfg)))
        return run_expert(fmt, spec, pairs, cfg.rollout.max_tokens, seed=cfg.seed)
    model, _, fmt, _ = load_policy(cfg)
    engine = ENGINES.get(cfg.rollout.engine)(model, fmt.pad_id, next(model.parameters()).device)
    params = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens)
    return run_episodes(engine, fmt, spec, pairs, params, cfg.rollout.max_tokens,
                        cfg.rollout.batch_size, torch.Generator().manual_seed(cfg.seed))

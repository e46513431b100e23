"""`agentrl rollout`'s library functions: episodes from the model or the env's expert, and the
JSONL rows of FOCUS trees (the trees themselves come from `train.collect.collect_trees`: they
start from the trainer's critic)."""
from __future__ import annotations

import sys

import torch

from ..config import RunConfig
from ..types import Episode


def collect(cfg: RunConfig, n: int, policy: str = "model", split: str = "eval",
            group_size: int = 1, log=lambda s: None) -> list[Episode]:
    from ..context import make_spec
    from .runner import run_episodes, run_expert
    from .runtime import build_runtime

    def pairs(spec):
        tasks = spec.tasks(split, -(-n // group_size))
        return [(t, g) for g, t in enumerate(tasks) for _ in range(group_size)][:n]

    if policy == "expert":                # no model: the env spec alone
        spec = make_spec(cfg)
        fmt, byte_level = expert_format(cfg, spec, log)
        # rollout.max_tokens is a model's context; byte-level ids have no model behind them,
        # and counting bytes against it would cut the expert's episodes short
        limit = sys.maxsize if byte_level else cfg.rollout.max_tokens
        return run_expert(fmt, spec, pairs(spec), limit, seed=cfg.seed)
    rt = build_runtime(cfg)
    return run_episodes(rt.engine, rt.fmt, rt.spec, pairs(rt.spec), rt.params,
                        cfg.rollout.max_tokens, cfg.rollout.batch_size,
                        torch.Generator().manual_seed(cfg.seed))


def expert_format(cfg: RunConfig, spec, log=lambda s: None):
    """(the chat format an expert rollout records its token ids with, whether it is the
    byte-level fallback). The expert needs no model, so none is built for it. With `tiny`: the
    tiny agent's tokenizer when that agent is already built (shipped, or in the cache), else a
    byte-level tokenizer with the tiny chat template (one token per byte), said in one line;
    its episodes end at `env.max_turns` only (no model context to fit)."""
    from ..models.chat import ChatFormat
    from ..models.loading import chat_format, model_path, tiny_recipe
    from ..models.tiny import is_built, tiny_path

    if cfg.model.name == "tiny" and not is_built(tiny_path(tiny_recipe(cfg))):
        from ..models.tiny import train_tokenizer

        log(f"no tiny agent is built for env '{cfg.env.name}': the expert's episodes record "
            "byte-level token ids (no model is built for an expert rollout; episodes end at "
            "env.max_turns, not rollout.max_tokens)")
        return ChatFormat.from_tokenizer(train_tokenizer([], vocab_size=0)), True
    return chat_format(cfg, model_path(cfg))[1], False   # model.chat_template and its checks apply


def tree_rows(trees, episodes: list[Episode], values: list | None = None) -> list[dict]:
    """JSONL rows of FOCUS trees: the task's question and gold answer first, the nodes (leaves
    with the model's final answer on their path; `values`: each tree's refined values, from
    `credit.focus_credit.tree_values`), then the paths' episodes by path id."""
    rows = []
    for k, tree in enumerate(trees):
        row = tree.to_json(values[k] if values is not None else None)
        first = episodes[int(next(iter(row["paths"])))] if row["paths"] else None
        for nd in row["nodes"]:
            if nd["reward"] is not None:
                nd["model_answer"] = episodes[nd["path"]].model_answer
        rows.append({"task_id": row.pop("task_id"),
                     "question": first.question if first else None,
                     "gold_answer": first.answer if first else None, **row,
                     "episodes": {k: episodes[int(k)].to_json() for k in row["paths"]}})
    return rows

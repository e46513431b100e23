"""What `agentrl rollout` collects (`collect_rollout`, the command's library function): plain
episodes of the model or of the env's scripted expert (`collect`), or, for a
method whose controller grows search trees (`controllers.Controller.trees`), its trees
(`collect_trees`), grown from the critic `agentrl train` would start from (a checkpoint's own
critic, else the recipe's initial critic, as the trainer chooses it: `train.learner`). The
JSONL file is written atomically (`write_rollout`, trees as `tree_rows`)."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..config import RunConfig
from ..errors import ConfigError
from ..types import Episode
from ..context import make_spec
from ..credit.focus_credit import tree_values
from ..envs.base import has_expert, make_env_spec
from ..models.chat import ChatFormat
from ..models.loading import chat_format, model_path, tiny_recipe
from ..models.tiny import is_built, tiny_path, train_tokenizer
from ..rollout.controllers import CONTROLLERS, rollout_context
from ..rollout.matched_budget import matched_budget, resolve_budget
from ..rollout.runner import run_episodes, run_expert
from ..rollout.runtime import build_runtime
from ..train import checkpoint
from ..train.checkpoint import find
from ..train.learner import initial_critic
from ..train.run_folder import check_output_file
from .preflight import check_rollout_memory, load_config
from .request import RunRequest
from .tiny_build import ensure_model


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
    ckpt = Path(cfg.model.name)
    if (ckpt / checkpoint.STATE_FILE).is_file():      # a checkpoint's own critic
        opened = checkpoint.open_checkpoint(ckpt, cfg, verified=True)
        rt, critic = opened.runtime, opened.critic
    else:
        rt = build_runtime(cfg)
        critic = initial_critic(cfg, rt.model, rt.model_path, log)
    tasks = rt.spec.tasks(split, n)

    def measure() -> int:
        budget = matched_budget(rt, tasks, group_size, cfg.seed, sampled_per_task=1)
        log(f"budget: {budget} tokens ({len(tasks)} tasks x {group_size} x "
            f"{budget / max(1, len(tasks) * group_size):.1f} tokens per linear episode: a GRPO "
            "step on these tasks)")
        return budget

    budget = resolve_budget(cfg.rollout.budget_tokens, cfg.rollout.budget_match, None, measure)
    ctx = rollout_context(rt, torch.Generator().manual_seed(cfg.seed), budget=budget,
                          group_size=group_size, critic=critic)
    result = CONTROLLERS.get(cfg.algo.controller).run(ctx, tasks)
    return result.episodes, result.trees, budget


@dataclass(kw_only=True)
class RolloutRequest(RunRequest):
    """What `agentrl rollout` was asked beyond a run's config (None: not given)."""

    out: Path
    n: int
    policy: str = "model"                 # model | expert
    split: str = "eval"
    group_size: int | None = None
    checkpoint: Path | None = None
    overwrite: bool = False


@dataclass
class Collected:
    cfg: RunConfig
    episodes: list
    trees: list | None = None             # a tree method's trees (None: plain episodes)
    budget: int | None = None             # the trees' token budget


def _checked(req: RolloutRequest, log: Callable[[str], None]) -> tuple[RunConfig, bool]:
    """The request's config and whether it grows trees, every check before any model loads:
    the policy, the output file, the expert, the split (building `tiny` where needed), the
    prompts and rows in flight."""
    if req.policy not in ("model", "expert"):
        raise ConfigError(f"--policy must be model or expert, got '{req.policy}'")
    check_output_file(req.out)
    if req.out.exists() and not req.overwrite:
        raise ConfigError(f"--out {req.out} exists: pass --overwrite to replace it, or give "
                          "another file")
    model = req.model
    if req.checkpoint is not None:
        model = str(find(req.checkpoint, log=log))
    cfg = load_config(req.config, req.sets, benchmark=req.benchmark, method=req.method,
                      env=req.env, model=model, engine=req.engine, seed=req.seed)
    if req.policy == "expert":
        if not has_expert(make_env_spec(cfg.env)):
            raise ConfigError(f"env '{cfg.env.name}' has no scripted expert (spec.expert): "
                              "--policy expert needs one; roll out a model with --policy model")
    _build_model(cfg, req.policy, req.split)
    # trees only when asked for by name: the default recipe (focus) must not turn a plain
    # `agentrl rollout` into tree search
    trees = (req.policy == "model" and req.method is not None
             and CONTROLLERS.get(cfg.algo.controller).trees)
    if req.policy == "model":             # prompts within max_tokens, rows x context in memory
        rows = 2 * cfg.rollout.batch_size if trees else min(req.n, cfg.rollout.batch_size)
        check_rollout_memory(cfg, rows, req.split, req.n if trees else -(-req.n // (req.group_size or 1)))
    return cfg, trees


def _build_model(cfg: RunConfig, policy: str, split: str) -> None:
    """Build `tiny` where the rollout needs its folder: the policy's. An expert rollout needs
    no model and builds none (`expert_format`). An unknown split is reported
    first, before any work."""
    if cfg.model.name != "tiny":
        return
    make_spec(cfg).tasks(split, 1)
    if policy != "expert":
        ensure_model(cfg)


def write_rollout(out: Path, episodes: list, trees: list | None, algo=None) -> None:
    """The JSONL file, atomically: one episode per line, or one tree per line (its paths'
    episodes included, and its refined values as `algo` gives them: `tree_rows`,
    `credit.focus_credit.tree_values`)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with tmp.open("w") as f:
        if trees is not None:
            values = [tree_values(t.arrays(), algo) for t in trees] if algo is not None else None
            rows = tree_rows(trees, episodes, values)
        else:
            rows = [e.to_json() for e in episodes]
        for row in rows:
            f.write(json.dumps(row) + "\n")
    tmp.replace(out)


def collect_rollout(req: RolloutRequest, log: Callable[[str], None] = print) -> Collected:
    """`agentrl rollout`: check everything (`_checked`), collect the episodes or trees, write
    the file."""

    cfg, trees = _checked(req, log)
    if trees:
        eps, grown, budget = collect_trees(cfg, n=req.n, split=req.split,
                                           group_size=req.group_size, log=log)
        res = Collected(cfg, eps, grown, budget)
    else:
        res = Collected(cfg, collect(cfg, n=req.n, policy=req.policy, split=req.split,
                                     group_size=req.group_size or 1, log=log))
    write_rollout(req.out, res.episodes, res.trees, cfg.algo)
    return res


def collect(cfg: RunConfig, n: int, policy: str = "model", split: str = "eval",
            group_size: int = 1, log=lambda s: None) -> list[Episode]:
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
    if cfg.model.name == "tiny" and not is_built(tiny_path(tiny_recipe(cfg))):
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

"""How long the episodes of a benchmark are (`agentrl diagnose episode-stats`): held-out
success and tool calls per episode and per solved episode, for the configured model (the tiny
build by default) and the scripted expert.

The model's row is the trainer's base evaluation, the same tasks, samples and seed as step 0
of `agentrl train` (`train.eval_tasks` questions x `train.eval_samples` samples, temperature
`rollout.temperature`, seed `step_seed(seed, 0, salt=3)`). Tool calls are the repository's
`rollout/tool_calls` count: every parsed call except the final answer (search + open per hop
on `search`). The expert's rows are its demonstrations: perfect (`error_rate` 0) and the
imperfect demonstrator the tiny model warmed up on (the recipe's `error_rate`)."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from ...app.tiny_build import load_policy
from ...config import step_seed
from ...context import make_spec
from ...engines import ENGINES, SamplingParams
from ...models.loading import tiny_recipe
from ...rollout.runner import run_episodes, run_expert


def episode_stats(eps) -> dict:
    solved = [e for e in eps if e.success]
    return {
        "episodes": len(eps),
        "success": sum(e.success for e in eps) / len(eps),
        "tool_calls_per_episode": statistics.mean(e.num_tool_calls for e in eps),
        "tool_calls_per_solved": statistics.mean(e.num_tool_calls for e in solved) if solved else None,
        "min_tool_calls_solved": min(e.num_tool_calls for e in solved) if solved else None,
        "turns_per_episode": statistics.mean(len(e.turns) for e in eps),
        "tokens_per_episode": statistics.mean(len(e.token_ids) for e in eps),
        "max_tokens_per_episode": max(len(e.token_ids) for e in eps),
    }


def _model_row(cfg, model, fmt, spec, tasks) -> tuple[dict, int]:
    """The base evaluation's episodes (`evaluation.runner.evaluate`'s pairs, order and
    generator seed) as a row, and that seed."""
    engine = ENGINES.get(cfg.rollout.engine)(model, fmt.pad_id, next(model.parameters()).device)
    params = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens)
    seed = step_seed(cfg.seed, 0, salt=3)
    pairs = [(t, i) for i, t in enumerate(tasks) for _ in range(cfg.train.eval_samples)]
    eps = run_episodes(engine, fmt, spec, pairs, params, cfg.rollout.max_tokens,
                       cfg.rollout.batch_size, torch.Generator().manual_seed(seed))
    row = episode_stats(eps)
    row["tokens_per_question"] = statistics.mean(e.generated_tokens for e in eps)
    return row, seed


def _build_info(path: str) -> dict:
    """The tiny build's key, build time, warm-up steps and build check (its recipe.json)."""
    info = Path(path) / "recipe.json"
    if not info.is_file():
        return {}
    meta = json.loads(info.read_text())
    return {"key": meta.get("key"), "build_seconds": meta.get("build_seconds"),
            "warmup_steps": meta.get("warmup_steps"), "build_check": meta.get("base_success")}


def stats(cfg, benchmark: str) -> dict:
    """The model's base evaluation and the expert's demonstrations on `cfg`'s held-out tasks."""
    t0 = time.time()
    model, _, fmt, path = load_policy(cfg)
    load_s = time.time() - t0
    spec = make_spec(cfg)
    tasks = spec.tasks("eval", cfg.train.eval_tasks)
    t1 = time.time()
    model_row, seed = _model_row(cfg, model, fmt, spec, tasks)
    eval_s = time.time() - t1
    recipe = tiny_recipe(cfg) if cfg.model.name == "tiny" else None
    err = recipe.error_rate if recipe is not None else 0.15
    once = [(t, i) for i, t in enumerate(tasks)]
    expert = episode_stats(run_expert(fmt, spec, once, cfg.rollout.max_tokens, seed=0))
    demo = episode_stats(run_expert(fmt, spec, once * 20, cfg.rollout.max_tokens, seed=0, error_rate=err))
    return {"benchmark": benchmark, "model": path, "build": _build_info(path),
            "env": {k: getattr(cfg.env, k) for k in ("min_hops", "max_hops", "max_turns")},
            "max_tokens": cfg.rollout.max_tokens,
            "eval": f"{len(tasks)} tasks x {cfg.train.eval_samples} samples, seed {seed}",
            "model_row": model_row, "expert": expert, f"demonstrator_e{err}": demo,
            "seconds": {"load": round(load_s, 1), "eval": round(eval_s, 1)}}

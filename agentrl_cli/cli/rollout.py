"""agentrl rollout"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from .options import (BenchmarkOpt, ConfigOpt, EngineOpt, EnvOpt, MethodOpt, ModelOpt, SeedOpt,
                      SetOpt, load_config, user_errors)


@user_errors
def rollout_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="JSONL file to write: one episode per line; with --method naming a tree method (focus), one tree per line.")] = Path("episodes.jsonl"),
    n: Annotated[int, typer.Option("--n", help="Number of episodes (on ceil(n / group-size) tasks). With --method naming a tree method (focus): number of trees, one per task.", min=1)] = 64,
    policy: Annotated[str, typer.Option("--policy", help="model (the policy) or expert (the env's scripted expert).")] = "model",
    split: Annotated[str, typer.Option("--split", help="Task split: train or eval.")] = "eval",
    group_size: Annotated[Optional[int], typer.Option("--group-size", "-g", help="Episodes per task (default 1). With a tree method: the episodes per task of the GRPO step each tree's token budget matches (default rollout.group_size, as in training).", min=1)] = None,
    checkpoint: Annotated[Optional[Path], typer.Option("--checkpoint", help="Checkpoint (or run) folder to load the policy from.")] = None,
    method: MethodOpt = None,
    env: EnvOpt = None,
    benchmark: BenchmarkOpt = None,
    model: ModelOpt = None,
    engine: EngineOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    seed: SeedOpt = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the --out file if it exists.")] = False,
):
    """Roll out episodes and write them as JSONL. Plain (linear) episodes unless --method names a tree method (focus: one search tree per task). Example: agentrl rollout --env search --n 64 --out eps.jsonl"""
    from ..rollout.collect import collect

    from ..errors import ConfigError
    from ..train.run_folder import check_output_file

    if policy not in ("model", "expert"):
        raise ConfigError(f"--policy must be model or expert, got '{policy}'")
    check_output_file(out)
    if out.exists() and not overwrite:
        raise ConfigError(f"--out {out} exists: pass --overwrite to replace it, or give another file")
    if checkpoint is not None:
        from ..train.checkpoint import find
        model = str(find(checkpoint, log=lambda s: Console(stderr=True).print(s, highlight=False)))
    cfg = load_config(config, set_, benchmark=benchmark, method=method, env=env, model=model,
                      engine=engine, seed=seed)
    if policy == "expert":
        from ..envs.base import has_expert, make_env_spec

        if not has_expert(make_env_spec(cfg.env)):
            raise ConfigError(f"env '{cfg.env.name}' has no scripted expert (spec.expert): "
                              "--policy expert needs one; roll out a model with --policy model")
    _build_model(cfg, policy, split)
    tree = policy == "model" and method is not None and cfg.algo.controller == "focus"
    if policy == "model":                 # prompts within max_tokens, rows x context in memory
        from ..train.preflight import check_rollout_memory
        check_rollout_memory(cfg, 2 * cfg.rollout.batch_size if tree else min(n, cfg.rollout.batch_size),
                             split, n if tree else -(-n // (group_size or 1)))
    trees = budget = None
    # trees only when asked for by name: the default recipe (focus) must not turn a plain
    # `agentrl rollout` into tree search
    if policy == "model" and method is not None and cfg.algo.controller == "focus":
        from ..train.rollout_trees import collect_trees
        eps, trees, budget = collect_trees(cfg, n=n, split=split, group_size=group_size,
                                           log=lambda m: Console().print(m, highlight=False))
    else:
        eps = collect(cfg, n=n, policy=policy, split=split, group_size=group_size or 1)
    _write(out, eps, trees)
    _report(cfg, policy, out, eps, trees, budget)


def _write(out: Path, eps, trees) -> None:
    """The JSONL file, atomically: one episode per line, or one FOCUS tree per line."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with tmp.open("w") as f:
        if trees is not None:  # FOCUS: one tree per line, its paths' episodes included
            from ..rollout.collect import tree_rows

            for row in tree_rows(trees, eps):
                f.write(json.dumps(row) + "\n")
        else:
            for e in eps:
                f.write(json.dumps(e.to_json()) + "\n")
    tmp.replace(out)


def _report(cfg, policy: str, out: Path, eps, trees, budget) -> None:
    """The summary table (and where a tree's continuations went)."""
    what = f"{len(eps)} episodes in {len(trees)} trees" if trees is not None else f"{len(eps)} episodes"
    t = Table(title=f"{what} ({policy}) on {cfg.env.name}")
    for c in ("success", "reward", "turns", "tool calls", "generated tokens"):
        t.add_column(c)
    m = len(eps)
    t.add_row(f"{sum(e.success for e in eps) / m:.3f}", f"{sum(e.reward for e in eps) / m:.3f}",
              f"{sum(e.num_turns for e in eps) / m:.2f}", f"{sum(e.num_tool_calls for e in eps) / m:.2f}",
              f"{sum(e.generated_tokens for e in eps) / m:.1f}")
    Console().print(t)
    if trees is not None:
        from collections import Counter

        launched = Counter(nd.depth for tr in trees for nd in tr.nodes for _ in range(nd.launched))
        total = sum(launched.values())
        by_depth = ", ".join(f"depth {d}: {launched[d]}" for d in sorted(launched)) or "none"
        Console().print(f"{total} continuations launched ({by_depth}); budget "
                        f"{budget or 'none'}; generated {sum(e.generated_tokens for e in eps)} tokens",
                        highlight=False)
    Console().print(f"wrote {out}", highlight=False)


def _build_model(cfg, policy: str, split: str) -> None:
    """Build `tiny` where the rollout needs its folder: the policy's, or the tokenizer an expert
    rollout records with. On a real benchmark's env, or an env without a train split, an
    expert rollout with `tiny` records bytes instead (`rollout.collect.expert_format`). An
    unknown split is reported first, before any work."""
    from ..context import make_spec
    from ..envs.benchmarks import real_benchmark_envs
    from ..errors import ConfigError
    from ..train.tiny_build import ensure_model

    if cfg.model.name != "tiny" or policy == "expert" and cfg.env.name in real_benchmark_envs():
        return
    spec = make_spec(cfg)
    spec.tasks(split, 1)
    if policy == "expert":
        try:
            spec.tasks("train", 1)
        except ConfigError:
            return
    ensure_model(cfg)

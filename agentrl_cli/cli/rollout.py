"""agentrl rollout"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from .options import RunOptions, run_options, user_errors


@user_errors(interrupted="interrupted: the --out file was not written (agentrl rollout writes it "
                         "whole at the end; an existing one is left as it was); run the command "
                         "again")
@run_options
def rollout_cmd(
    *,
    out: Annotated[Path, typer.Option("--out", "-o", help="JSONL file to write: one episode per line; with --method naming a tree method (focus), one tree per line.")] = Path("episodes.jsonl"),
    n: Annotated[int, typer.Option("--n", help="Number of episodes (on ceil(n / group-size) tasks). With --method naming a tree method (focus): number of trees, one per task.", min=1)] = 64,
    policy: Annotated[str, typer.Option("--policy", help="model (the policy) or expert (the env's scripted expert).")] = "model",
    split: Annotated[str, typer.Option("--split", help="Task split: train or eval.")] = "eval",
    group_size: Annotated[Optional[int], typer.Option("--group-size", "-g", help="Episodes per task (default 1). With a tree method: the episodes per task of the GRPO step each tree's token budget matches (default rollout.group_size, as in training).", min=1)] = None,
    checkpoint: Annotated[Optional[Path], typer.Option("--checkpoint", help="Checkpoint (or run) folder to load the policy from.")] = None,
    run: RunOptions,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the --out file if it exists.")] = False,
):
    """Roll out episodes and write them as JSONL. Plain (linear) episodes unless --method names a tree method (focus: one search tree per task). Example: agentrl rollout --env search --n 64 --out eps.jsonl"""
    # deferred: CLI start-up
    from ..app.rollout import RolloutRequest, collect_rollout

    say = lambda m: Console().print(m, highlight=False)  # noqa: E731
    req = RolloutRequest(**run, out=out, n=n, policy=policy, split=split, group_size=group_size,
                         checkpoint=checkpoint, overwrite=overwrite)
    res = collect_rollout(req, log=say)
    _report(res.cfg, policy, out, res.episodes, res.trees, res.budget)


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
        launched = Counter(nd.depth for tr in trees for nd in tr.nodes for _ in range(nd.launched))
        total = sum(launched.values())
        by_depth = ", ".join(f"depth {d}: {launched[d]}" for d in sorted(launched)) or "none"
        Console().print(f"{total} continuations launched ({by_depth}); budget "
                        f"{budget or 'none'}; generated {sum(e.generated_tokens for e in eps)} tokens",
                        highlight=False)
    Console().print(f"wrote {out}", highlight=False)

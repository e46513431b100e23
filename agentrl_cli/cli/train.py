"""agentrl train"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from .options import RunOptions, run_options, user_errors


@user_errors(interrupted="interrupted: continue the run from its last checkpoint with "
                         "agentrl train --resume <run folder>")
@run_options
def train_cmd(
    *,
    run: RunOptions,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Run folder (default runs/<time>-<method>-<env>).")] = None,
    resume: Annotated[Optional[Path], typer.Option("--resume", help="Continue a run folder (or checkpoint) exactly where it stopped, from its newest checkpoint that verifies. It may change only train.steps, train.eval_every, train.save_every, train.trace_every, train.log, rollout.workers and rollout.ray_address (recorded in the folder's .agentrl-run.json).")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Start afresh in an --out folder that already holds a run: removes exactly the files the run recorded in its .agentrl-run.json (refused, nothing removed, if its folders hold files it did not write).")] = False,
    allow_env_change: Annotated[bool, typer.Option("--allow-env-change", help="With --resume: go on although the run's env file (--env file.py:factory or module:factory) changed since the run recorded its sha256; the change is recorded in the run folder (env-changes.log).")] = False,
    steps: Annotated[Optional[int], typer.Option("--steps", help="Shortcut for --set train.steps=N.")] = None,
    rollout_workers: Annotated[Optional[int], typer.Option("--rollout-workers", help="Ray rollout workers, each with its own engine and envs (--set rollout.workers=N; 0: in process).")] = None,
    ray_address: Annotated[Optional[str], typer.Option("--ray-address", help="Join this Ray cluster instead of starting a local one (--set rollout.ray_address=...).")] = None,
    reward: Annotated[Optional[list[str]], typer.Option("--reward", help="A reward function of the episode, [NAME=]FILE.py:fn[:WEIGHT] or module:fn[:WEIGHT] (repeatable; --set algo.rewards=[...]): added to the env's reward (--set algo.reward_mode=replace: instead of it), logged as reward/NAME (docs/rewards.md).")] = None,
):
    """Train an agent. Example: agentrl train --method focus --seed 0 --set train.steps=40"""
    # deferred: CLI start-up
    from ..reporting.live import TrainProgress, summary_table
    from ..app.train import TrainRequest, launch

    sets = run.pop("sets") + ([f"train.steps={steps}"] if steps is not None else [])
    sets += [f"rollout.workers={rollout_workers}"] if rollout_workers is not None else []
    sets += [f"rollout.ray_address={ray_address}"] if ray_address is not None else []
    sets += [f"algo.rewards={list(reward)!r}"] if reward else []
    console = Console(quiet=int(os.environ.get("RANK", "0")) > 0)  # torchrun: rank 0 speaks
    say = lambda s: console.print(s, highlight=False)  # noqa: E731
    req = TrainRequest(**run, sets=sets, out=out, resume=resume, overwrite=overwrite,
                       allow_env_change=allow_env_change)
    folder, summary = launch(req, log=say, progress=TrainProgress(console), announce=lambda cfg, run: say(
        f"[bold]agentrl train[/] method={cfg.method} env={cfg.env.name} model={cfg.model.name} "
        f"seed={cfg.seed} -> {run}"))
    if summary is None:                   # a resumed run that already ran its steps
        return
    console.print(summary_table(summary))
    say(f"summary: {folder / 'summary.json'} · curve: {folder / 'learning_curve.png'}")
    say(f"see what the agent did: agentrl view {folder}")

"""agentrl train"""
from __future__ import annotations

import dataclasses
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from .options import (BenchmarkOpt, ConfigOpt, EngineOpt, EnvOpt, MethodOpt, ModelOpt, SeedOpt,
                      SetOpt, default_out, load_config, user_errors)


@user_errors
def train_cmd(
    method: MethodOpt = None,
    env: EnvOpt = None,
    benchmark: BenchmarkOpt = None,
    model: ModelOpt = None,
    engine: EngineOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    seed: SeedOpt = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Run folder (default runs/<time>-<method>-<env>).")] = None,
    resume: Annotated[Optional[Path], typer.Option("--resume", help="Continue a run folder (or checkpoint) exactly where it stopped, from its newest checkpoint that verifies. It may change only train.steps, train.eval_every, train.save_every, train.trace_every, train.log, rollout.workers and rollout.ray_address (recorded in the folder's .agentrl-run.json).")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Start afresh in an --out folder that already holds a run (its run files are removed).")] = False,
    steps: Annotated[Optional[int], typer.Option("--steps", help="Shortcut for --set train.steps=N.")] = None,
    rollout_workers: Annotated[Optional[int], typer.Option("--rollout-workers", help="Ray rollout workers, each with its own engine and envs (--set rollout.workers=N; 0: in process).")] = None,
    ray_address: Annotated[Optional[str], typer.Option("--ray-address", help="Join this Ray cluster instead of starting a local one (--set rollout.ray_address=...).")] = None,
):
    """Train an agent. Example: agentrl train --method focus --seed 0 --set train.steps=40"""
    from ..config import load_saved
    from ..reporting.live import TrainProgress, summary_table
    from ..train.loop import train

    sets = list(set_ or []) + ([f"train.steps={steps}"] if steps is not None else [])
    sets += [f"rollout.workers={rollout_workers}"] if rollout_workers is not None else []
    sets += [f"rollout.ray_address={ray_address}"] if ray_address is not None else []
    record = None
    if resume is not None:
        from ..config import resume_changes
        from ..errors import ConfigError
        from ..train.checkpoint import is_checkpoint
        from ..train.preflight import load_saved_checked

        if out is not None or overwrite:
            raise ConfigError("--resume continues the run in its own folder: drop --out and "
                              "--overwrite")
        given = [opt for opt, v in (("--method", method), ("--env", env), ("--seed", seed),
                                    ("--config", config), ("--model", model),
                                    ("--benchmark", benchmark), ("--engine", engine))
                 if v is not None]
        if given:
            raise ConfigError(f"{given[0]} would change the resumed run: a resume continues with "
                              f"the run's own settings; drop {given[0]}, or start a new run with "
                              "--out")
        # the folder given, wherever it now is (a moved or copied run), not the saved `out`
        run_dir = resume.parent.parent if is_checkpoint(resume) else resume
        saved = load_saved(run_dir)
        cfg = dataclasses.replace(load_saved_checked(run_dir, sets), out=str(run_dir))
        record = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "changed": resume_changes(saved, cfg)}
        out_dir = run_dir
        if _finished(run_dir, cfg):
            Console().print(f"{run_dir} is finished ({cfg.train.steps} steps, summary.json): "
                            "nothing to resume; raise train.steps (--steps N) to continue it",
                            highlight=False)
            return
    else:
        cfg = load_config(config, sets, benchmark=benchmark, method=method, env=env, model=model,
                          engine=engine, seed=seed, out=out)
        from ..train.preflight import check_eval_tasks
        check_eval_tasks(cfg)
        out_dir = default_out(cfg)
        cfg = dataclasses.replace(cfg, out=str(out_dir))
    console = Console(quiet=int(os.environ.get("RANK", "0")) > 0)  # torchrun: rank 0 speaks

    def header() -> None:                 # once the run folder passed its checks
        if record is not None:            # under the run folder's lock
            from ..train.run_folder import record_resume
            record_resume(out_dir, record)
        console.print(f"[bold]agentrl train[/] method={cfg.method} env={cfg.env.name} "
                      f"model={cfg.model.name} seed={cfg.seed} -> {out_dir}", highlight=False)

    summary = train(cfg, out_dir, resume=str(resume) if resume else None,
                    log=lambda s: console.print(s, highlight=False), progress=TrainProgress(console),
                    overwrite=overwrite, ready=header)
    console.print(summary_table(summary))
    console.print(f"summary: {out_dir / 'summary.json'} · curve: {out_dir / 'learning_curve.png'}",
                  highlight=False)
    console.print(f"see what the agent did: agentrl view {out_dir}", highlight=False)


def _finished(run_dir: Path, cfg) -> bool:
    """Whether the run's summary.json says it already ran exactly `cfg.train.steps` steps (fewer
    is the trainer's one-line error: a run is not cut back)."""
    try:
        done = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))["steps"]
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return False
    return isinstance(done, int) and cfg.train.steps == done

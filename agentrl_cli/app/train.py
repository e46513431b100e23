"""`agentrl train`'s library function: from the command's options to a finished run.

A new run: its config (`preflight.load_config`), the held-out tasks checked, its folder
(`run_folder.default_out`). A resumed run (`--resume`): only options that cannot change it are
accepted (a `--method` or `--seed` equal to the run's own is accepted; `--env` only as the
run's own env or its file at a new place with the same sha256, `app.env_file`), the run's own
config plus the `--set`s a resume may change, and what changed is recorded in the run folder; a
run that already ran its steps is reported, not rerun. A user env's file and sha256 are
recorded with the run (`app.env_file`).
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from ..config import RunConfig, load_saved, resume_changes
from ..engines import check_engine
from ..errors import ConfigError
from ..rollout.runtime import Runtime, build_runtime
from ..train import loop
from ..train.checkpoint import is_checkpoint
from ..train.run_folder import default_out, record_resume
from .env_file import check_env, log_env_change, moved_env, record_env
from .request import RunRequest
from .preflight import (check_eval_tasks, check_names, check_run_memory, check_update_memory,
                        load_config)
from .tiny_build import ensure_model


def train(cfg: RunConfig, out: Path, resume: str | None = None,
          log: Callable[[str], None] = print, progress=None, overwrite: bool = False,
          ready: Callable[[], None] | None = None,
          on_step: Callable[[int, dict], object] | None = None) -> dict:
    """The trainer (`train.loop.train`, same arguments and summary) behind the checks every
    command runs before any work: plugin names and where they run, the engine (e.g. vllm
    without vLLM or CUDA), the prompts, rows in flight and the update's peak in memory (a
    default micro-batch may shrink). A `tiny` agent not built yet is built once the run
    folder has passed its checks, and its memory checked then."""
    check_names(cfg)
    check_engine(cfg.rollout.engine)
    unchecked = not resume and not check_run_memory(cfg)
    if not resume and not unchecked:
        cfg = check_update_memory(cfg, log=log)

    def prepare(c: RunConfig, say: Callable[[str], None]) -> RunConfig:
        ensure_model(c, say)
        if unchecked:                     # the `tiny` build now exists to read
            check_run_memory(c)
            c = check_update_memory(c, log=say)
        return c

    return loop.train(cfg, out, resume=resume, log=log, progress=progress, overwrite=overwrite,
                      ready=ready, on_step=on_step, prepare=prepare)


def initial_runtime(cfg: RunConfig, log: Callable[[str], None] = print) -> Runtime:
    """The runtime a run of `cfg` starts from, `tiny` built first (`agentrl ablate` measures
    its matched budget on it)."""
    ensure_model(cfg, log)
    return build_runtime(cfg, log)


@dataclass(kw_only=True)
class TrainRequest(RunRequest):
    """What `agentrl train` was asked beyond a run's config (None: not given); its shortcuts
    (--steps, --reward, ...) come as `sets`."""

    out: Path | None = None
    resume: Path | None = None
    overwrite: bool = False
    allow_env_change: bool = False        # a resume may go on with a changed env file
    run_config: RunConfig | None = None   # a config already loaded (`api.train`): used as given,
                                          # with `out` for its folder, instead of the options


def resumed(req: TrainRequest) -> tuple[RunConfig, Path, dict]:
    """A resumed run's (config, folder, what the resume changed): the folder given, wherever it
    now is (a moved or copied run), not the saved `out`."""
    if req.out is not None or req.overwrite:
        raise ConfigError("--resume continues the run in its own folder: drop --out and "
                          "--overwrite")
    run_dir = req.resume.parent.parent if is_checkpoint(req.resume) else req.resume
    saved = load_saved(run_dir)
    own = {"--method": saved.method, "--seed": saved.seed}
    given = [opt for opt, v in (("--method", req.method), ("--seed", req.seed),
                                ("--config", req.config), ("--model", req.model),
                                ("--benchmark", req.benchmark), ("--engine", req.engine))
             if v is not None and not (opt in own and own[opt] == v)]
    if given:
        raise ConfigError(f"{given[0]} would change the resumed run: a resume continues with "
                          f"the run's own settings; drop {given[0]}, or start a new run with "
                          "--out")
    cfg = dataclasses.replace(load_saved(run_dir, req.sets), out=str(run_dir))
    changed = resume_changes(saved, cfg)
    env = cfg.env.name if req.env is None else moved_env(cfg.env.name, req.env)
    env_change = check_env(run_dir, env, req.allow_env_change)   # before its file is imported
    if env != cfg.env.name:               # the run's env file, moved (same sha256)
        changed["env.name"] = [cfg.env.name, env]
        cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, name=env))
    cfg = check_names(cfg)                # plugin names (the env's file imports) and --set typos
    record = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "changed": changed}
    if env_change is not None:
        record["env_changed"] = env_change
    return cfg, run_dir, record


def finished(run_dir: Path, cfg: RunConfig) -> bool:
    """Whether the run's summary.json says it already ran exactly `cfg.train.steps` steps (fewer
    is the trainer's one-line error: a run is not cut back)."""
    try:
        done = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))["steps"]
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return False
    return isinstance(done, int) and cfg.train.steps == done


def launch(req: TrainRequest, log: Callable[[str], None] = print, progress=None,
           announce: Callable[[RunConfig, Path], None] | None = None,
           on_step: Callable[[int, dict], object] | None = None) -> tuple[Path, dict | None]:
    """Train as asked -> (the run folder, the run's summary: `train`), the summary
    None for a resumed run that already ran its steps (said in one line). `announce(cfg, out)` is called once the run
    folder passed its checks, before any model is loaded; `on_step(step, row)` after each
    step (`train`)."""
    record = None
    if req.resume is not None:
        cfg, out, record = resumed(req)
        if finished(out, cfg):
            log(f"{out} is finished ({cfg.train.steps} steps, summary.json): nothing to resume; "
                "raise train.steps (--steps N) to continue it")
            return out, None
    elif req.run_config is not None:
        cfg = dataclasses.replace(req.run_config, out=str(req.out or req.run_config.out))
        check_eval_tasks(cfg)
        out = default_out(cfg)
        cfg = dataclasses.replace(cfg, out=str(out))
    else:
        cfg = load_config(req.config, req.sets, benchmark=req.benchmark, method=req.method,
                          env=req.env, model=req.model, engine=req.engine, seed=req.seed,
                          out=req.out)
        check_eval_tasks(cfg)
        out = default_out(cfg)
        cfg = dataclasses.replace(cfg, out=str(out))

    def ready() -> None:                  # under the run folder's lock (rank 0's, torchrun)
        if int(os.environ.get("RANK", "0")) == 0:
            if record is not None:
                record_resume(out, record)
                if "env_changed" in record:
                    log_env_change(out, record["env_changed"], "train --resume")
            record_env(out, cfg.env.name)     # the env file's sha256 the run goes on with
        if announce is not None:
            announce(cfg, out)

    return out, train(cfg, out, resume=str(req.resume) if req.resume else None, log=log,
                      progress=progress, overwrite=req.overwrite, ready=ready, on_step=on_step)

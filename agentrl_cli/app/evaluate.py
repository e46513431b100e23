"""`agentrl eval`'s library function: a held-out evaluation of a model, or of a training run's
checkpoint with the run's own settings.

A checkpoint of a run (`<run>/checkpoints/step-N`) is evaluated with the run's config (env, its
sizes, sampling, held-out set) and that checkpoint's weights, unless `--env`, `--benchmark` or
`--config` say otherwise; at the trainer's own held-out check (same tasks, samples and seed) its
mean@1 is the run's `eval/success` at that step; a run's user env file must still have the
sha256 the run recorded (`app.env_file`), unless `--allow-env-change` (then the change is a
line of the run's env-changes.log). `--pass-k` and `--n` are at most `MAX_SAMPLES`. Everything
is checked before any model loads.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import RunConfig, step_seed
from ..errors import ConfigError
from ..evaluation.runner import run_eval
from ..train.checkpoint import find, open_checkpoint
from ..train.run_folder import atomic_write_text, check_output_file
from .env_file import check_env, log_env_change
from .preflight import check_eval_tasks, check_rollout_memory, load_config, load_saved_checked
from .request import RunRequest
from .tiny_build import ensure_model

MAX_SAMPLES = 1024                        # the most samples per task (--n) and largest --pass-k


@dataclass(kw_only=True)
class EvalRequest(RunRequest):
    """What `agentrl eval` was asked beyond a run's config (None: not given)."""

    pass_k: int | None = None
    n: int | None = None
    tasks: int | None = None
    checkpoint: Path | None = None
    json_path: Path | None = None
    greedy: bool = False
    allow_env_change: bool = False        # the run's env file may differ from what it recorded


@dataclass
class EvalPlan:
    """The evaluation a request gives, checked."""

    cfg: RunConfig
    label: str                            # what is evaluated (run/step-N, a folder, a model)
    tasks: int
    n: int                                # samples per task
    pass_k: int
    seed: int | None                      # sampling seed (None: cfg.seed)
    same: str = ""                        # "the trainer's held-out check at step N ..." or ""
    ckpt: Path | None = None


def run_of(ckpt: Path) -> Path | None:
    """The training run a checkpoint belongs to (`<run>/checkpoints/step-N`), if it has its config."""
    run = ckpt.parent.parent
    return run if ckpt.parent.name == "checkpoints" and (run / "config.json").is_file() else None


def _config(req: EvalRequest) -> tuple[RunConfig, Path | None, Path | None]:
    """(config, checkpoint, its run folder when the run's own settings apply)."""
    ckpt = run = None
    model = req.model
    if req.checkpoint is not None:
        ckpt = find(req.checkpoint)
        model, run = str(ckpt), run_of(ckpt)
    if run is not None and req.env is None and req.benchmark is None and req.config is None:
        sets = [*req.sets, f"model.name={ckpt}"]
        if req.engine is not None:
            sets.append(f"rollout.engine={req.engine}")
        if req.seed is not None:
            sets.append(f"seed={req.seed}")
        cfg = load_saved_checked(run, sets)
        _check_run_env(req, run, ckpt, cfg.env.name)
        return cfg, ckpt, run
    cfg = load_config(req.config, req.sets, benchmark=req.benchmark, env=req.env, model=model,
                      engine=req.engine, seed=req.seed)
    return cfg, ckpt, None


def _check_run_env(req: EvalRequest, run: Path, ckpt: Path, env: str) -> None:
    """The run's env file against the sha256 the run recorded (`env_file.check_env`); an
    allowed change is a line of the run's env-changes.log."""
    change = check_env(run, env, req.allow_env_change, option="--checkpoint")
    if change is not None:
        log_env_change(run, change, f"eval --checkpoint {ckpt.name}")


def _check_sizes(req: EvalRequest) -> None:
    for opt, v in (("--pass-k", req.pass_k), ("--n", req.n)):
        if v is not None and v > MAX_SAMPLES:
            raise ConfigError(f"{opt} {v} is above the most samples per task, {MAX_SAMPLES} "
                              f"(pass@k is estimated from n >= k samples of each task)")


def plan_eval(req: EvalRequest) -> EvalPlan:
    """The checked evaluation of a request (module docstring), before any model loads."""
    _check_sizes(req)
    if req.json_path is not None:         # before the work, so results are never lost at the end
        check_output_file(req.json_path, "--json")
    cfg, ckpt, run = _config(req)
    check_eval_tasks(cfg, req.tasks, "--tasks" if req.tasks else "train.eval_tasks")
    tasks = req.tasks or cfg.train.eval_tasks
    n = req.n if req.n is not None else max(cfg.train.eval_samples, req.pass_k or 1)
    pass_k = req.pass_k or n
    if n < pass_k:
        raise ConfigError(f"--n ({n}) must be >= --pass-k ({pass_k})")
    seed, same = None, ""
    if run is not None and req.seed is None and ckpt.name.startswith("step-"):
        # the trainer's own held-out check at this step: same tasks, samples and seed
        step = int(ckpt.name.split("-")[1])
        seed = step_seed(cfg.seed, step, salt=3)
        if (tasks, n) == (cfg.train.eval_tasks, cfg.train.eval_samples) and not req.greedy:
            same = (f"the trainer's held-out check at step {step} (same tasks, samples and seed: "
                    f"mean@1 is its eval/success)")
    label = f"{run.name}/{ckpt.name}" if run is not None else (
        str(ckpt) if ckpt is not None else (Path(cfg.model.name).name if cfg.model.name != "tiny" else "tiny"))
    return EvalPlan(cfg, label, tasks, n, pass_k, seed, same, ckpt)


def eval_checkpoint(req: EvalRequest, announce: Callable[[EvalPlan], None] = lambda p: None,
                    progress: Callable[[int, int], None] | None = None) -> tuple[EvalPlan, dict]:
    """Plan (`plan_eval`), say what is evaluated (`announce(plan)`), build `tiny` if needed,
    check the memory, evaluate (`evaluation.runner.run_eval`; `progress(done, total)`), and
    write `--json`. -> (plan, results). A checkpoint's policy is opened by
    `checkpoint.open_checkpoint` (verified by `plan_eval`; its critic is not needed)."""
    plan = plan_eval(req)
    announce(plan)
    cfg = plan.cfg
    ensure_model(cfg)                     # `tiny`: built once, before the bar
    check_rollout_memory(cfg, cfg.rollout.batch_size, "eval", plan.tasks)   # prompts, rows x context
    rt = None if plan.ckpt is None else open_checkpoint(
        plan.ckpt, cfg, greedy=req.greedy, with_critic=False, verified=True).runtime
    res = run_eval(cfg, n=plan.n, k_max=plan.pass_k, n_tasks=plan.tasks, greedy=req.greedy,
                   seed=plan.seed, progress=progress, rt=rt)
    res["checkpoint"] = str(plan.ckpt) if plan.ckpt is not None else None
    if req.json_path is not None:
        req.json_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(req.json_path, json.dumps(res, indent=2))
    return plan, res

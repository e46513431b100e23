"""agentrl eval"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from .options import (BenchmarkOpt, ConfigOpt, EngineOpt, EnvOpt, ModelOpt, SeedOpt, SetOpt,
                      load_config, user_errors)


def _run_of(ckpt: Path) -> Path | None:
    """The training run a checkpoint belongs to (`<run>/checkpoints/step-N`), if it has its config."""
    run = ckpt.parent.parent
    return run if ckpt.parent.name == "checkpoints" and (run / "config.json").is_file() else None


@user_errors
def eval_cmd(
    pass_k: Annotated[Optional[int], typer.Option("--pass-k", "-k", help="Largest k of pass@k (k = 1, 2, 4, ... K). Default: the samples per task.", min=1)] = None,
    n: Annotated[Optional[int], typer.Option("--n", help="Samples per task (default: train.eval_samples, or K if larger; must be >= K).", min=1)] = None,
    tasks: Annotated[Optional[int], typer.Option("--tasks", help="Held-out tasks (default: train.eval_tasks, the trainer's held-out set).", min=1)] = None,
    checkpoint: Annotated[Optional[Path], typer.Option("--checkpoint", help="Checkpoint or run folder (its latest checkpoint); the run's own config is the default.")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the results as JSON here.")] = None,
    greedy: Annotated[bool, typer.Option("--greedy", help="Argmax decoding (then n = 1 is enough).")] = False,
    env: EnvOpt = None,
    benchmark: BenchmarkOpt = None,
    model: ModelOpt = None,
    engine: EngineOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    seed: SeedOpt = None,
):
    """Evaluate pass@k, pass^k, mean@1 and tokens per question on the held-out set the trainer checks. Example: agentrl eval --checkpoint runs/x"""
    from ..errors import ConfigError
    from ..train.preflight import load_saved_checked
    from ..evaluation.runner import run_eval
    from ..reporting.live import eval_table
    from ..train.tiny_build import ensure_model

    if json_path is not None:             # before the work, so results are never lost at the end
        from ..train.run_folder import check_output_file
        check_output_file(json_path, "--json")
    ckpt = run = None
    if checkpoint is not None:
        from ..train.checkpoint import find
        ckpt = find(checkpoint)
        model = str(ckpt)
        run = _run_of(ckpt)
    if run is not None and env is None and benchmark is None and config is None:
        # the run's own settings (env, its sizes, sampling, eval set) with this checkpoint's weights
        sets = [*(set_ or []), f"model.name={ckpt}"]
        if engine is not None:
            sets.append(f"rollout.engine={engine}")
        if seed is not None:
            sets.append(f"seed={seed}")
        cfg = load_saved_checked(run, sets)
    else:
        run = None
        cfg = load_config(config, set_, benchmark=benchmark, env=env, model=model, engine=engine,
                          seed=seed)
    from ..train.preflight import check_eval_tasks
    check_eval_tasks(cfg, tasks, "--tasks" if tasks else "train.eval_tasks")
    tasks = tasks or cfg.train.eval_tasks
    n = n if n is not None else max(cfg.train.eval_samples, pass_k or 1)
    pass_k = pass_k or n
    if n < pass_k:
        raise ConfigError(f"--n ({n}) must be >= --pass-k ({pass_k})")
    sample_seed, same = None, ""
    if run is not None and seed is None and ckpt.name.startswith("step-"):
        # the trainer's own held-out check at this step: same tasks, samples and seed
        from ..config import step_seed

        step = int(ckpt.name.split("-")[1])
        sample_seed = step_seed(cfg.seed, step, salt=3)
        if (tasks, n) == (cfg.train.eval_tasks, cfg.train.eval_samples) and not greedy:
            same = (f"the trainer's held-out check at step {step} (same tasks, samples and seed: "
                    f"mean@1 is its eval/success)")
    console = Console(stderr=True)
    label = f"{run.name}/{ckpt.name}" if run is not None else (
        str(ckpt) if ckpt is not None else (Path(cfg.model.name).name if cfg.model.name != "tiny" else "tiny"))
    console.print(f"evaluating {label} on {cfg.env.name}: {tasks} held-out tasks x {n} samples"
                  + (f" = {same}" if same else ""), highlight=False)
    ensure_model(cfg)                     # `tiny`: built once, before the bar
    from ..train.preflight import check_rollout_memory
    check_rollout_memory(cfg, cfg.rollout.batch_size, "eval", tasks)   # prompts, rows x context
    with _Progress(console, tasks * n) as bar:
        res = run_eval(cfg, n=n, k_max=pass_k, n_tasks=tasks, greedy=greedy, seed=sample_seed,
                       progress=bar.update)
    res["checkpoint"] = str(ckpt) if ckpt is not None else None
    Console().print(eval_table(res, f"{label} on {cfg.env.name} (held-out)"))
    if json_path is not None:
        from ..train.run_folder import atomic_write_text

        json_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(json_path, json.dumps(res, indent=2))


class _Progress:
    """A bar on a terminal; otherwise one line per batch of episodes."""

    def __init__(self, console: Console, total: int):
        self.console, self.total, self.bar = console, total, None

    def __enter__(self):
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

            self.bar = Progress("episodes", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                                console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task("eval", total=self.total)
        return self

    def update(self, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=done)
        else:
            self.console.print(f"  {done}/{total} episodes", highlight=False)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()

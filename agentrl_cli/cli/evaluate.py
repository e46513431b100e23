"""agentrl eval"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from .options import RunOptions, run_options, user_errors


@user_errors
@run_options(without=("method",))
def eval_cmd(
    *,
    pass_k: Annotated[Optional[int], typer.Option("--pass-k", "-k", help="Largest k of pass@k (k = 1, 2, 4, ... K; at most 1024). Default: the samples per task.", min=1)] = None,
    n: Annotated[Optional[int], typer.Option("--n", help="Samples per task (default: train.eval_samples, or K if larger; must be >= K; at most 1024).", min=1)] = None,
    tasks: Annotated[Optional[int], typer.Option("--tasks", help="Held-out tasks (default: train.eval_tasks, the trainer's held-out set).", min=1)] = None,
    checkpoint: Annotated[Optional[Path], typer.Option("--checkpoint", help="Checkpoint or run folder (its latest checkpoint); the run's own config is the default.")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the results as JSON here.")] = None,
    greedy: Annotated[bool, typer.Option("--greedy", help="Argmax decoding (then n = 1 is enough).")] = False,
    run: RunOptions,
    allow_env_change: Annotated[bool, typer.Option("--allow-env-change", help="With --checkpoint of a run: evaluate although the run's env file changed since the run recorded its sha256 (the change is recorded in the run folder's env-changes.log).")] = False,
):
    """Evaluate pass@k, pass^k, mean@1 and tokens per question on the held-out set the trainer checks. Example: agentrl eval --checkpoint runs/x"""
    # deferred: CLI start-up
    from ..reporting.live import eval_table
    from ..app.evaluate import EvalRequest, eval_checkpoint

    console = Console(stderr=True)
    req = EvalRequest(**run, pass_k=pass_k, n=n, tasks=tasks, checkpoint=checkpoint,
                      json_path=json_path, greedy=greedy, allow_env_change=allow_env_change)

    def announce(plan) -> None:
        console.print(f"evaluating {plan.label} on {plan.cfg.env.name}: {plan.tasks} held-out "
                      f"tasks x {plan.n} samples" + (f" = {plan.same}" if plan.same else ""),
                      highlight=False)

    with _Progress(console) as bar:
        plan, res = eval_checkpoint(req, announce, progress=bar.update)
    Console().print(eval_table(res, f"{plan.label} on {plan.cfg.env.name} (held-out)"))


class _Progress:
    """A bar on a terminal (from the first finished batch of episodes); otherwise one line per
    batch."""

    def __init__(self, console: Console):
        self.console, self.bar = console, None

    def __enter__(self):
        return self

    def update(self, done: int, total: int) -> None:
        if self.bar is None and self.console.is_terminal:
            # deferred: CLI start-up
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

            self.bar = Progress("episodes", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                                console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task("eval", total=total)
        if self.bar is not None:
            self.bar.update(self.task, completed=done)
        else:
            self.console.print(f"  {done}/{total} episodes", highlight=False)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()

"""The live training display: a rich progress bar on a terminal, one line per step otherwise
(each with the step's seconds and the run's ETA at its pace so far)."""
from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table


class TrainProgress:
    def __init__(self, console: Console, clock=time.time):
        self.console, self.clock = console, clock
        self.live = console.is_terminal
        self.progress = None
        self.task = None

    def start(self, total: int, done: int) -> None:
        self.t0, self.done0, self.total = self.clock(), done, total
        if self.live:
            self.progress = Progress(
                TextColumn("[bold]step {task.completed}/{task.total}"), BarColumn(),
                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("ETA"),
                TimeRemainingColumn(), console=self.console)
            self.progress.start()
            self.task = self.progress.add_task("train", total=total, completed=done, info="")

    def update(self, step: int, row: dict) -> None:
        """One step's line. `held-out` is the check run at this step (`eval/success` ± its
        standard error `eval/success_se`, when the row has them), else `–`: between checks
        there is no new measurement, so none is repeated."""
        info = (f"reward {row['reward/mean']:.2f}  held-out {held_out(row)}  "
                f"tok/s {row['tokens/s']:.0f}  tools/ep {row['rollout/tool_calls']:.1f}")
        if self.progress is not None:
            self.progress.update(self.task, completed=step, info=info)
        else:
            # one line per step however narrow the console (a log or a pipe reads 80 columns)
            self.console.print(f"step {step}  {info}  ({row['time/step']:.1f}s, ETA "
                               f"{self.eta(step)})", highlight=False, soft_wrap=True)

    def eta(self, step: int) -> str:
        """The time left at the pace of this run's steps so far (checks included): '1m05s'."""
        done = step - self.done0
        left = (self.clock() - self.t0) / done * (self.total - step) if done > 0 else 0.0
        return duration(left)

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def duration(seconds: float) -> str:
    """'42s', '3m05s', '1h02m'."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def with_se(value: float, se: float | None, digits: int = 3) -> str:
    """'0.510±0.030'; the value alone when there is no standard error (fewer than 2 tasks)."""
    return f"{value:.{digits}f}" + (f"±{se:.{digits}f}" if se is not None else "")


def held_out(row: dict) -> str:
    """The step line's held-out field: '0.51±0.03' at a check, '–' on a step without one."""
    if "eval/success" not in row:
        return "–"
    return with_se(row["eval/success"], row.get("eval/success_se"), 2)


def summary_table(summary: dict) -> Table:
    t = Table(title=f"{summary['method']} on {summary['env']} ({summary['steps']} steps, "
                    f"{summary['wall_seconds']:.0f}s)")
    t.add_column("", style="bold")
    t.add_column("base")
    t.add_column("trained")
    t.add_row("held-out success ± se", with_se(summary["base_success"], summary.get("base_success_se")),
              with_se(summary["final_success"], summary.get("final_success_se")))
    t.add_row("tokens / eval question", f"{summary['base_tokens_per_question']:.1f}",
              f"{summary['final_tokens_per_question']:.1f}")
    t.add_row("tokens generated in training", "", f"{summary['tokens_generated']:,}")
    if "eval_tasks" in summary:
        t.caption = (f"± standard error over {summary['eval_tasks']} held-out tasks "
                     f"({summary['eval_samples']} samples each)")
    return t


def eval_table(res: dict, title: str) -> Table:
    t = Table(title=title)
    t.add_column("k")
    t.add_column("pass@k")
    t.add_column("pass^k")
    for k in res["pass@k"]:
        t.add_row(k, f"{res['pass@k'][k]:.3f}", f"{res['pass^k'][k]:.3f}")
    t.caption = (f"mean@1 {with_se(res['mean@1'], res.get('mean@1_se'))} (± se over tasks) · "
                 f"tokens/question {res['tokens_per_question']:.1f} · "
                 f"n={res['n']} samples x {res['tasks']} tasks")
    return t

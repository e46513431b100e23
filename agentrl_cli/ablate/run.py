"""Running a sweep: the rerun check, each (cell, seed) as an `agentrl train` run in this process
or as parallel subprocesses, finished runs skipped and stopped ones resumed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from ..app.train import train
from ..config import RESUME_KEYS, RunConfig, flatten, load_saved
from ..errors import ConfigError
from ..reporting.live import held_out
from ..reporting.metrics import read_metrics
from .plan import ESTIMATE_AFTER_STEPS, Cell, Sweep, SweepEstimate


# What a rerun may change in a cell that already ran: the keys a resume may change, except
# train.steps (a finished cell with other steps would sit in the table beside the new ones).
RERUN_MAY_CHANGE = tuple(k for k in RESUME_KEYS if k != "train.steps")
# the option of `agentrl ablate` that sets a key, for the hint of `check_rerun`
_KEY_OPTIONS = {"train.steps": "--steps", "rollout.budget_tokens": "--budget", "seed": "--seed"}


def rerun_difference(saved: RunConfig, new: RunConfig) -> tuple[str, object, object] | None:
    """The first key (in config order) whose value a rerun would change in a run that ran
    with `saved`, as (key, old, new); None when only `RERUN_MAY_CHANGE` keys (and `out`)
    differ."""
    a, b = flatten(saved), flatten(new)
    for key in a:
        if key != "out" and key not in RERUN_MAY_CHANGE and a[key] != b.get(key):
            return key, a[key], b.get(key)
    return None


def check_rerun(sweep: Sweep) -> None:
    """A rerun of a sweep in the same `--out`: every run that finished or stopped with a
    checkpoint must have run with the config this rerun gives its cell (its `config.json`),
    else one ConfigError line naming the run, the key, its old and new value, before any
    run starts (a skipped or resumed run would otherwise be reported under settings it did
    not run with)."""
    for cell in sweep.cells:
        for seed in sweep.seeds:
            run = sweep.run_dir(cell, seed)
            if status(run) == "new" or not (run / "config.json").is_file():
                continue                  # nothing kept: it (re)starts with the new config
            diff = rerun_difference(load_saved(run), sweep.cell_config(cell, seed))
            if diff is None:
                continue
            key, old, new = diff
            opt = _KEY_OPTIONS.get(key)
            again = f"{opt} {old}" if opt else f"--set {key}={old}"
            raise ConfigError(
                f"{sweep.out} holds {cell.name} seed {seed}, run with {key}={old}; this rerun "
                f"would give it {key}={new}: rerun with {again} (the sweep's settings) or use "
                f"a new --out")


def earlier_cells(sweep: Sweep, log: Callable[[str], None] = print) -> list[Cell]:
    """The cells an earlier run of this sweep (its `ablation.json`) ran that this one does not
    name, with a finished run that ran as this sweep would run it (same settings but the
    cell's own): kept in the summary beside this run's cells. A finished cell that ran with
    other settings is left out, said in one line."""
    try:
        data = json.loads((sweep.out / "ablation.json").read_text(encoding="utf-8"))
        cells = [Cell(c["name"], c["method"], dict(c.get("params") or {}), tuple(c.get("sets") or ()),
                      dict(c.get("tuned") or {})) for c in data["cells"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    names, kept = {c.name for c in sweep.cells}, []
    for cell in cells:
        done = [s for s in sweep.seeds if cell.name not in names
                and status(sweep.run_dir(cell, s)) == "finished"]
        if not done:
            continue
        try:
            diff = rerun_difference(load_saved(sweep.run_dir(cell, done[0])),
                                    sweep.cell_config(cell, done[0]))
        except ConfigError as e:
            diff = ("its config", str(e), "")
        if diff is not None:
            log(f"not in the summary: {cell.name}, finished by an earlier run of this sweep with "
                f"{diff[0]}={diff[1]} (this run gives {diff[2]})")
            continue
        kept.append(cell)
    if kept:
        log(f"keeping {len(kept)} finished cell(s) of earlier runs of this sweep in the summary: "
            + ", ".join(c.name for c in kept))
    return kept


def status(run: Path) -> str:
    """finished | resumable | new"""
    if (run / "summary.json").is_file():
        return "finished"
    if (run / "checkpoints" / "latest").is_file():
        return "resumable"
    return "new"


def _train_args(sweep: Sweep, cell: Cell, seed: int) -> list[str]:
    run = sweep.run_dir(cell, seed)
    if status(run) == "resumable":
        args = ["train", "--resume", str(run)]
    else:
        args = ["train", "--method", cell.method, "--seed", str(seed), "--out", str(run),
                "--overwrite"]                # a run with no checkpoint starts over
        if sweep.config_file:
            args += ["--config", sweep.config_file]
        for s in sweep.cell_sets(cell):
            args += ["--set", s]
    return args


def train_command(sweep: Sweep, cell: Cell, seed: int) -> list[str]:
    """The subprocess of one run in a parallel sweep: `agentrl train ...`."""
    return [sys.executable, "-m", "agentrl_cli.cli.main", *_train_args(sweep, cell, seed)]


def run_sweep(sweep: Sweep, jobs: int = 1, log: Callable[[str], None] = print) -> dict:
    """Run every unfinished (cell, seed); returns {"ran": [...], "skipped": [...], "failed": [...]}."""
    todo, skipped = [], []
    for cell in sweep.cells:
        sweep.cell_config(cell, sweep.seeds[0])  # a bad key or value fails before any run
        for seed in sweep.seeds:
            run = sweep.run_dir(cell, seed)
            (skipped if status(run) == "finished" else todo).append((cell, seed))
    if skipped:
        log(f"skipping {len(skipped)} finished run(s)")
    ran, failed = [], []
    probe = EstimateProbe([sweep.cell_config(c, sweep.seeds[0]) for c in sweep.cells],
                          len(todo), jobs, log)
    if jobs <= 1:
        t0 = time.time()
        for i, (cell, seed) in enumerate(todo, 1):
            log(f"[{i}/{len(todo)}] {cell.name} seed {seed}")
            try:
                s = _train_here(sweep, cell, seed, log, probe if i == 1 else None)
                ran.append((cell.name, seed))
                left = (time.time() - t0) / i * (len(todo) - i)
                log(f"  held-out success {s['base_success']:.3f} -> {s['final_success']:.3f}, "
                    f"{s['tokens_generated']:,} tokens, {s['wall_seconds']:.0f}s"
                    + (f"; sweep ETA {left / 60:.1f} min" if i < len(todo) else ""))
            except (ConfigError, KeyboardInterrupt):
                raise
            except Exception as e:  # one failed cell must not lose the others
                failed.append((cell.name, seed, f"{type(e).__name__}: {e}"))
                log(f"  failed: {type(e).__name__}: {e}")
    else:
        ran, failed = _train_parallel(sweep, todo, jobs, log, probe)
    return {"ran": ran, "skipped": [(c.name, s) for c, s in skipped], "failed": failed}


class EstimateProbe:
    """Measures the sweep's time on its first run and prints `SweepEstimate`'s line once:
    after `ESTIMATE_AFTER_STEPS` steps (or the run's last step, if it has fewer)."""

    def __init__(self, configs: list[RunConfig], runs: int, jobs: int, log: Callable[[str], None]):
        self.configs, self.runs, self.jobs, self.log = configs, runs, jobs, log
        self.done = False

    def observe(self, setup_s: float, rows: list[dict], last: bool) -> None:
        """`rows`: the first run's metrics rows so far (`time/step`, `time/rollout`)."""
        if self.done or not rows or (len(rows) < ESTIMATE_AFTER_STEPS and not last):
            return
        self.done = True
        first = rows[:ESTIMATE_AFTER_STEPS]
        est = SweepEstimate(setup_s, tuple(r["time/step"] for r in first),
                            tuple(r["time/rollout"] for r in first if "time/rollout" in r))
        self.log(est.line(self.configs, self.runs, self.jobs))

    def watch(self, metrics: Path, started: float) -> None:
        """A run in a subprocess: read its first steps' `time/step` off its metrics.jsonl;
        the time to its first step is what the rows do not account for."""
        if self.done or not metrics.is_file():
            return
        try:
            rows = read_metrics(metrics)
        except (OSError, ValueError):
            return
        rows = [r for r in rows if isinstance(r.get("time/step"), (int, float))]
        if len(rows) >= ESTIMATE_AFTER_STEPS:
            setup = time.time() - started - sum(r["time/step"] for r in rows)
            self.observe(max(0.0, setup), rows, last=False)


class StepLines:
    """`train`'s progress hook in a sweep: one line per training step of the run; `probe`
    (the sweep's first run) measures the sweep's time estimate."""

    def __init__(self, label: str, log: Callable[[str], None], probe: EstimateProbe | None = None):
        self.label, self.log, self.probe = label, log, probe
        self.created, self.rows = time.time(), []

    def start(self, total: int, done: int) -> None:
        self.total, self.done0, self.t0 = total, done, time.time()

    def update(self, step: int, row: dict) -> None:
        """The run's step line; held-out as in `agentrl train`'s (`reporting.live.held_out`):
        the check's value ± se at a check, `–` on a step without one."""
        per = (time.time() - self.t0) / max(1, step - self.done0)
        self.log(f"  {self.label} step {step}/{self.total}  reward {row['reward/mean']:.2f}  "
                 f"held-out {held_out(row)}  {row['rollout/tokens']} tokens  "
                 f"{row['time/step']:.1f}s  (run ETA {per * (self.total - step):.0f}s)")
        if self.probe is not None:
            self.rows.append(row)
            self.probe.observe(self.t0 - self.created, self.rows, last=step == self.total)

    def stop(self) -> None:
        pass


def _train_here(sweep: Sweep, cell: Cell, seed: int, log: Callable[[str], None] = lambda s: None,
                probe: EstimateProbe | None = None) -> dict:
    run = sweep.run_dir(cell, seed)
    steps = StepLines(f"{cell.name} seed {seed}", log, probe)
    if status(run) == "resumable":
        return train(load_saved(run), run, resume=str(run), log=lambda s: None, progress=steps)
    return train(sweep.cell_config(cell, seed), run, log=lambda s: None, progress=steps,
                 overwrite=True)              # a run with no checkpoint starts over


def job_log(sweep: Sweep, cell: Cell, seed: int) -> Path:
    """The output of a run's `agentrl train` subprocess: beside the run folder, not in it (a
    fresh run refuses a folder holding files it did not write)."""
    logs = sweep.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return logs / f"{cell.name}-seed-{seed}.log"


def _train_parallel(sweep: Sweep, todo, jobs: int, log, probe: EstimateProbe) -> tuple[list, list]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))
    queue, running, ran, failed = list(todo), [], [], []
    n, started = len(todo), 0
    while queue or running:
        while queue and len(running) < jobs:
            cell, seed = queue.pop(0)
            run = sweep.run_dir(cell, seed)
            run.parent.mkdir(parents=True, exist_ok=True)
            logf = job_log(sweep, cell, seed).open("w")
            running.append((subprocess.Popen(train_command(sweep, cell, seed), stdout=logf, stderr=subprocess.STDOUT, env=env),
                            cell, seed, logf))
            started += 1
            if started == 1:
                first = (run / "metrics.jsonl", time.time())
            log(f"[{started}/{n}] started {cell.name} seed {seed} (log: {job_log(sweep, cell, seed)})")
        probe.watch(*first)
        proc, cell, seed, logf = running[0]
        for item in running:  # wait for whichever finishes first
            if item[0].poll() is not None:
                proc, cell, seed, logf = item
                break
        else:
            try:
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                continue
        running.remove((proc, cell, seed, logf))
        logf.close()
        if proc.returncode == 0 and status(sweep.run_dir(cell, seed)) == "finished":
            ran.append((cell.name, seed))
            log(f"  finished {cell.name} seed {seed}")
        else:
            tail = job_log(sweep, cell, seed).read_text().strip().splitlines()[-1:]
            failed.append((cell.name, seed, tail[0] if tail else f"exit {proc.returncode}"))
            log(f"  failed {cell.name} seed {seed}: {failed[-1][2]}")
    return ran, failed

"""Sweeps over config keys, methods and seeds at a matched generation budget (`agentrl ablate`).

A sweep is a list of *axes*. An axis has a name and values; each value is a label and the
`--set` overrides it stands for (a plain config key `algo.beta` with values 0, 0.5, 1 gives
`algo.beta=0`, ...; a preset axis such as "refinement on/off" maps a label to several keys).
The methods are one more axis. Every combination is a *cell*, and every cell runs once per seed
as an ordinary `agentrl train` run in `<out>/cells/<cell>/seed-<S>/`.

Matched budget: every cell runs with the same `rollout.budget_tokens`. By default it is measured
[our choice]: the tokens one step of the base config's linear rollout generates (tasks_per_step
x group_size episodes of the initial policy on step 1's tasks, i.e. what a GRPO step spends), or
the base config's own `rollout.budget_tokens` when that is set. It is written to
`<out>/ablation.json` and reused when the sweep is rerun.

Resumable: a run whose folder has `summary.json` is finished and skipped; one with a checkpoint
resumes from it (`agentrl train --resume`); anything else starts over. Each run records its
full resolved config (the run's own `config.json`); a rerun with the same `--out` is refused,
before any run starts, when a cell that finished or stopped with a checkpoint ran with a
different config than the rerun would give it (`check_rerun`: another `--steps`, base `--set`,
`--config` or `--budget`). Only `RERUN_MAY_CHANGE` may differ (how often a run checks and saves,
where its metrics and rollouts go): none of them changes what a run computes.
Cells run one after another in this process (`jobs = 1`) or as `jobs` parallel
`agentrl train` subprocesses (each with its log in `<out>/logs/<cell>-seed-<S>.log`, outside the
run folder, which only the run itself writes).

Presets (`PRESETS`): the papers' named ablations: FOCUS refinement rollouts on/off,
compaction vs workspace, free vs structured compaction; MPO turn vs token ratio; TRACE K = 3
vs 0.

Reported per cell (mean ± sample std over its finished seeds): the final held-out success, the
tokens generated in training, and generated tokens per held-out question, in one table
(`summary.csv`, `summary.json`), plus `learning_curves.png` (held-out success vs step) and
`final_vs_param.png` (final success vs each swept value).
"""
from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .errors import ConfigError
from .config import RESUME_KEYS, RunConfig, flatten
from .registry import Registry
from .train.run_folder import atomic_write_text
from .train.preflight import load_checked


@dataclass(frozen=True)
class Axis:
    name: str                                          # shown in cell names and tables
    values: tuple[tuple[str, tuple[str, ...]], ...]    # (label, --set overrides) per value

    @classmethod
    def key(cls, key: str, values: list[str]) -> "Axis":
        """A plain config key swept over values, `key=v` for each."""
        return cls(key, tuple((v, (f"{key}={v}",)) for v in values))


@dataclass(frozen=True)
class Cell:
    name: str
    method: str
    params: dict = field(default_factory=dict, hash=False)   # axis name -> label
    sets: tuple[str, ...] = ()


@dataclass(frozen=True)
class Preset:
    summary: str
    methods: tuple[str, ...]
    axes: Callable[[RunConfig], list[Axis]]               # from the base config


PRESETS: Registry[Preset] = Registry("ablation preset")
PRESETS.register("refinement", Preset(
    "FOCUS with and without refinement rollouts (continuations); without them the budget goes "
    "to group_size independent root episodes per task",
    ("focus",),
    lambda cfg: [Axis("refinement", (
        ("on", ()),
        ("off", ("algo.focus_max_inflight=0", f"algo.focus_roots={cfg.rollout.group_size}"))))]))
PRESETS.register("turn-ratio", Preset(
    "MPO's importance ratio: turn-level (turn_ratio) vs token-level (ppo_clip)",
    ("mpo",),
    lambda cfg: [Axis("loss", (("turn_ratio", ("algo.loss=turn_ratio",)),
                               ("ppo_clip", ("algo.loss=ppo_clip",))))]))
PRESETS.register("trace-k", Preset(
    "TRACE look-ahead K = 3 vs K = 0 (K = 0: an empty look-ahead, so no turn credit: "
    "expressed as algo.alpha_turn=0, since algo.trace_k must be >= 1)",
    ("trace",),
    lambda cfg: [Axis("trace_k", (("3", ("algo.trace_k=3",)), ("0", ("algo.alpha_turn=0",))))]))
PRESETS.register("workspace", Preset(
    "FOCUS with a compaction operator vs an in-memory workspace (put/get/scan/delete tools)",
    ("focus",),
    lambda cfg: [Axis("context", (("compaction", ("context.operator=compaction",)),
                                  ("workspace", ("context.operator=workspace",))))]))
PRESETS.register("compaction-style", Preset(
    "FOCUS with compaction: free-form vs structured (four sections) summary prompt",
    ("focus",),
    lambda cfg: [Axis("style", (("free", ("context.operator=compaction", "context.style=free")),
                                ("structured", ("context.operator=compaction",
                                                "context.style=structured"))))]))


def short(key: str, keys: list[str]) -> str:
    """`algo.beta` -> `beta` unless another swept key ends the same way."""
    tail = key.rsplit(".", 1)[-1]
    return tail if sum(k.rsplit(".", 1)[-1] == tail for k in keys) == 1 else key


def plan(methods: list[str], axes: list[Axis]) -> list[Cell]:
    """Every combination of method and axis values, methods outermost."""
    names = [a.name for a in axes]
    for a in axes:
        if not a.values:
            raise ConfigError(f"axis '{a.name}' has no values")
    cells = []
    for m in methods:
        for combo in itertools.product(*[a.values for a in axes]):
            params = {a.name: label for a, (label, _) in zip(axes, combo)}
            sets = tuple(s for _, ss in combo for s in ss)
            name = "_".join([m] + [f"{short(k, names)}={v}" for k, v in params.items()])
            cells.append(Cell(name.replace("/", "-"), m, params, sets))
    if len({c.name for c in cells}) != len(cells):
        raise ConfigError("two cells of the sweep have the same name (a value repeated?)")
    return cells


@dataclass
class Sweep:
    out: Path
    cells: list[Cell]
    seeds: list[int]
    config_file: str | None = None
    base_sets: list[str] = field(default_factory=list)
    budget: int = 0                                     # rollout.budget_tokens of every cell

    def run_dir(self, cell: Cell, seed: int) -> Path:
        return self.out / "cells" / cell.name / f"seed-{seed}"

    def cell_sets(self, cell: Cell) -> list[str]:
        return [*self.base_sets, *cell.sets, f"rollout.budget_tokens={self.budget}"]

    def cell_config(self, cell: Cell, seed: int) -> RunConfig:
        """The cell's config, its plugin names checked (a typo fails before any run)."""
        return load_checked(self.config_file, self.cell_sets(cell), method=cell.method, seed=seed,
                    out=str(self.run_dir(cell, seed)))


# ----------------------------------------------------------------------------- budget


def measure_budget(cfg: RunConfig) -> int:
    """Tokens one linear rollout step of `cfg` generates (step 1's tasks, the initial policy):
    `train.loop.linear_step_tokens`, what `rollout.budget_match` gives a run of `cfg`."""
    from .train.loop import initial_runtime, linear_step_tokens

    return linear_step_tokens(initial_runtime(cfg, log=lambda s: None))


def resolve_budget(out: Path, base: RunConfig, budget: int | None, log: Callable[[str], None],
                   timing: dict | None = None) -> int:
    """The sweep's budget: --budget, else the one recorded by an earlier run of this sweep, else
    the base config's rollout.budget_tokens, else measured (see the module docstring; the
    measurement's wall seconds go to `timing["rollout_seconds"]`)."""
    rec = out / "ablation.json"
    old = json.loads(rec.read_text()).get("budget_tokens") if rec.is_file() else None
    if budget is not None:
        if old is not None and old != budget and any((out / "cells").glob("*/seed-*/summary.json")):
            raise ConfigError(f"{out} holds cells finished at budget {old} tokens; rerun with "
                              f"--budget {old} or use a new --out")
        return budget
    if old is not None:
        return old
    if base.rollout.budget_tokens > 0:
        return base.rollout.budget_tokens
    log("measuring the matched budget: one linear rollout step of the base config ...")
    t0 = time.time()
    tokens = measure_budget(base)
    if timing is not None:
        timing["rollout_seconds"] = time.time() - t0
    return tokens


# ----------------------------------------------------------------------------- rerun


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
    from .config import load_saved

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


# ----------------------------------------------------------------------------- running


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
    if jobs <= 1:
        t0 = time.time()
        for i, (cell, seed) in enumerate(todo, 1):
            log(f"[{i}/{len(todo)}] {cell.name} seed {seed}")
            try:
                s = _train_here(sweep, cell, seed, log)
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
        ran, failed = _train_parallel(sweep, todo, jobs, log)
    return {"ran": ran, "skipped": [(c.name, s) for c, s in skipped], "failed": failed}


class StepLines:
    """`train`'s progress hook in a sweep: one line per training step of the run."""

    def __init__(self, label: str, log: Callable[[str], None]):
        self.label, self.log = label, log

    def start(self, total: int, done: int) -> None:
        self.total, self.done0, self.t0 = total, done, time.time()

    def update(self, step: int, row: dict) -> None:
        """The run's step line; held-out as in `agentrl train`'s (`reporting.live.held_out`):
        the check's value ± se at a check, `–` on a step without one."""
        from .reporting.live import held_out

        per = (time.time() - self.t0) / max(1, step - self.done0)
        self.log(f"  {self.label} step {step}/{self.total}  reward {row['reward/mean']:.2f}  "
                 f"held-out {held_out(row)}  {row['rollout/tokens']} tokens  "
                 f"{row['time/step']:.1f}s  (run ETA {per * (self.total - step):.0f}s)")

    def stop(self) -> None:
        pass


def _train_here(sweep: Sweep, cell: Cell, seed: int, log: Callable[[str], None] = lambda s: None) -> dict:
    from .config import load_saved
    from .train.loop import train

    run = sweep.run_dir(cell, seed)
    steps = StepLines(f"{cell.name} seed {seed}", log)
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


def _train_parallel(sweep: Sweep, todo, jobs: int, log) -> tuple[list, list]:
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
            log(f"[{started}/{n}] started {cell.name} seed {seed} (log: {job_log(sweep, cell, seed)})")
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


# ----------------------------------------------------------------------------- results


def _mean_std(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, 0.0
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def collect(sweep: Sweep) -> dict:
    """Per-cell results from the finished runs' summary.json and metrics.jsonl."""
    from .reporting.metrics import read_metrics

    cells, envs = [], set()
    for cell in sweep.cells:
        runs = []
        for seed in sweep.seeds:
            d = sweep.run_dir(cell, seed)
            if status(d) != "finished":
                continue
            s = json.loads((d / "summary.json").read_text())
            rows = read_metrics(d / "metrics.jsonl") if (d / "metrics.jsonl").is_file() else []
            runs.append({"seed": seed, "summary": s,
                         "curve": [(r["step"], r["eval/success"]) for r in rows if "eval/success" in r],
                         "tokens_per_step": [r["rollout/tokens"] for r in rows if "rollout/tokens" in r]})
        envs |= {r["summary"].get("env") for r in runs}
        row = {"name": cell.name, "method": cell.method, "params": dict(cell.params),
               "seeds": [r["seed"] for r in runs], "dirs": [str(sweep.run_dir(cell, r["seed"])) for r in runs]}
        for key, src in (("final_success", "final_success"), ("tokens", "tokens_generated"),
                         ("tokens_per_question", "final_tokens_per_question"),
                         ("base_success", "base_success")):
            vals = [float(r["summary"][src]) for r in runs]
            row[key] = vals
            row[f"{key}_mean"], row[f"{key}_std"] = _mean_std(vals)
        tps = [t for r in runs for t in r["tokens_per_step"]]
        row["tokens_per_step_mean"] = sum(tps) / len(tps) if tps else None
        row["curves"] = [r["curve"] for r in runs]
        cells.append(row)
    done = [c for c in cells if c["final_success_mean"] is not None]
    best = max(done, key=lambda c: c["final_success_mean"])["name"] if done else None
    return {"out": str(sweep.out), "budget_tokens": sweep.budget, "seeds": sweep.seeds,
            "env": ",".join(sorted(e for e in envs if e)) or None,
            "axes": sorted({k for c in sweep.cells for k in c.params}), "cells": cells, "best": best}


def write_results(res: dict, out: Path) -> None:
    """summary.json, summary.csv, learning_curves.png, final_vs_param.png in `out`."""
    atomic_write_text(out / "summary.json", json.dumps(res, indent=2))
    top = max((c["final_success_mean"] for c in res["cells"] if c["final_success_mean"] is not None),
              default=None)
    cols = ["cell", "method", *res["axes"], "seeds", "final_success_mean", "final_success_std",
            "tokens_mean", "tokens_std", "tokens_per_step_mean", "tokens_per_question_mean",
            "tokens_per_question_std", "base_success_mean", "best"]
    table = io.StringIO(newline="")
    w = csv.writer(table)
    w.writerow(cols)
    for c in res["cells"]:
        w.writerow([c["name"], c["method"], *[c["params"].get(a, "") for a in res["axes"]],
                    len(c["seeds"]), c["final_success_mean"], c["final_success_std"],
                    c["tokens_mean"], c["tokens_std"], c["tokens_per_step_mean"],
                    c["tokens_per_question_mean"], c["tokens_per_question_std"],
                    c["base_success_mean"],
                    top is not None and c["final_success_mean"] == top])
    atomic_write_text(out / "summary.csv", table.getvalue())
    plot_curves(res, out / "learning_curves.png")
    plot_final_vs_param(res, out / "final_vs_param.png")


def _spread(res: dict) -> str:
    """What a sweep figure's lines and bars are: 'mean ± std over 3 seeds' (a cell with fewer
    finished seeds says n=k in its legend); with one seed there is no spread to show."""
    n = len(res["seeds"])
    return f"mean ± std over {n} seeds" if n > 1 else "1 seed (no spread over seeds)"


def _title(res: dict, what: str) -> str:
    from .reporting import plots

    methods = ",".join(dict.fromkeys(c["method"] for c in res["cells"]))
    return plots.run_title(methods, res.get("env"), res["seeds"],
                           f"{what}, {_spread(res)} · budget "
                           f"{res['budget_tokens'] or 'uncapped'} tokens/step")


def plot_curves(res: dict, png: Path) -> None:
    """Held-out success vs step per cell: the mean over its seeds (at the eval steps they share)
    with a ± std band, the base model's success dashed, the best cell drawn thicker."""
    from .reporting import plots

    fig, (ax,) = plots.figure(1, width=7.5, height=4.2)
    ys_all, bases = [], []
    for i, c in enumerate(res["cells"]):
        if not c["curves"]:
            continue
        steps = sorted(set.intersection(*[{s for s, _ in cv} for cv in c["curves"]]))
        series = [[dict(cv)[s] for s in steps] for cv in c["curves"]]
        plots.mean_band(ax, steps, series, c["name"], i, lw=2.6 if c["name"] == res["best"] else 1.4)
        ys_all += [y for ser in series for y in ser]
        bases += c.get("base_success", [])
    plots.base_line(ax, sum(bases) / len(bases) if bases else None)
    plots.step_axis(ax)
    plots.rate_axis(ax, "held-out success", ys_all)
    ax.set_title(_title(res, "held-out success per check"), fontsize=9)
    plots.legend_outside(ax, title="cell (best: thick)")
    plots.save(fig, png)


def _num(label: str) -> float | None:
    try:
        return float(label)
    except ValueError:
        return None


def plot_final_vs_param(res: dict, png: Path) -> None:
    """Final held-out success (mean ± std over seeds) vs each swept parameter, one line per
    combination of the other parameters and the method; with no parameter, one point per method."""
    from .reporting import plots

    axes = res["axes"] or ["method"]
    fig, subs = plots.figure(len(axes), width=5.2, height=3.9)
    done = [c for c in res["cells"] if c["final_success_mean"] is not None]
    bases = [b for c in done for b in c.get("base_success", [])]
    for ax, a in zip(subs, axes):
        def val(c):
            return c["method"] if a == "method" else c["params"][a]
        labels = list(dict.fromkeys(val(c) for c in done))
        numeric = all(_num(x) is not None for x in labels)
        pos = {x: (_num(x) if numeric else i) for i, x in enumerate(labels)}
        groups: dict[str, list] = {}
        for c in done:
            rest = [c["method"]] * (a != "method") + [f"{k}={v}" for k, v in c["params"].items() if k != a]
            groups.setdefault(" ".join(rest) or "all", []).append(c)
        for i, (g, cs) in enumerate(groups.items()):
            cs = sorted(cs, key=lambda c: pos[val(c)])
            ls, marker = plots.STYLES[i % len(plots.STYLES)]
            ax.errorbar([pos[val(c)] for c in cs], [c["final_success_mean"] for c in cs],
                        yerr=[c["final_success_std"] for c in cs], ls=ls, marker=marker,
                        capsize=3, label=g)
        plots.base_line(ax, sum(bases) / len(bases) if bases else None)
        if not numeric:
            ax.set_xticks(list(pos.values()), labels)
        else:
            ax.set_xticks(sorted(pos.values()), [x for x in sorted(labels, key=_num)])
        ax.set_xlabel(a)
        plots.rate_axis(ax, "final held-out success",
                        [c["final_success_mean"] + c["final_success_std"] for c in done])
        ax.set_title(_title(res, f"final success vs {a}"), fontsize=9)
        plots.legend_outside(ax)
    plots.save(fig, png)


def record(sweep: Sweep, axes: list[Axis], preset: str | None) -> None:
    """`<out>/ablation.json`: what was swept and at which budget (read back on rerun)."""
    sweep.out.mkdir(parents=True, exist_ok=True)
    data = {"budget_tokens": sweep.budget, "seeds": sweep.seeds, "preset": preset,
            "methods": sorted({c.method for c in sweep.cells}),
            "axes": {a.name: [{"label": l, "sets": list(s)} for l, s in a.values] for a in axes},
            "config": sweep.config_file, "sets": sweep.base_sets,
            "cells": [dataclasses.asdict(c) for c in sweep.cells]}
    atomic_write_text(sweep.out / "ablation.json", json.dumps(data, indent=2))


def warmup_warnings(configs: list[RunConfig]) -> list[str]:
    """A cell whose recipe trains only its critic for `train.critic_warmup` steps never moves
    its policy when train.steps does not exceed them: every such cell ends where it started."""
    from .methods import METHODS

    out = []
    for cfg in configs:
        w, s = cfg.train.critic_warmup, cfg.train.steps
        if METHODS.get(cfg.method).critic and w > 0 and s <= w:
            out.append(f"{cfg.method}: train.steps {s} does not exceed its critic warm-up "
                       f"(train.critic_warmup {w}): the policy is never updated, so these "
                       f"cells measure the base model; use --steps {w + 10} or more, or "
                       f"--set train.critic_warmup=0")
    return list(dict.fromkeys(out))


def plan_lines(sweep: Sweep, configs: list[RunConfig], rollout_seconds: float | None,
               jobs: int = 1) -> list[str]:
    """What the sweep will do, before it starts: cells, seeds, steps, budget, a time estimate.

    The estimate [our choice, rough]: a training step costs about twice its rollout (the update
    about as much again), an evaluation what its episodes cost at the measured rate; from the
    budget measurement's wall time when this invocation measured it, else from finished runs
    of this sweep, else none."""
    runs = len(sweep.cells) * len(sweep.seeds)
    steps = sorted({c.train.steps for c in configs})
    warm = {c.method: c.train.critic_warmup for c in configs if c.train.critic_warmup}
    lines = [f"[bold]agentrl ablate[/] {len(sweep.cells)} cells x {len(sweep.seeds)} seed(s) = "
             f"{runs} runs of {'/'.join(map(str, steps))} steps, budget "
             f"{sweep.budget or 'uncapped'} tokens/step -> {sweep.out}",
             "  cells: " + ", ".join(c.name for c in sweep.cells)
             + f"; seeds {','.join(map(str, sweep.seeds))}"]
    for m, w in warm.items():
        lines.append(f"  {m}: the first {w} steps train only the critic (train.critic_warmup)")
    est = None
    if rollout_seconds:
        per_run = 0.0
        for c in configs:
            r = c.rollout
            evals = (c.train.steps // c.train.eval_every if c.train.eval_every else 0) + 2
            eval_share = c.train.eval_tasks * c.train.eval_samples / max(1, r.tasks_per_step * r.group_size)
            per_run += rollout_seconds * (2 * c.train.steps + evals * eval_share)
        est = per_run / len(configs) * runs / max(1, min(jobs, runs))
    else:
        done = [json.loads(p.read_text()) for p in sweep.out.glob("cells/*/seed-*/summary.json")]
        if done:
            est = sum(d["wall_seconds"] for d in done) / len(done) * runs / max(1, min(jobs, runs))
    lines.append(f"  time: about {est / 60:.0f} min in all (rough estimate; finished runs are skipped)"
                 if est is not None else
                 "  time: no estimate yet (each run prints a line per step with its ETA)")
    return lines


def summary_table(res: dict):
    """One row per cell: mean ± std over seeds of the final held-out success, the tokens
    generated in training, per step and per held-out question (the best success in bold green).
    A cell with fewer finished seeds than the sweep shows its count (n=...)."""
    from rich.table import Table

    def pm(m, s, fmt):
        return "–" if m is None else f"{m:{fmt}}±{s:{fmt}}"

    t = Table(title=f"ablation {res['out']}: budget {res['budget_tokens']} tokens/step, "
                    f"seeds {','.join(map(str, res['seeds']))}")
    t.add_column("cell", no_wrap=True)
    for c in ("held-out success", "tokens", "tok/step", "tok/question"):
        t.add_column(c, justify="right")
    top = max((c["final_success_mean"] for c in res["cells"] if c["final_success_mean"] is not None),
              default=None)
    for c in res["cells"]:
        best = top is not None and c["final_success_mean"] == top
        n = len(c["seeds"])
        t.add_row(c["name"], pm(c["final_success_mean"], c["final_success_std"], ".3f")
                  + (f" (n={n})" if n < len(res["seeds"]) else ""),
                  pm(c["tokens_mean"], c["tokens_std"], ".0f"),
                  "–" if c["tokens_per_step_mean"] is None else f"{c['tokens_per_step_mean']:.0f}",
                  pm(c["tokens_per_question_mean"], c["tokens_per_question_std"], ".1f"),
                  style="bold green" if best else None)
    t.caption = ("mean±std over seeds; tokens: generated in training; best held-out success in "
                 "bold green; per-value columns in summary.csv")
    return t


# ----------------------------------------------------------------------------- what a method reads

# Keys only a method with a critic reads (the trainer skips them otherwise).
CRITIC_KEYS = frozenset({"algo.vf_coef", "algo.value_clip", "train.critic_warmup",
                         "train.critic_lr", "model.critic", "model.critic_path"})
# The registries whose entries make a method, by the config key that picks the entry.
_PARTS = {"algo.estimator": ("ESTIMATORS", "PREPARERS"), "algo.controller": ("CONTROLLERS",),
          "algo.loss": ("POLICY_LOSSES",)}
_PKG = Path(__file__).resolve().parent


class _Source:
    """The package's source, parsed (never imported: `ablate --method focus --beta 0,1` must
    fail in well under two seconds, before torch is loaded)."""

    def __init__(self, root: Path = _PKG):
        import ast

        self.ast = ast
        self.defs: dict[tuple[str, str], object] = {}     # (module, name) -> FunctionDef/ClassDef
        self.names: dict[str, dict[str, tuple]] = {}       # module -> local name -> target
        self.entries: dict[tuple[str, str], list] = {}     # (registry, entry) -> defs
        for path in sorted(root.rglob("*.py")):
            mod = ".".join(path.relative_to(root).with_suffix("").parts)
            tree = ast.parse(path.read_text())
            pkg = mod.rsplit(".", 1)[0] if "." in mod else ""
            if path.name == "__init__.py":
                mod = pkg = mod[: -len(".__init__")] if mod.endswith(".__init__") else ""
            local: dict[str, tuple] = {}
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    self.defs[(mod, node.name)] = node
                    local[node.name] = ("def", mod, node.name)
                    for d in node.decorator_list:
                        reg = self._registration(d)
                        if reg:
                            self.entries.setdefault(reg, []).append((mod, node))
                elif isinstance(node, ast.ImportFrom) and node.level:
                    base = pkg.split(".") if pkg else []
                    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                    src = ".".join([*base, *(node.module.split(".") if node.module else [])])
                    for a in node.names:
                        local[a.asname or a.name] = ("from", src, a.name)
            self.names[mod] = local

    def _registration(self, d) -> tuple[str, str] | None:
        ast = self.ast
        if (isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "register"
                and isinstance(d.func.value, ast.Name) and d.args
                and isinstance(d.args[0], ast.Constant) and isinstance(d.args[0].value, str)):
            return d.func.value.id, d.args[0].value
        return None

    def _resolve(self, mod: str, name: str, attr: str | None = None):
        t = self.names.get(mod, {}).get(name)
        if t is None:
            return None
        if t[0] == "def":
            return (t[1], t[2]) if attr is None else None
        src, what = t[1], t[2]
        if attr is not None:   # `from . import batched` then `batched.f`
            sub = f"{src}.{what}" if src else what
            return (sub, attr) if (sub, attr) in self.defs else None
        if (src, what) in self.defs:
            return (src, what)
        return self._resolve(src, what) if src in self.names and what in self.names[src] else None

    def reads(self, registry: str, entry: str) -> set[str]:
        """`algo.*` keys read by a registered entry and, transitively, by every package function
        or class it names (`algo.X`, `ctx.algo.X`, `self.algo.X`)."""
        ast = self.ast
        keys: set[str] = set()
        todo = [(m, n) for m, n in self.entries.get((registry, entry), [])]
        seen: set[tuple[str, str]] = set()
        while todo:
            mod, node = todo.pop()
            if (mod, node.name) in seen:
                continue
            seen.add((mod, node.name))
            for sub in ast.walk(node):
                if isinstance(sub, ast.Attribute):
                    v = sub.value
                    if (isinstance(v, ast.Name) and v.id == "algo") or \
                            (isinstance(v, ast.Attribute) and v.attr == "algo"):
                        keys.add(f"algo.{sub.attr}")
                    if isinstance(v, ast.Name) and isinstance(sub.ctx, ast.Load):
                        target = self._resolve(mod, v.id, sub.attr)
                        if target:
                            todo.append((target[0], self.defs[target]))
                elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                    target = self._resolve(mod, sub.id)
                    if target and target != (mod, node.name):
                        todo.append((target[0], self.defs[target]))
        return keys


_SOURCE: _Source | None = None


def _source() -> _Source:
    global _SOURCE
    if _SOURCE is None:
        _SOURCE = _Source()
    return _SOURCE


def method_reads(method: str, overrides: dict | None = None) -> frozenset[str]:
    """The config keys a method's run reads among those that only some methods read: the
    `algo.*` keys of its estimator (and the estimator's preparer), its controller and its
    loss, derived from their source; the trainer's own `algo.*` keys; the critic's keys when
    the recipe has a critic; and the keys its recipe sets. `overrides` (dotted key -> value)
    replace the recipe's parts, e.g. `{"algo.controller": "vine"}`."""
    from .methods import METHODS

    recipe = METHODS.get(method)
    parts = {**recipe.defaults, **(overrides or {})}
    src = _source()
    keys = set(_PARTS) | {"algo.agg", "algo.kl_coef"}                   # the trainer's (train/loop.py)
    for key, registries in _PARTS.items():
        name = str(parts.get(key, ""))
        for reg in registries:
            keys |= src.reads(reg, name)
    keys |= {k for k in recipe.defaults if k.startswith("algo.") or k in CRITIC_KEYS}
    if recipe.critic:
        keys |= CRITIC_KEYS
    return frozenset(keys)


def method_specific(key: str) -> bool:
    """Keys some methods ignore: `algo.*` and the critic's. Every other key (train.lr,
    rollout.*, env.*, model.name, ...) is read by every method."""
    return key.startswith("algo.") or key in CRITIC_KEYS


def readers(key: str) -> list[str]:
    """The methods whose recipe reads `key`."""
    from .methods import METHODS

    return [m for m in METHODS.names() if key in method_reads(m)]


def check_sweep(methods: list[str], axes: list["Axis"], fixed: dict | None = None) -> None:
    """Every swept method-specific key must be read by every method of the sweep (else the
    cells would be identical runs): ConfigError naming the methods that do read it. `fixed`:
    the base config's dotted overrides (`--config`, `--set`), which may swap a method's parts."""
    parts = {k: v for k, v in (fixed or {}).items() if k in _PARTS}
    for m in methods:
        for axis in axes:
            for label, sets in axis.values:
                over = {**parts, **dict(s.split("=", 1) for s in sets if s.split("=", 1)[0] in _PARTS)}
                reads = method_reads(m, over)
                for s in sets:
                    key = s.split("=", 1)[0]
                    if method_specific(key) and key not in reads:
                        who = readers(key)
                        raise ConfigError(
                            f"{m} does not read {key}, so sweeping it gives identical cells; "
                            + (f"methods that read it: {', '.join(who)} (--method {who[0]})"
                               if who else "no method reads it"))


def default_methods(axes: list["Axis"], default: str) -> tuple[list[str], str | None]:
    """No method chosen: the default method if it reads every swept key, else the one method
    that does (with a line saying so); several or none: ConfigError."""
    keys = [s.split("=", 1)[0] for a in axes for _, sets in a.values for s in sets]
    keys = [k for k in dict.fromkeys(keys) if method_specific(k)]
    if all(k in method_reads(default) for k in keys):
        return [default], None
    from .methods import METHODS

    fit = [m for m in METHODS.names() if all(k in method_reads(m) for k in keys)]
    swept = ", ".join(keys)
    if len(fit) == 1:
        return fit, (f"{swept}: read only by {fit[0]}, so this sweep runs {fit[0]} "
                     f"(the default method, {default}, ignores it)")
    if not fit:
        raise ConfigError(f"no method reads all of {swept}; sweep them in separate ablations")
    raise ConfigError(f"{default} (the default method) does not read {swept}; methods that do: "
                      f"{', '.join(fit)}; choose with --method")

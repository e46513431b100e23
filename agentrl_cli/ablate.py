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
resumes from it (`agentrl train --resume`); anything else starts over.
Cells run one after another in this process (`jobs = 1`) or as `jobs` parallel
`agentrl train` subprocesses (each with its log in `train.log`).

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
import itertools
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .config import ConfigError, RunConfig, load
from .registry import Registry


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
        return load(self.config_file, self.cell_sets(cell), method=cell.method, seed=seed,
                    out=str(self.run_dir(cell, seed)))


# ----------------------------------------------------------------------------- budget


def measure_budget(cfg: RunConfig) -> int:
    """Tokens one linear rollout step of `cfg` generates (step 1's tasks, the initial policy)."""
    import torch

    from .engines.hf import ENGINES, SamplingParams
    from .models.loading import load_policy
    from .rollout.runner import run_episodes
    from .train.loop import TaskSampler, make_spec, step_seed

    model, _, fmt, _ = load_policy(cfg, log=lambda s: None)
    spec = make_spec(cfg)
    engine = ENGINES.get(cfg.rollout.engine)(model, fmt.pad_id, next(model.parameters()).device)
    params = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens)
    tasks = TaskSampler(spec.tasks("train"), cfg.seed, cfg.rollout.tasks_per_step).for_step(1)
    pairs = [(t, g) for g, t in enumerate(tasks) for _ in range(cfg.rollout.group_size)]
    eps = run_episodes(engine, fmt, spec, pairs, params, cfg.rollout.max_tokens,
                       cfg.rollout.batch_size, torch.Generator().manual_seed(step_seed(cfg.seed, 1)))
    return sum(e.generated_tokens for e in eps)


def resolve_budget(out: Path, base: RunConfig, budget: int | None, log: Callable[[str], None]) -> int:
    """The sweep's budget: --budget, else the one recorded by an earlier run of this sweep, else
    the base config's rollout.budget_tokens, else measured (see the module docstring)."""
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
    return measure_budget(base)


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
        args = ["train", "--method", cell.method, "--seed", str(seed), "--out", str(run)]
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
        for i, (cell, seed) in enumerate(todo, 1):
            log(f"[{i}/{len(todo)}] {cell.name} seed {seed}")
            try:
                s = _train_here(sweep, cell, seed)
                ran.append((cell.name, seed))
                log(f"  held-out success {s['base_success']:.3f} -> {s['final_success']:.3f}, "
                    f"{s['tokens_generated']:,} tokens, {s['wall_seconds']:.0f}s")
            except (ConfigError, KeyboardInterrupt):
                raise
            except Exception as e:  # one failed cell must not lose the others
                failed.append((cell.name, seed, f"{type(e).__name__}: {e}"))
                log(f"  failed: {type(e).__name__}: {e}")
    else:
        ran, failed = _train_parallel(sweep, todo, jobs, log)
    return {"ran": ran, "skipped": [(c.name, s) for c, s in skipped], "failed": failed}


def _train_here(sweep: Sweep, cell: Cell, seed: int) -> dict:
    from .config import load_saved
    from .train.loop import train

    run = sweep.run_dir(cell, seed)
    if status(run) == "resumable":
        return train(load_saved(run), run, resume=str(run), log=lambda s: None)
    return train(sweep.cell_config(cell, seed), run, log=lambda s: None)


def _train_parallel(sweep: Sweep, todo, jobs: int, log) -> tuple[list, list]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))
    queue, running, ran, failed = list(todo), [], [], []
    n, started = len(todo), 0
    while queue or running:
        while queue and len(running) < jobs:
            cell, seed = queue.pop(0)
            run = sweep.run_dir(cell, seed)
            run.mkdir(parents=True, exist_ok=True)
            logf = (run / "train.log").open("w")
            running.append((subprocess.Popen(train_command(sweep, cell, seed), stdout=logf, stderr=subprocess.STDOUT, env=env),
                            cell, seed, logf))
            started += 1
            log(f"[{started}/{n}] started {cell.name} seed {seed} (log: {run / 'train.log'})")
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
            tail = (sweep.run_dir(cell, seed) / "train.log").read_text().strip().splitlines()[-1:]
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

    cells = []
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
            "axes": sorted({k for c in sweep.cells for k in c.params}), "cells": cells, "best": best}


def write_results(res: dict, out: Path) -> None:
    """summary.json, summary.csv, learning_curves.png, final_vs_param.png in `out`."""
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(res, indent=2))
    tmp.replace(out / "summary.json")
    top = max((c["final_success_mean"] for c in res["cells"] if c["final_success_mean"] is not None),
              default=None)
    cols = ["cell", "method", *res["axes"], "seeds", "final_success_mean", "final_success_std",
            "tokens_mean", "tokens_std", "tokens_per_step_mean", "tokens_per_question_mean",
            "tokens_per_question_std", "base_success_mean", "best"]
    tmp = out / "summary.csv.tmp"
    with tmp.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for c in res["cells"]:
            w.writerow([c["name"], c["method"], *[c["params"].get(a, "") for a in res["axes"]],
                        len(c["seeds"]), c["final_success_mean"], c["final_success_std"],
                        c["tokens_mean"], c["tokens_std"], c["tokens_per_step_mean"],
                        c["tokens_per_question_mean"], c["tokens_per_question_std"],
                        c["base_success_mean"],
                        top is not None and c["final_success_mean"] == top])
    tmp.replace(out / "summary.csv")
    plot_curves(res, out / "learning_curves.png")
    plot_final_vs_param(res, out / "final_vs_param.png")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(res: dict, png: Path) -> None:
    """Held-out success vs step per cell (mean over seeds at the common eval steps)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for c in res["cells"]:
        if not c["curves"]:
            continue
        steps = sorted(set.intersection(*[{s for s, _ in cv} for cv in c["curves"]]))
        ys = [sum(dict(cv)[s] for cv in c["curves"]) / len(c["curves"]) for s in steps]
        ax.plot(steps, ys, "o-", ms=3, label=c["name"], lw=2.5 if c["name"] == res["best"] else 1.2)
    ax.set_xlabel("step"), ax.set_ylabel("held-out success (mean over seeds)")
    ax.set_title(f"learning curves (budget {res['budget_tokens']} tokens/step)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def _num(label: str) -> float | None:
    try:
        return float(label)
    except ValueError:
        return None


def plot_final_vs_param(res: dict, png: Path) -> None:
    """Final held-out success (mean ± std) vs each swept parameter, one line per combination of
    the other parameters and the method; with no parameter, one point per method."""
    plt = _plt()
    axes = res["axes"] or ["method"]
    fig, subs = plt.subplots(1, len(axes), figsize=(5 * len(axes), 3.8), squeeze=False)
    done = [c for c in res["cells"] if c["final_success_mean"] is not None]
    for ax, a in zip(subs[0], axes):
        def val(c):
            return c["method"] if a == "method" else c["params"][a]
        labels = list(dict.fromkeys(val(c) for c in done))
        numeric = all(_num(x) is not None for x in labels)
        pos = {x: (_num(x) if numeric else i) for i, x in enumerate(labels)}
        groups: dict[str, list] = {}
        for c in done:
            rest = [c["method"]] * (a != "method") + [f"{k}={v}" for k, v in c["params"].items() if k != a]
            groups.setdefault(" ".join(rest) or "all", []).append(c)
        for g, cs in groups.items():
            cs = sorted(cs, key=lambda c: pos[val(c)])
            ax.errorbar([pos[val(c)] for c in cs], [c["final_success_mean"] for c in cs],
                        yerr=[c["final_success_std"] for c in cs], fmt="o-", capsize=3, label=g)
        if not numeric:
            ax.set_xticks(list(pos.values()), labels)
        ax.set_xlabel(a), ax.set_ylabel("final held-out success")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def record(sweep: Sweep, axes: list[Axis], preset: str | None) -> None:
    """`<out>/ablation.json`: what was swept and at which budget (read back on rerun)."""
    sweep.out.mkdir(parents=True, exist_ok=True)
    data = {"budget_tokens": sweep.budget, "seeds": sweep.seeds, "preset": preset,
            "methods": sorted({c.method for c in sweep.cells}),
            "axes": {a.name: [{"label": l, "sets": list(s)} for l, s in a.values] for a in axes},
            "config": sweep.config_file, "sets": sweep.base_sets,
            "cells": [dataclasses.asdict(c) for c in sweep.cells]}
    tmp = sweep.out / "ablation.json.tmp"
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(sweep.out / "ablation.json")


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

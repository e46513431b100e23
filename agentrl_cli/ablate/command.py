"""`agentrl ablate`'s library function: from the command's options to a finished sweep.

`ablate(request, log)` checks everything it can before any work (the swept keys and methods,
every cell's config, the output folder), takes the matched budget (`ablate.budget`), records
and prints the plan, runs every (cell, seed) (`ablate.run`) and writes the results
(`ablate.aggregate`). Ctrl-C keeps the finished runs and raises `Interrupted` with the command
that resumes the sweep. A rerun in the same `--out` that names fewer cells keeps the finished
cells of the earlier runs in the summary (`run.earlier_cells`: those that ran as this sweep
would run them).
"""
from __future__ import annotations

import dataclasses
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..config import RunConfig, _check_key, env_name, parse_sets, read_yaml
from ..errors import ConfigError
from ..methods import METHODS
from ..app.preflight import check_eval_tasks, load_checked
from ..envs.base import check_tiny_env
from ..envs.benchmarks import get_benchmark, load_benchmarks
from ..train.run_folder import check_output_dir
from .aggregate import collect, write_results
from .budget import sweep_budget
from .plan import PRESETS, Axis, Sweep, plan, plan_lines, record, values, warmup_warnings
from .reads import check_sweep, default_methods
from .run import check_rerun, earlier_cells, run_sweep
from .tune import Tuning, check_tuning, parse_tune, picks, run_tuning, tuned_cells, tuning_sweep


@dataclass
class Request:
    """What `agentrl ablate` was asked (its options; None: not given)."""

    methods: str | None = None            # comma list of methods
    beta: str | None = None               # comma lists of values of algo.beta, kappa, lam
    kappa: str | None = None
    lam: str | None = None
    grid: list[str] = field(default_factory=list)      # key=v1,v2 (repeatable)
    preset: str | None = None
    seeds: int = 1
    budget: int | None = None
    jobs: int = 1
    out: Path | None = None
    steps: int | None = None
    benchmark: str | None = None
    env: str | None = None                # --env: every run's env (as `agentrl train --env`)
    config: Path | None = None
    sets: list[str] = field(default_factory=list)
    seed: int | None = None
    arms: str | None = None               # comma list of a preset's arms (default: all)
    tune: list[str] = field(default_factory=list)      # [METHOD:]key=v1,v2 (repeatable)
    tune_seeds: int = 1                   # exploration seeds of each tuning point (100, 101, ...)


@dataclass
class Outcome:
    """A finished (or partly failed) sweep."""

    sweep: Sweep
    summary: dict                         # `aggregate.collect`'s per-cell results
    failed: list                          # (cell, seed, why) of the runs that failed
    tuning: dict | None = None            # the tuning stage's record (`ablate.tune.record`)


class Interrupted(Exception):
    """Ctrl-C during the sweep; `command` resumes it."""

    def __init__(self, command: str):
        super().__init__(command)
        self.command = command


def env_sets(env: str | None, benchmark: str | None) -> list[str]:
    """`--env NAME` as `--set`s every run of the sweep gets, as `agentrl train --env` gives
    them: the presets of the benchmarks.yaml entry of that env, if any, then `env.name`
    (a file made absolute); or `--benchmark`'s (`benchmark_sets`)."""
    if env is None:
        return benchmark_sets(benchmark)
    if benchmark is not None:
        raise ConfigError("give --benchmark or --env, not both")

    try:
        table = load_benchmarks()
    except ConfigError:
        table = {}
    same = sorted((b for b in table.values() if b.env == env), key=lambda b: b.name != env)
    presets = same[0].presets() if same else {}
    return [f"{k}={v}" for k, v in presets.items() if k != "env.name"] + [f"env.name={env_name(env)}"]


def benchmark_sets(name: str | None) -> list[str]:
    """`--benchmark NAME` as the `--set`s every run of the sweep gets (its env and presets),
    ahead of the user's own `--set`s so that those still override them."""
    if name is None:
        return []

    b = get_benchmark(name)
    b.check()
    return [f"{k}={v}" for k, v in b.presets().items()]


def swept(req: Request, fixed: dict, log: Callable[[str], None]) -> tuple[list[str], list[Axis]]:
    """The methods and the axes the options name, checked: unknown keys, methods and values,
    a key swept twice, and a method-specific key a method ignores are one-line errors."""
    axes: list[Axis] = []
    methods = list(PRESETS.get(req.preset).methods) if req.preset is not None else None
    if req.arms is not None:
        methods = list(dict.fromkeys(a.method for a in chosen_arms(req)))
    for key, text in (("algo.beta", req.beta), ("algo.kappa", req.kappa), ("algo.lam", req.lam)):
        if text is not None:
            axes.append(Axis.key(key, values(text, f"--{key.split('.')[1]}")))
    for g in req.grid:
        if "=" not in g:
            raise ConfigError(f"--grid expects key=v1,v2, got '{g}'")
        key, text = (x.strip() for x in g.split("=", 1))
        if key == "method":
            methods = values(text, "--grid method")
            continue
        _check_key(key)
        axes.append(Axis.key(key, values(text, f"--grid {key}")))
    if req.methods is not None:
        methods = values(req.methods, "--method")
    for m in methods or []:
        METHODS.get(m)  # an unknown name: one line listing the valid ones
    if len({a.name for a in axes}) != len(axes):
        raise ConfigError("the same key is swept twice")
    if methods is None and "method" not in fixed:
        methods, why = default_methods(axes, RunConfig.method)
        if why:
            log(f"[bold]agentrl ablate[/]: {why}")
    methods = methods or [str(fixed["method"])]
    check_sweep(methods, axes, fixed)
    return methods, axes


def cell_configs(sweep: Sweep) -> list[RunConfig]:
    """Every cell's config (first seed), checked as `agentrl train` checks its own before any
    work: values, plugin names, the held-out tasks within the eval split, and the sweep's
    last seed within the seed's bounds."""
    configs = [sweep.cell_config(c, sweep.seeds[0]) for c in sweep.cells]
    for cfg in configs:
        check_eval_tasks(cfg)
    if len(sweep.seeds) > 1:
        try:
            sweep.cell_config(sweep.cells[0], sweep.seeds[-1])
        except ConfigError as e:
            raise ConfigError(f"--seeds {len(sweep.seeds)} from seed {sweep.seeds[0]} runs seed "
                              f"{sweep.seeds[-1]}: {e}") from None
    return configs


def chosen_arms(req: Request) -> tuple:
    """The preset's arms `--arms` names (all of them without it), in the preset's order; an
    unknown name, or `--arms` without a preset that has arms, is a one-line error."""
    arms = PRESETS.get(req.preset).arms if req.preset is not None else ()
    if req.arms is None:
        return arms
    if not arms:
        raise ConfigError("--arms picks among a preset's named arms: give --preset allocation")
    names = values(req.arms, "--arms")
    known = [a.label for a in arms]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"--arms: no arm {', '.join(unknown)} in preset '{req.preset}' "
                          f"(its arms: {', '.join(known)})")
    return tuple(a for a in arms if a.label in names)


def resume_command(req: Request, methods: list[str], axes: list[Axis], base_sets: list[str],
                   out: Path, budget: int | None) -> str:
    """The command that continues this sweep: same cells, seeds and budget, same --out."""
    args = ["agentrl", "ablate", "--method", ",".join(methods)]
    if req.preset:
        args += ["--preset", req.preset]
    if req.arms:
        args += ["--arms", req.arms]
    for a in axes if not req.preset else []:
        args += ["--grid", f"{a.name}=" + ",".join(label for label, _ in a.values)]
    args += ["--seeds", str(req.seeds)]
    if req.seed is not None:
        args += ["--seed", str(req.seed)]
    if budget is not None:
        args += ["--budget", str(budget)]
    if req.jobs > 1:
        args += ["--jobs", str(req.jobs)]
    for t in req.tune:
        args += ["--tune", t]
    if req.tune:
        args += ["--tune-seeds", str(req.tune_seeds)]
    if req.config:
        args += ["--config", str(req.config)]
    for s in base_sets:
        args += ["--set", s]
    return " ".join(shlex.quote(a) for a in [*args, "--out", str(out)])


def prepare(req: Request, log: Callable[[str], None]) -> tuple[Sweep, RunConfig, list[Axis],
                                                                list[RunConfig], Callable,
                                                                Tuning | None]:
    """Every check before any work: what is swept and tuned, the base and every cell's and
    tuning point's config, the output folder. -> (sweep, base config, axes, cell configs,
    resume(budget) -> command, the tuning stage or None)."""
    base_sets = (env_sets(req.env, req.benchmark) + list(req.sets)
                 + ([f"train.steps={req.steps}"] if req.steps is not None else []))
    fixed = {**(read_yaml(req.config) if req.config else {}), **parse_sets(base_sets)}
    methods, axes = swept(req, fixed, log)   # cheap checks first: nothing heavy imported
    base = load_checked(str(req.config) if req.config else None, base_sets, seed=req.seed)
    if base.model.name == "tiny":
        check_tiny_env(base.env)
    if req.preset is not None:
        axes = PRESETS.get(req.preset).axes(base) + axes
        check_sweep(methods, axes, fixed)
    out = req.out or Path("runs") / f"ablate-{time.strftime('%Y%m%d-%H%M%S')}"
    arms = chosen_arms(req)
    sweep = Sweep(out, plan(methods, axes, arms), [base.seed + i for i in range(req.seeds)],
                  str(req.config) if req.config else None, base_sets)
    configs = cell_configs(sweep)        # a bad value: exit 2 here, before --out is made
    tuning = parse_tune(req.tune, methods, fixed, req.tune_seeds)
    if tuning is not None:
        check_tuning(tuning, axes, sweep.seeds)
        cell_configs(tuning_sweep(sweep, tuning))    # every tuning point's values, checked
    check_output_dir(out)                # a file or an unwritable place: before any run
    for w in warmup_warnings(configs):
        log(f"[yellow]warning[/]: {w}")
    return sweep, base, axes, configs, lambda b: resume_command(req, methods, axes, base_sets,
                                                                 out, b), tuning


def ablate(req: Request, log: Callable[[str], None] = print) -> Outcome:
    """Check, take the matched budget, tune each method (with `--tune`), record and print the
    plan, run every cell and seed at its method's pick, and write the results (module
    docstring)."""
    sweep, base, axes, configs, resume, tuning = prepare(req, log)
    command, rec = resume(req.budget), None
    try:
        sweep.budget = sweep_budget(sweep.out, base, req.budget, log)
        command = resume(sweep.budget)
        if tuning is not None:
            rec, failed = run_tuning(sweep, tuning, req.jobs, log, run_sweep)
            chosen = picks(rec)
            if chosen is None:           # a tuning run failed: no pick, no verdict runs
                return Outcome(sweep, _results(sweep, rec), failed, rec)
            sweep.cells = tuned_cells(sweep.cells, chosen)
            configs = cell_configs(sweep)
        check_rerun(sweep)                # before ablation.json or any run is rewritten
        whole = dataclasses.replace(sweep, cells=sweep.cells + earlier_cells(sweep, log))
        record(whole, axes, req.preset)
        for line in plan_lines(sweep, configs, req.jobs):
            log(line)
        res = run_sweep(sweep, jobs=req.jobs, log=log)
    except KeyboardInterrupt:
        raise Interrupted(command) from None
    return Outcome(whole, _results(whole, rec), res["failed"], rec)


def _results(sweep: Sweep, tuning: dict | None) -> dict:
    """The sweep's summary (`aggregate.collect`, with the tuning record), written to its folder."""
    summary = collect(sweep)
    if tuning is not None:
        summary["tuning"] = tuning
    write_results(summary, sweep.out)
    return summary

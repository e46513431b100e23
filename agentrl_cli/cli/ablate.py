"""agentrl ablate: sweeps over config keys, methods and seeds at a matched budget."""
from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from .options import BenchmarkOpt, ConfigOpt, SeedOpt, SetOpt, load_config, user_errors


def _values(text: str, what: str) -> list[str]:
    from ..errors import ConfigError

    vals = [v.strip() for v in text.split(",") if v.strip()]
    if not vals:
        raise ConfigError(f"{what} needs comma-separated values, got '{text}'")
    return vals


def _benchmark_sets(name: str | None) -> list[str]:
    """`--benchmark NAME` as the `--set`s every run of the sweep gets (its env and presets), ahead
    of the user's own `--set`s so that those still override them."""
    if name is None:
        return []
    from ..envs.benchmarks import get_benchmark

    b = get_benchmark(name)
    b.check()
    return [f"{k}={v}" for k, v in b.presets().items()]


def _resume_command(methods, axes, preset, seeds, budget, out, config, sets, seed, jobs) -> str:
    """The command that continues this sweep: same cells, seeds and budget, same --out."""
    args = ["agentrl", "ablate", "--method", ",".join(methods)]
    if preset:
        args += ["--preset", preset]
    for a in axes if not preset else []:
        args += ["--grid", f"{a.name}=" + ",".join(label for label, _ in a.values)]
    args += ["--seeds", str(seeds)]
    if seed is not None:
        args += ["--seed", str(seed)]
    if budget is not None:
        args += ["--budget", str(budget)]
    if jobs > 1:
        args += ["--jobs", str(jobs)]
    if config:
        args += ["--config", str(config)]
    for s in sets:
        args += ["--set", s]
    return " ".join(shlex.quote(a) for a in [*args, "--out", str(out)])


@user_errors
def ablate_cmd(
    method: Annotated[Optional[str], typer.Option("--method", "-m", help="Comma list of methods (a sweep axis), e.g. grpo,vineppo,focus. Default: the configured method, or the one method that reads the swept keys.")] = None,
    beta: Annotated[Optional[str], typer.Option("--beta", help="Sweep algo.beta (MPO), e.g. 0,0.5,1.")] = None,
    kappa: Annotated[Optional[str], typer.Option("--kappa", help="Sweep algo.kappa (FOCUS), e.g. 0.5,1,2.")] = None,
    lam: Annotated[Optional[str], typer.Option("--lam", help="Sweep algo.lam (PPO, MPO), e.g. 0.6,0.8,0.85.")] = None,
    grid: Annotated[Optional[list[str]], typer.Option("--grid", help="Sweep any key: --grid algo.lam_intra=0.9,0.95 (repeatable).")] = None,
    preset: Annotated[Optional[str], typer.Option("--preset", help="A paper's ablation: refinement, workspace, compaction-style (FOCUS), turn-ratio (MPO), trace-k (TRACE).")] = None,
    seeds: Annotated[int, typer.Option("--seeds", help="Seeds per cell (base seed, +1, ...).", min=1)] = 1,
    budget: Annotated[Optional[int], typer.Option("--budget", help="rollout.budget_tokens for every cell (default: measured, one GRPO-style step of the base config; 0: no cap).", min=0)] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Runs in parallel (subprocesses); 1 runs them here, one by one.", min=1)] = 1,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Sweep folder (default runs/ablate-<time>); rerun with the same folder to resume.")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", help="Shortcut for --set train.steps=N.")] = None,
    benchmark: BenchmarkOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    seed: SeedOpt = None,
):
    """Sweep config keys, methods and seeds: one `agentrl train` run per cell and seed; a rerun skips finished runs. Example: agentrl ablate --method mpo --beta 0,0.5,1 --seeds 2"""  # noqa: E501
    from .. import ablate as AB
    from ..config import parse_sets, read_yaml

    console = Console()
    log = lambda s: console.print(s, highlight=False)  # noqa: E731
    base_sets = (_benchmark_sets(benchmark) + list(set_ or [])
                 + ([f"train.steps={steps}"] if steps is not None else []))
    fixed = {**(read_yaml(config) if config else {}), **parse_sets(base_sets)}
    # 1. what is swept (cheap checks first: nothing heavy is imported before they pass)
    methods, axes = _swept(method, beta, kappa, lam, grid, preset, fixed, log)
    # 2. the base config and every cell's, before any model is loaded or rollout run
    base = load_config(config, base_sets, seed=seed)
    if preset is not None:
        axes = AB.PRESETS.get(preset).axes(base) + axes
        AB.check_sweep(methods, axes, fixed)
    cells = AB.plan(methods, axes)
    out = out or Path("runs") / f"ablate-{time.strftime('%Y%m%d-%H%M%S')}"
    seed_list = [base.seed + i for i in range(seeds)]
    sweep = AB.Sweep(out, cells, seed_list, str(config) if config else None, base_sets)
    configs = _cell_configs(sweep, seeds)  # a bad value: exit 2 here, before --out is made
    from ..train.run_folder import check_output_dir
    check_output_dir(out)                 # a file or an unwritable place: before any run
    for w in AB.warmup_warnings(configs):
        log(f"[yellow]warning[/]: {w}")

    def resume(tokens):                   # the command that continues this sweep
        return _resume_command(methods, axes, preset, seeds, tokens, out, config, base_sets,
                               seed, jobs)
    # 3. the matched budget, the plan, the runs
    res = _run(sweep, base, budget, axes, preset, configs, jobs, resume, log)
    _report(sweep, res, console, log)


def _cell_configs(sweep, seeds: int) -> list:
    """Every cell's config (first seed), checked as `agentrl train` checks its own before any
    work: values, plugin names, the held-out tasks within the eval split, and the sweep's
    last seed within the seed's bounds."""
    from ..errors import ConfigError
    from ..train.preflight import check_eval_tasks

    configs = [sweep.cell_config(c, sweep.seeds[0]) for c in sweep.cells]
    for cfg in configs:
        check_eval_tasks(cfg)
    if seeds > 1:
        try:
            sweep.cell_config(sweep.cells[0], sweep.seeds[-1])
        except ConfigError as e:
            raise ConfigError(f"--seeds {seeds} from seed {sweep.seeds[0]} runs seed "
                              f"{sweep.seeds[-1]}: {e}") from None
    return configs


def _swept(method, beta, kappa, lam, grid, preset, fixed: dict, log):
    """The methods and the axes (`ablate.Axis`) a sweep's options name, checked: unknown keys,
    methods and values, and a key swept twice, are one-line errors."""
    from .. import ablate as AB
    from ..config import RunConfig, _check_key
    from ..errors import ConfigError
    from ..methods import METHODS

    axes: list[AB.Axis] = []
    methods = None
    if preset is not None:
        p = AB.PRESETS.get(preset)
        methods = list(p.methods)
    for key, text in (("algo.beta", beta), ("algo.kappa", kappa), ("algo.lam", lam)):
        if text is not None:
            axes.append(AB.Axis.key(key, _values(text, f"--{key.split('.')[1]}")))
    for g in grid or []:
        if "=" not in g:
            raise ConfigError(f"--grid expects key=v1,v2, got '{g}'")
        key, text = g.split("=", 1)
        key = key.strip()
        if key == "method":
            methods = _values(text, "--grid method")
            continue
        _check_key(key)
        axes.append(AB.Axis.key(key, _values(text, f"--grid {key}")))
    if method is not None:
        methods = _values(method, "--method")
    for m in methods or []:
        METHODS.get(m)  # an unknown name: one line listing the valid ones
    if len({a.name for a in axes}) != len(axes):
        raise ConfigError("the same key is swept twice")
    if methods is None and "method" not in fixed:
        methods, why = AB.default_methods(axes, RunConfig.method)
        if why:
            log(f"[bold]agentrl ablate[/]: {why}")
    methods = methods or [str(fixed["method"])]
    AB.check_sweep(methods, axes, fixed)
    return methods, axes


def _run(sweep, base, budget, axes, preset, configs, jobs: int, resume, log) -> dict:
    """Measure (or take) the matched budget, record and print the plan, run every cell and seed.
    Ctrl-C keeps the finished runs and prints the command that resumes (`resume(budget)`)."""
    from .. import ablate as AB

    command = resume(budget)
    try:
        timing: dict = {}
        sweep.budget = AB.resolve_budget(sweep.out, base, budget, log, timing)
        command = resume(sweep.budget)
        AB.check_rerun(sweep)              # before ablation.json or any run is rewritten
        AB.record(sweep, axes, preset)
        for line in AB.plan_lines(sweep, configs, timing.get("rollout_seconds"), jobs):
            log(line)
        return AB.run_sweep(sweep, jobs=jobs, log=log)
    except KeyboardInterrupt:
        print(f"interrupted; finished runs are kept and a run with a checkpoint resumes. "
              f"Resume with: {command}", file=sys.stderr)
        raise typer.Exit(130)


def _report(sweep, res: dict, console: Console, log) -> None:
    """The summary table and files; exit 1 when a run failed."""
    from .. import ablate as AB

    out = sweep.out
    summary = AB.collect(sweep)
    AB.write_results(summary, out)
    console.print(AB.summary_table(summary))
    log(f"results: {out / 'summary.csv'} · {out / 'summary.json'} · {out / 'learning_curves.png'} · "
        f"{out / 'final_vs_param.png'}")
    if res["failed"]:
        for name, s, why in res["failed"]:
            log(f"[red]failed[/] {name} seed {s}: {why}")
        raise typer.Exit(1)

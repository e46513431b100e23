"""agentrl ablate: sweeps over config keys, methods and seeds at a matched budget."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from .options import ConfigOpt, SeedOpt, SetOpt, load_config, user_errors


def _values(text: str, what: str) -> list[str]:
    from ..config import ConfigError

    vals = [v.strip() for v in text.split(",") if v.strip()]
    if not vals:
        raise ConfigError(f"{what} needs comma-separated values, got '{text}'")
    return vals


@user_errors
def ablate_cmd(
    method: Annotated[Optional[str], typer.Option("--method", "-m", help="Comma list of methods (a sweep axis), e.g. grpo,vineppo,focus.")] = None,
    beta: Annotated[Optional[str], typer.Option("--beta", help="Sweep algo.beta, e.g. 0,0.5,1.")] = None,
    kappa: Annotated[Optional[str], typer.Option("--kappa", help="Sweep algo.kappa, e.g. 0.5,1,2.")] = None,
    lam: Annotated[Optional[str], typer.Option("--lam", help="Sweep algo.lam, e.g. 0.6,0.8,0.85.")] = None,
    grid: Annotated[Optional[list[str]], typer.Option("--grid", help="Sweep any key: --grid algo.lam_intra=0.9,0.95 (repeatable).")] = None,
    preset: Annotated[Optional[str], typer.Option("--preset", help="A paper's ablation: refinement, workspace, compaction-style (FOCUS), turn-ratio (MPO), trace-k (TRACE).")] = None,
    seeds: Annotated[int, typer.Option("--seeds", help="Seeds per cell (base seed, +1, ...).", min=1)] = 1,
    budget: Annotated[Optional[int], typer.Option("--budget", help="rollout.budget_tokens for every cell (default: measured, one GRPO-style step of the base config; 0: no cap).", min=0)] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Runs in parallel (subprocesses); 1 runs them here, one by one.", min=1)] = 1,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Sweep folder (default runs/ablate-<time>); rerun with the same folder to resume.")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", help="Shortcut for --set train.steps=N.")] = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    seed: SeedOpt = None,
):
    """Sweep config keys, methods and seeds: one `agentrl train` run per cell and seed; a rerun skips finished runs. Example: agentrl ablate --method mpo --beta 0,0.5,1 --seeds 2"""  # noqa: E501
    from ..ablate import PRESETS, Axis, Sweep, collect, plan, record, resolve_budget, run_sweep, \
        write_results, summary_table
    from ..config import ConfigError

    console = Console()
    log = lambda s: console.print(s, highlight=False)  # noqa: E731
    base_sets = list(set_ or []) + ([f"train.steps={steps}"] if steps is not None else [])
    base = load_config(config, base_sets, seed=seed)
    axes: list[Axis] = []
    methods = None
    if preset is not None:
        p = PRESETS.get(preset)
        axes += p.axes(base)
        methods = list(p.methods)
    for key, text in (("algo.beta", beta), ("algo.kappa", kappa), ("algo.lam", lam)):
        if text is not None:
            axes.append(Axis.key(key, _values(text, f"--{key.split('.')[1]}")))
    for g in grid or []:
        if "=" not in g:
            raise ConfigError(f"--grid expects key=v1,v2, got '{g}'")
        key, text = g.split("=", 1)
        key = key.strip()
        if key == "method":
            methods = _values(text, "--grid method")
            continue
        axes.append(Axis.key(key, _values(text, f"--grid {key}")))
    if method is not None:
        methods = _values(method, "--method")
    methods = methods or [base.method]
    if len({a.name for a in axes}) != len(axes):
        raise ConfigError("the same key is swept twice")
    cells = plan(methods, axes)
    out = out or Path("runs") / f"ablate-{time.strftime('%Y%m%d-%H%M%S')}"
    seed_list = [base.seed + i for i in range(seeds)]
    sweep = Sweep(out, cells, seed_list, str(config) if config else None, base_sets)
    sweep.budget = resolve_budget(out, base, budget, log)
    for c in cells:  # every cell's config is valid before anything runs
        sweep.cell_config(c, seed_list[0])
    record(sweep, axes, preset)
    log(f"[bold]agentrl ablate[/] {len(cells)} cells x {seeds} seed(s) = {len(cells) * seeds} runs, "
        f"budget {sweep.budget} tokens/step -> {out}")
    res = run_sweep(sweep, jobs=jobs, log=log)
    summary = collect(sweep)
    write_results(summary, out)
    console.print(summary_table(summary))
    log(f"results: {out / 'summary.csv'} · {out / 'summary.json'} · {out / 'learning_curves.png'} · "
        f"{out / 'final_vs_param.png'}")
    if res["failed"]:
        for name, s, why in res["failed"]:
            log(f"[red]failed[/] {name} seed {s}: {why}")
        raise typer.Exit(1)

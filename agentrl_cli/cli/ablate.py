"""agentrl ablate: sweeps over config keys, methods and seeds at a matched budget."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from .options import BenchmarkOpt, ConfigOpt, EnvOpt, SeedOpt, SetOpt, user_errors


@user_errors
def ablate_cmd(
    method: Annotated[Optional[str], typer.Option("--method", "-m", help="Comma list of methods (a sweep axis), e.g. grpo,vineppo,focus. Default: the configured method, or the one method that reads the swept keys.")] = None,
    beta: Annotated[Optional[str], typer.Option("--beta", help="Sweep algo.beta (MPO), e.g. 0,0.5,1.")] = None,
    kappa: Annotated[Optional[str], typer.Option("--kappa", help="Sweep algo.kappa (FOCUS), e.g. 0.5,1,2.")] = None,
    lam: Annotated[Optional[str], typer.Option("--lam", help="Sweep algo.lam (PPO, MPO), e.g. 0.6,0.8,0.85.")] = None,
    grid: Annotated[Optional[list[str]], typer.Option("--grid", help="Sweep any key: --grid algo.lam_intra=0.9,0.95 (repeatable).")] = None,
    preset: Annotated[Optional[str], typer.Option("--preset", help="A paper's ablation: refinement, workspace, compaction-style (FOCUS), turn-ratio (MPO), trace-k (TRACE); allocation (the tree methods and FOCUS's critic ladder, on an allocation-* benchmark).")] = None,
    arms: Annotated[Optional[str], typer.Option("--arms", help="With a preset of named arms (allocation): run only these, e.g. grpo,focus,focus-oracle.")] = None,
    seeds: Annotated[int, typer.Option("--seeds", help="Seeds per cell (base seed, +1, ...).", min=1)] = 1,
    budget: Annotated[Optional[int], typer.Option("--budget", help="rollout.budget_tokens for every cell (default: measured, one GRPO-style step of the base config; 0: no cap).", min=0)] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Runs in parallel (subprocesses); 1 runs them here, one by one.", min=1)] = 1,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Sweep folder (default runs/ablate-<time>); rerun with the same folder to resume.")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", help="Shortcut for --set train.steps=N.")] = None,
    tune: Annotated[Optional[list[str]], typer.Option("--tune", help="Tune before the sweep: [METHOD:]key=v1,v2 (repeatable); each method runs its grid (the --tune keys it reads, the same number of points for every method) on exploration seeds 100, 101, ... and its cells run at the point with the highest mean of held-out checks.")] = None,
    tune_seeds: Annotated[int, typer.Option("--tune-seeds", help="Exploration seeds per tuning point (100, 101, ...).", min=1)] = 1,
    benchmark: BenchmarkOpt = None,
    env: EnvOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    seed: SeedOpt = None,
):
    """Sweep config keys, methods and seeds: one `agentrl train` run per cell and seed; a rerun skips finished runs. Example: agentrl ablate --method mpo --beta 0,0.5,1 --seeds 2"""  # noqa: E501
    # deferred: CLI start-up
    from ..ablate.command import Interrupted, Request, ablate
    from ..reporting.ablation import summary_table, tuning_table

    console = Console()
    log = lambda s: console.print(s, highlight=False)  # noqa: E731
    req = Request(method, beta, kappa, lam, list(grid or []), preset, seeds, budget, jobs, out,
                  steps, benchmark, env, config, list(set_ or []), seed, arms,
                  tune=list(tune or []), tune_seeds=tune_seeds)
    try:
        res = ablate(req, log)
    except Interrupted as e:
        print(f"interrupted; finished runs are kept and a run with a checkpoint resumes. "
              f"Resume with: {e.command}", file=sys.stderr)
        raise typer.Exit(130)
    out = res.sweep.out
    if res.tuning is not None:
        console.print(tuning_table(res.tuning))
    console.print(summary_table(res.summary))
    log(f"results: {out / 'summary.csv'} · {out / 'summary.json'} · {out / 'learning_curves.png'} · "
        f"{out / 'final_vs_param.png'}" + (f" · {out / 'tuning.json'}" if res.tuning else ""))
    for name, s, why in res.failed:
        log(f"[red]failed[/] {name} seed {s}: {why}")
    if res.failed:
        raise typer.Exit(1)

"""agentrl diagnose: audit-tree | critic-rank | variance | tool-calls (docs/methods.md); the
analyses of past runs: table | tool-call-table | tree-info | episode-stats (docs/diagnostics.md)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from .options import ConfigOpt, EnvOpt, ModelOpt, SeedOpt, SetOpt, user_errors

app = typer.Typer(help="Critic and allocation diagnostics: audit-tree, critic-rank, variance, "
                       "tool-calls; analyses of past runs: table, tool-call-table, tree-info, "
                       "episode-stats.", no_args_is_help=True, add_completion=False)

RunsArg = Annotated[list[Path], typer.Argument(help="Run folders or `agentrl ablate` folders (their cells/*/seed-*).", show_default=False)]
JsonOpt = Annotated[Optional[Path], typer.Option("--json", help="Also write the results as JSON here.")]
PngOpt = Annotated[Optional[Path], typer.Option("--png", help="Figure path (default: see the command's help).")]


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _run_config(run_dir: Path | None, config, sets, **flags):
    """The config a run was trained with (its config.json), else the usual loader's."""
    # deferred: CLI start-up
    from ..app.preflight import load_config, load_saved_checked

    if run_dir is not None and (run_dir / "config.json").is_file():
        return load_saved_checked(run_dir, sets)
    return load_config(config, sets, **flags)


def _check_outputs(png: Path, json_path: Path | None) -> None:
    """The figure and JSON paths are writable files, checked before any work."""
    # deferred: CLI start-up
    from ..train.run_folder import check_output_file

    check_output_file(png, "--png")
    if json_path is not None:
        check_output_file(json_path, "--json")


def _outputs(console: Console, png: Path, json_path: Path | None, data: dict) -> None:
    # deferred: CLI start-up
    from ..diagnostics.report import write_json

    if json_path is not None:
        write_json(json_path, data)
    console.print(f"figure: {png}" + (f" · json: {json_path}" if json_path else ""), highlight=False)


@app.command("audit-tree")
@user_errors
def audit_tree_cmd(
    checkpoint: Annotated[Optional[Path], typer.Option("--checkpoint", help="Build the audit tree from this checkpoint (or run) on --env instead of the synthetic tree.")] = None,
    critics: Annotated[Optional[str], typer.Option("--critics", help="Comma list of: constant, random, trained (default: constant,random, plus trained for a checkpoint with a value head).")] = None,
    allocators: Annotated[Optional[str], typer.Option("--allocators", help="Comma list of allocators: registered names (focus, uniform, random, raw-residual), FILE.py:NAME or module:NAME (default: every registered one).")] = None,
    budget: Annotated[int, typer.Option("--budget", help="Most continuations spent (reported at 0, 1, 2, 4, ..., budget).", min=1)] = 256,
    seeds: Annotated[int, typer.Option("--seeds", help="Seeds averaged over.", min=1)] = 10,
    tasks: Annotated[int, typer.Option("--tasks", help="Task trees in the audit.", min=1)] = 4,
    roots: Annotated[int, typer.Option("--roots", help="Root episodes per task (the audit tree).", min=1)] = 2,
    depth: Annotated[int, typer.Option("--depth", help="Synthetic: turns per episode.", min=1)] = 6,
    branching: Annotated[int, typer.Option("--branching", help="Synthetic: next states per state.", min=1)] = 3,
    informative: Annotated[float, typer.Option("--informative", help="Synthetic: chance that a child of an uncertain state stays uncertain (the rest are near-deterministic).", min=0.0, max=1.0)] = 0.15,
    grow: Annotated[bool, typer.Option("--grow/--fixed", help="Synthetic: states reached by continuations are candidates too (as in training), not just the audit tree's.")] = False,
    constant: Annotated[str, typer.Option("--constant", help="Value of the constant critic: a number, or 'mean' (the tasks' mean true value).")] = "mean",
    samples: Annotated[int, typer.Option("--samples", help="Checkpoint: continuations per audit state (its value, and the pool continuations are drawn from).", min=1)] = 16,
    capacity: Annotated[int, typer.Option("--capacity", help="Continuations running at once.", min=1)] = 1,
    estimate: Annotated[str, typer.Option("--estimate", help="refined (Eq. 1 refined values) or calibrated (m_n).")] = "refined",
    kappa: Annotated[Optional[float], typer.Option("--kappa", help="Prior strength (default algo.kappa).")] = None,
    json_path: JsonOpt = None,
    png: PngOpt = None,
    env: EnvOpt = None,
    model: ModelOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    seed: SeedOpt = None,
):
    """Value MSE vs continuations for each allocator on an audit tree with known values.
    Example: agentrl diagnose audit-tree --json audit.json (figure: audit_tree.png)"""
    # deferred: CLI start-up
    from ..diagnostics.audit_tree import AuditRequest, audit_tree
    from ..diagnostics.report import audit_json, audit_tables, plot_audit

    png = png or Path("audit_tree.png")
    _check_outputs(png, json_path)
    console = Console()
    say = lambda s: console.print(s, highlight=False)  # noqa: E731
    ckpt = None
    if checkpoint is not None:
        # deferred: CLI start-up
        from ..train.checkpoint import find
        ckpt = find(checkpoint, log=say)
    cfg = _run_config(ckpt.parent.parent if ckpt else None, config, set_, env=env, model=model,
                      seed=seed)
    req = AuditRequest(checkpoint, _names(critics) if critics else None, _names(allocators) if allocators else None,
                       budget, seeds, tasks, roots, depth, branching, informative, grow, constant,
                       samples, capacity, estimate, kappa)
    res, title = audit_tree(req, cfg, ckpt, log=say)
    for t in audit_tables(res, title):
        console.print(t)
    plot_audit(res, png, title)
    _outputs(console, png, json_path, audit_json(res))


@app.command("critic-rank")
@user_errors
def critic_rank_cmd(
    run: Annotated[Path, typer.Option("--run", help="Run folder whose checkpoints/step-N/ have a critic.")],
    episodes: Annotated[int, typer.Option("--episodes", help="Episodes per checkpoint (one per held-out task).", min=1)] = 8,
    continuations: Annotated[int, typer.Option("--continuations", help="Fresh continuations per state (its Monte-Carlo value).", min=1)] = 16,
    json_path: JsonOpt = None,
    png: PngOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    seed: SeedOpt = None,
):
    """Spearman correlation of the critic with Monte-Carlo state values, per checkpoint.
    Example: agentrl diagnose critic-rank --run runs/focus0 (figure: RUN/critic_rank.png)"""
    # deferred: CLI start-up
    from ..diagnostics.critic_rank import critic_rank
    from ..diagnostics.report import critic_rank_table, plot_critic_rank

    _check_outputs(png or run / "critic_rank.png", json_path)
    console = Console()
    cfg = _run_config(run, config, set_, seed=seed)
    res = critic_rank(cfg, run, episodes, continuations, seed=0 if seed is None else seed,
                      log=lambda s: console.print(s, highlight=False))
    console.print(critic_rank_table(res))
    png = png or run / "critic_rank.png"
    plot_critic_rank(res, png)
    _outputs(console, png, json_path, res)


@app.command("variance")
@user_errors
def variance_cmd(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", help="Checkpoint (or run: its latest) with a critic.")],
    episodes: Annotated[int, typer.Option("--episodes", help="Episodes sampled on held-out tasks.", min=1)] = 64,
    json_path: JsonOpt = None,
    png: PngOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    seed: SeedOpt = None,
):
    """MPO's decomposition of within-episode critic variance into between- and within-turn parts.
    Example: agentrl diagnose variance --checkpoint runs/mpo0 (figure: variance.png)"""
    # deferred: CLI start-up
    from ..diagnostics.report import plot_variance, variance_table
    from ..diagnostics.variance import variance_report
    from ..train.checkpoint import find

    _check_outputs(png or Path("variance.png"), json_path)
    console = Console()
    ckpt = find(checkpoint, log=lambda s: console.print(s, highlight=False))
    cfg = _run_config(ckpt.parent.parent, config, set_, seed=seed)
    res = variance_report(cfg, ckpt, episodes, seed=0 if seed is None else seed)
    console.print(variance_table(res))
    png = png or Path("variance.png")
    plot_variance(res, png)
    _outputs(console, png, json_path, res)


@app.command("tool-calls")
@user_errors
def tool_calls_cmd(
    run: Annotated[Path, typer.Option("--run", help="Run folder (reads its metrics.jsonl).")],
    window: Annotated[int, typer.Option("--window", help="Trailing-mean window and the sustained-drop length, in steps.", min=1)] = 5,
    drop: Annotated[float, typer.Option("--drop", help="Collapse: tool calls below (1 - drop) x their peak.", min=0.01, max=0.99)] = 0.5,
    json_path: JsonOpt = None,
    png: PngOpt = None,
):
    """Tool calls per episode over training, flagging a tool-call collapse.
    Example: agentrl diagnose tool-calls --run runs/grpo0 (figure: RUN/tool_calls.png)"""
    # deferred: CLI start-up
    from ..diagnostics.report import plot_tool_calls, tool_calls_table
    from ..diagnostics.tool_calls import tool_call_trend

    _check_outputs(png or run / "tool_calls.png", json_path)
    console = Console()
    res = tool_call_trend(run, window, drop, log=lambda s: console.print(s, highlight=False))
    console.print(tool_calls_table(res))
    png = png or run / "tool_calls.png"
    plot_tool_calls(res, png)
    _outputs(console, png, json_path, res)


@app.command("table")
@user_errors
def table_cmd(
    runs: RunsArg,
    reference: Annotated[str, typer.Option("--reference", help="The method every row is paired with.")] = "grpo",
    checks: Annotated[Optional[str], typer.Option("--checks", help="LO-HI: the mean of checks over the checks at these steps only (exploration; not with --record).")] = None,
    record: Annotated[Optional[Path], typer.Option("--record", help="Also write the runs as a record (JSON) for docs/records.")] = None,
    command: Annotated[Optional[list[str]], typer.Option("--command", help="A command that made the runs, for the record (repeatable).")] = None,
    title: Annotated[Optional[str], typer.Option("--title", help="The record's title (default: its file name).")] = None,
    pass_k: Annotated[Optional[int], typer.Option("--pass-k", help="First evaluate pass@K of each run's last checkpoint (agentrl eval, K samples of each held-out task; kept in the run folder).", min=1)] = None,
):
    """The verdict table: one row per method (or sweep cell) over its seeds, paired with a reference.
    Example: agentrl diagnose table --reference grpo runs/methods"""
    # deferred: CLI start-up
    from ..diagnostics.analysis import verdict_table as vt
    from ..errors import ConfigError

    if record and checks:
        raise ConfigError("--record takes the mean of every check: a window chosen after the "
                          "runs is exploration, not a record")
    lo, hi = vt.check_window(checks)
    if pass_k:
        vt.evaluate_pass_at_k_under(runs, pass_k)
    rows = vt.load_runs(runs, lo, hi)
    print("\n".join(vt.table(rows, reference)))
    if record:
        this = f"agentrl diagnose table --reference {reference}" + (
            f" --pass-k {pass_k}" if pass_k else "") + " " + " ".join(str(p) for p in runs)
        rec = vt.record(rows, reference, [*(command or []), this], title or record.stem,
                        tuning=vt.tuning_of(runs))
        record.write_text(json.dumps(rec, indent=1) + "\n")
        print(f"record: {record}")


@app.command("tool-call-table")
@user_errors
def tool_call_table_cmd(
    runs: RunsArg,
    windows: Annotated[int, typer.Option("--windows", help="Equal stretches of training steps, one column each.", min=1)] = 4,
):
    """Tool calls per episode over training per method over its seeds, with each seed's collapse verdict.
    Example: agentrl diagnose tool-call-table runs/collapse"""
    # deferred: CLI start-up
    from ..diagnostics.analysis.tool_call_table import collect, table

    print(table(collect(runs, windows)))


@app.command("tree-info")
@user_errors
def tree_info_cmd(
    runs: Annotated[list[Path], typer.Argument(help="FOCUS run folders with saved traces (traces/step-*.json).", show_default=False)],
    json_path: JsonOpt = None,
):
    """How much a tree's states say about their paths' outcomes beyond the task, per depth of the state two paths share.
    Example: agentrl diagnose tree-info runs/long/cells/focus/seed-*"""
    # deferred: CLI start-up
    from ..diagnostics.analysis.tree_info import report, run_info
    from ..train.run_folder import check_output_file

    if json_path is not None:
        check_output_file(json_path, "--json")
    infos = [run_info(r) for r in runs]
    print("\n".join(report(infos)))
    if json_path is not None:
        json_path.write_text(json.dumps(infos, indent=1))


@app.command("episode-stats")
@user_errors
def episode_stats_cmd(
    benchmark: Annotated[str, typer.Option("--benchmark", "-b", help="A benchmarks.yaml entry (list: agentrl benchmarks).")] = "search-long",
    json_path: JsonOpt = None,
    set_: SetOpt = None,
    seed: Annotated[int, typer.Option("--seed", help="Run seed (the base evaluation's, as step 0 of agentrl train).")] = 0,
):
    """How long a benchmark's episodes are: held-out success and tool calls of the model's base evaluation and of the scripted expert.
    Example: agentrl diagnose episode-stats --benchmark search-long"""
    # deferred: CLI start-up
    from ..diagnostics.analysis.episode_stats import stats
    from ..app.preflight import load_config
    from ..train.run_folder import check_output_file

    if json_path is not None:
        check_output_file(json_path, "--json")
    cfg = load_config(None, [*(set_ or []), f"seed={seed}"], benchmark=benchmark)
    out = stats(cfg, benchmark)
    print(json.dumps(out, indent=2))
    if json_path is not None:
        json_path.write_text(json.dumps(out, indent=2))


@app.command("allocation-map")
@user_errors
def allocation_map_cmd(
    runs: RunsArg,
    out: Annotated[Path, typer.Option("--out", help="The PNG to write.")],
    reference: Annotated[str, typer.Option("--reference", help="The method every arm's gain is paired with.")] = "grpo",
    title: Annotated[str, typer.Option("--title", help="The figure's title.")] = "allocation study",
):
    """The allocation study's figure: held-out checks per arm, the paired gain over the reference, where continuations start.
    Example: agentrl diagnose allocation-map runs/alloc-early --out allocation-early.png"""
    # deferred: CLI start-up
    from ..diagnostics.analysis.allocation_map import plot
    from ..reporting.run_reader import runs_under
    from ..train.run_folder import check_output_file

    check_output_file(out, "--out")
    plot(runs_under(runs), reference, out, title)
    print(f"figure: {out}")

"""Rich tables and matplotlib figures of the diagnostics (what `agentrl diagnose` prints/writes)."""
from __future__ import annotations

import json
import math
from pathlib import Path

from rich.table import Table

from ..reporting import plots
from ..train.run_folder import atomic_write_text


def _fmt(x, nd: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "never"
    return f"{x:.{nd}f}"


def write_json(path: Path, data: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(data, indent=2, default=lambda o: None))


def audit_json(res: dict) -> dict:
    """The `--json` form: {critic: {allocator: {"budgets", "mse", "mse_std", ...}}}, per-seed
    curves reduced to the reported budgets."""
    out = {}
    for c, per in res.items():
        out[c] = {}
        for a, d in per.items():
            row = {k: v for k, v in d.items() if k != "curves"}
            row["mse_per_seed"] = [[cv[b] for b in d["budgets"]] for cv in d["curves"]]
            out[c][a] = row
    return out


# ----------------------------------------------------------------------------- audit tree


def audit_tables(res: dict, title: str) -> list[Table]:
    """One table per critic: a row per budget, a column per allocator (mean ± std over seeds,
    the lowest mean in green), and FOCUS's budget ratio against uniform."""
    tables = []
    for c, per in res.items():
        budgets = next(iter(per.values()))["budgets"]
        ratio = per.get("focus", {}).get("budget_ratio")
        t = Table(title=f"{title}\n{c} critic: value MSE vs continuations (mean ± std over seeds)")
        t.add_column("budget", justify="right")
        for a in per:
            t.add_column(a, justify="right")
        if ratio:
            t.add_column("ratio", justify="right")
        for j, b in enumerate(budgets):
            best = min(per, key=lambda a: per[a]["mse"][j])
            cells = [(f"[green]{d['mse'][j]:.4f}[/]" if a == best and j else f"{d['mse'][j]:.4f}")
                     + f"±{d['mse_std'][j]:.3f}" for a, d in per.items()]
            t.add_row(str(b), *cells, *([_fmt(ratio.get(str(b)), 2)] if ratio else []))
        if ratio:
            t.caption = ("ratio: the budget at which FOCUS reaches the MSE uniform reaches at "
                         "budget B, divided by B (median over seeds; < 1: FOCUS needs fewer)")
        tables.append(t)
    return tables


def plot_audit(res: dict, png: Path, title: str) -> None:
    """Value MSE vs continuations per allocator, one panel per critic: mean ± std over seeds,
    as in the tables."""
    fig, axes = plots.figure(len(res), width=5.0, height=3.9)
    for ax, (c, per) in zip(axes, res.items()):
        tops = []
        for i, (a, d) in enumerate(per.items()):
            b = [max(x, 0.5) for x in d["budgets"]]
            ls, marker = plots.STYLES[i % len(plots.STYLES)]
            line, = ax.plot(b, d["mse"], ls=ls, marker=marker, ms=3, label=a)
            ax.fill_between(b, [m - s for m, s in zip(d["mse"], d["mse_std"])],
                            [m + s for m, s in zip(d["mse"], d["mse_std"])],
                            color=line.get_color(), alpha=0.12, lw=0)
            tops += [m + s for m, s in zip(d["mse"], d["mse_std"])]
        ax.set_xscale("log", base=2)
        ax.set_xlabel("continuations spent (log scale; 0 drawn at 0.5)")
        plots.y_from_zero(ax, "value MSE vs truth (mean ± std over seeds)", tops)
        ax.set_title(f"{title}\n{c} critic", fontsize=9)
        plots.legend_outside(ax, title="allocator")
    plots.save(fig, png)


# ----------------------------------------------------------------------------- critic ranking


def critic_rank_table(res: dict) -> Table:
    t = Table(title=f"critic ranking: {res['run']} ({res['episodes']} episodes, "
                    f"{res['continuations']} continuations per state)")
    for c in ("step", "states", "spearman", "mean critic", "mean MC value", "|critic - MC|",
              "episode success"):
        t.add_column(c, justify="right")
    for r in res["checkpoints"]:
        t.add_row(str(r["step"]), str(r["states"]), _fmt(r["spearman"]), _fmt(r["mean_critic"]),
                  _fmt(r["mean_target"]), _fmt(r["mae"]), _fmt(r["episode_success"]))
    return t


def plot_critic_rank(res: dict, png: Path) -> None:
    rows = res["checkpoints"]
    fig, (a, b) = plots.figure(2, width=5.0)
    pts = [(r["step"], r["spearman"]) for r in rows if r["spearman"] is not None]
    a.plot([p[0] for p in pts], [p[1] for p in pts], "o-")
    a.axhline(0, color="grey", lw=0.8, ls="--")
    plots.step_axis(a, "checkpoint step")
    a.set_ylabel("Spearman(critic V, Monte Carlo value)")
    a.set_ylim(-1.05, 1.05)
    a.set_title(f"critic ranking: {plots.run_label(res['run'])}", fontsize=9)
    last = rows[-1]
    b.scatter(last["targets"], last["critic"], s=14)
    b.plot([0, 1], [0, 1], color="grey", ls="--", lw=0.8, label="critic = MC value")
    b.set_xlim(-0.05, 1.05), b.set_ylim(-0.05, 1.05)
    b.set_xlabel(f"Monte Carlo value ({res['continuations']} continuations)")
    b.set_ylabel("critic V(s)")
    b.set_title(f"states at step {last['step']}", fontsize=9)
    plots.legend_outside(b)
    plots.save(fig, png)


# ----------------------------------------------------------------------------- variance


def variance_table(res: dict) -> Table:
    t = Table(title=f"critic variance decomposition (MPO): {res['checkpoint']}")
    t.add_column("", style="bold")
    t.add_column("value", justify="right")
    t.add_column("MPO paper", justify="right")
    t.add_row("median share of within-episode variance between turns",
              _fmt(res["median_between_share"]), "0.895")
    t.add_row("episodes with between-turn > within-turn variance",
              _fmt(res["share_between_exceeds_within"]), "0.938")
    t.caption = (f"{res['used']} of {res['episodes']} episodes used ({res['single_turn']} single-turn, "
                 f"{res['constant_critic']} with a constant critic left out) · mean turns "
                 f"{res['mean_turns']:.2f} · success {res['success']:.3f}")
    return t


def plot_variance(res: dict, png: Path) -> None:
    fig, (ax,) = plots.figure(1, width=6.0)
    ax.hist(res["shares"], bins=20, range=(0, 1))
    if res["median_between_share"] is not None:
        ax.axvline(res["median_between_share"], color="k", ls="--",
                   label=f"median ({res['median_between_share']:.3f})")
    ax.axvline(0.895, color="tab:red", ls=":", label="MPO paper's median (0.895)")
    ax.set_xlim(0, 1)
    ax.set_xlabel("between-turn share of token-weighted critic variance")
    ax.set_ylabel("episodes")
    ax.set_title(f"critic variance decomposition: {Path(str(res['checkpoint'])).name}", fontsize=9)
    plots.legend_outside(ax)
    plots.save(fig, png)


# ----------------------------------------------------------------------------- tool calls


def tool_calls_table(res: dict, rows: int = 12) -> Table:
    t = Table(title=f"tool calls per episode: {res['run']} (trailing mean over {res['window']} steps)")
    for c in ("step", "tool calls / episode", "trailing mean", "success (trailing)", "eval tool calls"):
        t.add_column(c, justify="right")
    n = len(res["steps"])
    every = max(1, math.ceil(n / rows))
    idx = sorted(set(list(range(0, n, every)) + [n - 1]))
    for i in idx:
        s = res["steps"][i]
        t.add_row(str(s), f"{res['tool_calls'][i]:.2f}", f"{res['tool_calls_mean'][i]:.2f}",
                  f"{res['success_mean'][i]:.3f}", _fmt(res["eval_tool_calls"].get(str(s)), 2))
    c = res["collapse"]
    t.caption = ("[red]tool-call collapse[/] from step {step}: tool calls {peak_tool_calls:.2f} (peak at "
                 "step {peak_step}) -> {tool_calls_after:.2f}, success {success_at_peak:.3f} -> "
                 "{success_after:.3f}".format(**c) if c else
                 f"no tool-call collapse (no drop below {1 - res['drop']:.0%} of the peak sustained "
                 f"for {res['window']} steps with success falling)")
    return t


def plot_tool_calls(res: dict, png: Path) -> None:
    """Two panels on one step axis: tool calls per episode (from 0) and training success."""
    fig, (a, b) = plots.figure(1, width=7.5, height=2.6, rows=2, sharex=True)
    a.plot(res["steps"], res["tool_calls"], color="tab:blue", alpha=0.35, label="per step")
    a.plot(res["steps"], res["tool_calls_mean"], color="tab:blue", lw=2,
           label=f"trailing mean ({res['window']} steps)")
    ev = sorted((int(s), v) for s, v in res["eval_tool_calls"].items() if v is not None)
    if ev:
        a.plot([s for s, _ in ev], [v for _, v in ev], "o", color="tab:orange", label="held-out check")
    plots.y_from_zero(a, "tool calls per episode", res["tool_calls"])
    b.plot(res["steps"], res["success_mean"], color="tab:green", lw=2,
           label=f"trailing mean ({res['window']} steps)")
    plots.rate_axis(b, "training success", res["success_mean"])
    for ax in (a, b):
        if res["collapse"]:
            ax.axvline(res["collapse"]["step"], color="red", ls="--", label="collapse")
        plots.legend_outside(ax)
    plots.step_axis(b)
    verdict = "tool-call collapse" if res["collapse"] else "no tool-call collapse"
    a.set_title(f"tool calls: {plots.run_label(res['run'])} ({verdict})\n{res['run']}", fontsize=9)
    plots.save(fig, png)

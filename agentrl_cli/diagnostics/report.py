"""Rich tables and matplotlib figures of the diagnostics (what `agentrl diagnose` prints/writes)."""
from __future__ import annotations

import json
import math
from pathlib import Path

from rich.table import Table


def _fmt(x, nd: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "never"
    return f"{x:.{nd}f}"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_json(path: Path, data: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=lambda o: None))
    tmp.replace(path)


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
    plt = _plt()
    n = len(res)
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 3.8), squeeze=False)
    for ax, (c, per) in zip(axes[0], res.items()):
        for a, d in per.items():
            b = [max(x, 0.5) for x in d["budgets"]]
            se = [s / math.sqrt(len(d["curves"])) for s in d["mse_std"]]
            ax.plot(b, d["mse"], "o-", ms=3, label=a)
            ax.fill_between(b, [m - e for m, e in zip(d["mse"], se)],
                            [m + e for m, e in zip(d["mse"], se)], alpha=0.2)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("continuations spent (0 plotted at 0.5)")
        ax.set_ylabel("value MSE vs truth (mean ± s.e. over seeds)", fontsize=8)
        ax.set_title(f"{title}\n{c} critic", fontsize=8)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


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
    plt = _plt()
    rows = res["checkpoints"]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    pts = [(r["step"], r["spearman"]) for r in rows if r["spearman"] is not None]
    ax[0].plot([p[0] for p in pts], [p[1] for p in pts], "o-")
    ax[0].axhline(0, color="grey", lw=0.5)
    ax[0].set_xlabel("checkpoint step"), ax[0].set_ylabel("Spearman(critic, MC value)")
    ax[0].set_ylim(-1.05, 1.05)
    last = rows[-1]
    ax[1].scatter(last["targets"], last["critic"], s=12)
    ax[1].set_xlabel(f"MC value ({res['continuations']} continuations)")
    ax[1].set_ylabel("critic V(s)"), ax[1].set_title(f"step {last['step']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


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
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.hist(res["shares"], bins=20, range=(0, 1))
    if res["median_between_share"] is not None:
        ax.axvline(res["median_between_share"], color="k", ls="--", label="median")
        ax.legend()
    ax.set_xlabel("between-turn share of token-weighted critic variance")
    ax.set_ylabel("episodes")
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


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
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot(res["steps"], res["tool_calls"], alpha=0.4, label="tool calls / episode")
    ax.plot(res["steps"], res["tool_calls_mean"], label="trailing mean")
    ax.set_xlabel("step"), ax.set_ylabel("tool calls per episode")
    ax2 = ax.twinx()
    ax2.plot(res["steps"], res["success_mean"], color="tab:green", label="success (trailing)")
    ax2.set_ylabel("training success"), ax2.set_ylim(0, 1)
    if res["collapse"]:
        ax.axvline(res["collapse"]["step"], color="red", ls="--", label="collapse")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)

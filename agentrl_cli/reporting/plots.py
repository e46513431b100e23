"""The one plotting helper every figure of the product goes through (train, ablate, diagnose).

Conventions, so that every figure reads the same way:
- a step axis has integer ticks and is labelled "training step";
- every y axis is labelled, and its range is chosen not to magnify noise: rates live in [0, 1]
  (or from 0 to a little above the data), counts such as tokens start at 0 (`y_from_zero`);
- several seeds are one line, their mean, with a band of ± one sample std over seeds, the same
  "mean ± std" the tables print (`mean_band`);
- the base model's value is a dashed grey line (`base_line`);
- legends sit outside the axes, to the right (`legend_outside`), never on the data;
- the title names what was run: method, env, model, seed(s) (`run_title`);
- a single run's held-out checks carry error bars of ± one task-clustered standard error
  (`eval/success_se`); a sweep's spread is over seeds, and its figures say so and how many.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Sequence

from ..config import EnvConfig

STYLES = [("-", "o"), ("--", "s"), ("-.", "^"), (":", "D"), ("-", "v"), ("--", "P"), ("-.", "X")]


def plt():
    # deferred: matplotlib takes a second to import
    import matplotlib

    matplotlib.use("Agg")
    # deferred: matplotlib takes a second to import
    import matplotlib.pyplot as pyplot

    return pyplot


def figure(panels: int = 1, width: float = 6.0, height: float = 3.8, rows: int = 1, sharex=False):
    """`panels` axes side by side (or `rows` x panels); returns (fig, flat list of axes)."""
    fig, axes = plt().subplots(rows, panels, figsize=(width * panels, height * rows),
                               squeeze=False, sharex=sharex)
    return fig, [a for row in axes for a in row]


def save(fig, png: Path) -> None:
    """Write atomically (temp file + rename) and free the figure."""
    png = Path(png)
    tmp = png.with_name(f".{png.stem}.{os.getpid()}.tmp.png")
    fig.tight_layout()
    fig.savefig(tmp, dpi=100, bbox_inches="tight")
    plt().close(fig)
    os.replace(tmp, png)


def step_axis(ax, label: str = "training step") -> None:
    # deferred: matplotlib takes a second to import
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(label)


def rate_axis(ax, label: str, values: Sequence[float] = ()) -> None:
    """A success rate: from 0 to the data's top plus a margin (at least 0.5, at most 1)."""
    top = max([v for v in values if v is not None and math.isfinite(v)] or [0.0])
    ax.set_ylim(0, min(1.0, max(0.5, top * 1.15 + 0.02)))
    ax.set_ylabel(label)


def y_from_zero(ax, label: str, values: Sequence[float] = ()) -> None:
    """A count (tokens, tool calls): from 0, so that a 0.1% wobble looks like one."""
    top = max([v for v in values if v is not None and math.isfinite(v)] or [1.0])
    ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)
    ax.set_ylabel(label)


def base_line(ax, y: float | None, label: str = "base model") -> None:
    if y is not None:
        ax.axhline(y, color="grey", ls="--", lw=1.2, label=f"{label} ({y:.3f})")


def mean_std(series: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    """Pointwise mean and sample std (0 for one series) over equally long series."""
    means, stds = [], []
    for col in zip(*series):
        m = sum(col) / len(col)
        means.append(m)
        stds.append(math.sqrt(sum((x - m) ** 2 for x in col) / (len(col) - 1)) if len(col) > 1 else 0.0)
    return means, stds


def mean_band(ax, xs: Sequence[float], series: Sequence[Sequence[float]], label: str, i: int = 0,
              lw: float = 1.6) -> None:
    """One line: the mean over `series` (seeds) with a ± std band; style `i` of STYLES, so
    identical lines stay distinguishable by dash and marker."""
    ls, marker = STYLES[i % len(STYLES)]
    m, s = mean_std(series)
    n = len(series)
    line, = ax.plot(xs, m, ls=ls, marker=marker, ms=4, lw=lw,
                    label=label + (f" (n={n})" if n > 1 else ""))
    if n > 1:
        ax.fill_between(xs, [a - b for a, b in zip(m, s)], [a + b for a, b in zip(m, s)],
                        color=line.get_color(), alpha=0.15, lw=0)


def legend_outside(ax, fontsize: int = 8, title: str | None = None) -> None:
    h, lab = ax.get_legend_handles_labels()
    if h:
        ax.legend(h, lab, fontsize=fontsize, title=title, title_fontsize=fontsize,
                  loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0, frameon=False)


def run_title(method: str | None = None, env: str | None = None, seeds=None, extra: str = "",
              model: str | None = None) -> str:
    """'focus on search, model tiny, seed 0' (+ a second line `extra`)."""
    head = " on ".join(str(x) for x in (method, env) if x)
    if model:
        head += (", " if head else "") + f"model {_short_model(model)}"
    if seeds is not None:
        seeds = list(seeds) if isinstance(seeds, (list, tuple)) else [seeds]
        head += (", " if head else "") + ("seed " if len(seeds) == 1 else "seeds ") + ",".join(map(str, seeds))
    return head + (f"\n{extra}" if extra else "")


def env_label(env: dict, context: dict | None = None) -> str:
    """An env section (and context section) as a title says it: the env's name, plus what sets
    it apart from the name's defaults: 'search, 4-5 hops, compaction, 0.05/call' for the
    compaction variant of the long horizon, 'search' for the default one."""
    base = EnvConfig()
    out = [str(env.get("name", "?"))]
    hops = (env.get("min_hops", base.min_hops), env.get("max_hops", base.max_hops))
    if hops != (base.min_hops, base.max_hops):
        out.append(f"{hops[0]}-{hops[1]} hops")
    operator = (context or {}).get("operator", "none")
    if operator != "none":
        out.append(operator)
    if env.get("call_cost"):
        out.append(f"{env['call_cost']:g}/call")
    return ", ".join(out)


def run_label(run) -> str:
    """'mpo on search, seed 0' from a run folder's config.json (the env as `env_label` says it),
    else the folder's name."""
    p = Path(str(run))
    try:
        cfg = json.loads((p / "config.json").read_text())
        return run_title(cfg.get("method"), env_label(cfg.get("env") or {}, cfg.get("context")),
                         cfg.get("seed"))
    except (OSError, ValueError, AttributeError):
        return p.name


def _short_model(model: str) -> str:
    """A model folder's last two parts ('runs/x/step-40' -> 'x/step-40'); a hub id as it is."""
    parts = Path(str(model)).parts
    return str(model) if len(parts) <= 2 else "/".join(parts[-2:])


def learning_curve(rows: Sequence[dict], png: Path, method: str | None = None,
                   env: str | None = None, model: str | None = None, seed=None,
                   checks: str = "") -> None:
    """A run's figure from its metrics.jsonl rows, titled with its method, env, model and seed.
    Left: held-out success at each check with ± one standard error (`eval/success_se`, over
    tasks), the base model's check as a dashed line with its ± se band, and the sampled
    training success per step. Right: generated tokens per held-out question, from 0.
    `checks` (e.g. '8 tasks x 4 samples') is printed under the title."""
    tr = [r for r in rows if "success" in r]
    ev = [r for r in rows if "eval/success" in r]
    base = next((r for r in ev if r["step"] == 0), None)
    fig, (a, b) = figure(2, width=5.6)
    if tr:
        a.plot([r["step"] for r in tr], [r["success"] for r in tr], color="tab:blue", alpha=0.35,
               lw=1, label="training episodes (sampled)")
    se = [r.get("eval/success_se") or 0.0 for r in ev]
    a.errorbar([r["step"] for r in ev], [r["eval/success"] for r in ev], yerr=se, fmt="o-",
               color="tab:orange", ms=4, capsize=3, label="held-out check (± se)")
    if base is not None:
        bse = base.get("eval/success_se")
        base_line(a, base["eval/success"], "base model ± se" if bse else "base model")
        if bse:
            a.axhspan(base["eval/success"] - bse, base["eval/success"] + bse, color="grey",
                      alpha=0.12, lw=0)
    step_axis(a)
    rate_axis(a, "success rate", [r["success"] for r in tr]
              + [r["eval/success"] + s for r, s in zip(ev, se)])
    a.set_title("held-out success (± standard error over tasks)", fontsize=10)
    legend_outside(a)
    tok = [r["eval/tokens_per_question"] for r in ev if "eval/tokens_per_question" in r]
    b.plot([r["step"] for r in ev if "eval/tokens_per_question" in r], tok, "o-", color="tab:orange", ms=4)
    step_axis(b)
    y_from_zero(b, "generated tokens per held-out question", tok)
    b.set_title("episode length on the held-out check", fontsize=10)
    fig.suptitle(run_title(method, env, seed, extra=f"held-out check: {checks}" if checks else "",
                           model=model), fontsize=11)
    save(fig, png)

"""`agentrl ablate`'s table and figures, from the results `ablate.aggregate.collect` gives:
`summary_table` (rich), `plot_curves` (held-out success vs step per cell) and
`plot_final_vs_param` (final success vs each swept value)."""
from __future__ import annotations

from pathlib import Path

from rich.table import Table

from . import plots


def _spread(res: dict) -> str:
    """What a sweep figure's lines and bars are: 'mean ± std over 3 seeds' (a cell with fewer
    finished seeds says n=k in its legend); with one seed there is no spread to show."""
    n = len(res["seeds"])
    return f"mean ± std over {n} seeds" if n > 1 else "1 seed (no spread over seeds)"


def _title(res: dict, what: str) -> str:
    methods = ",".join(dict.fromkeys(c["method"] for c in res["cells"]))
    return plots.run_title(methods, res.get("env"), res["seeds"],
                           f"{what}, {_spread(res)} · budget "
                           f"{res['budget_tokens'] or 'uncapped'} tokens/step")


def plot_curves(res: dict, png: Path) -> None:
    """Held-out success vs step per cell: the mean over its seeds (at the eval steps they share)
    with a ± std band, the base model's success dashed, the best cell drawn thicker."""
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


def tuned_label(cell: dict) -> str:
    """A cell's tuned values, `lr=0.0005 focus_norm=contrast` (last part of each key); "" when
    its method was not tuned."""
    return " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in (cell.get("tuned") or {}).items())


def summary_table(res: dict):
    """One row per cell: mean ± std over seeds of the final held-out success, the tokens
    generated in training, per step and per held-out question (the best success in bold green).
    A cell with fewer finished seeds than the sweep shows its count (n=...)."""
    def pm(m, s, fmt):
        return "–" if m is None else f"{m:{fmt}}±{s:{fmt}}"

    t = Table(title=f"ablation {res['out']}: budget {res['budget_tokens']} tokens/step, "
                    f"seeds {','.join(map(str, res['seeds']))}")
    tuned = any(c.get("tuned") for c in res["cells"])
    t.add_column("cell", no_wrap=True)
    if tuned:
        t.add_column("tuned (picked)")
    for c in ("held-out success", "tokens", "tok/step", "tasks/step", "mixed", "tok/question"):
        t.add_column(c, justify="right")
    top = max((c["final_success_mean"] for c in res["cells"] if c["final_success_mean"] is not None),
              default=None)
    for c in res["cells"]:
        best = top is not None and c["final_success_mean"] == top
        n = len(c["seeds"])
        t.add_row(c["name"], *([tuned_label(c) or "–"] if tuned else []),
                  pm(c["final_success_mean"], c["final_success_std"], ".3f")
                  + (f" (n={n})" if n < len(res["seeds"]) else ""),
                  pm(c["tokens_mean"], c["tokens_std"], ".0f"),
                  _one(c.get("tokens_per_step_mean"), ".0f"),
                  _one(c.get("tasks_per_step_mean"), ".1f"),
                  _one(c.get("mixed_groups_mean"), ".2f"),
                  pm(c["tokens_per_question_mean"], c["tokens_per_question_std"], ".1f"),
                  style="bold green" if best else None)
    t.caption = ("mean±std over seeds; tokens: generated in training; tasks/step: distinct tasks "
                 "a step learnt from; mixed: share of a step's groups (trees) with mixed outcomes; "
                 "best held-out success in bold green; per-value columns in summary.csv"
                 + ("; tuned: each method's pick of the tuning stage (tuning.json)" if tuned else ""))
    return t


def _one(x, fmt: str) -> str:
    return "–" if x is None else f"{x:{fmt}}"


def tuning_table(rec: dict):
    """The tuning stage: one row per (method, point) with its tuning runs' mean of checks per
    seed and its score; each method's pick in bold."""
    t = Table(title=f"tuning: {rec['runs_per_method']} run(s) per method on seeds "
                    f"{','.join(map(str, rec['seeds']))}, picked by the mean of checks")
    for col in ("method", "point", "mean of checks per seed", "score"):
        t.add_column(col, justify="right" if col == "score" else "left")
    for m, d in rec["methods"].items():
        for p in d["points"]:
            picked = d["pick"] is not None and d["pick"]["values"] == p["values"]
            t.add_row(m, " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in p["values"].items())
                      or "(defaults)",
                      " ".join("–" if v is None else f"{v:.3f}" for v in p["mean_of_checks"].values())
                      or "–", _one(p["score"], ".3f"), style="bold" if picked else None)
    return t

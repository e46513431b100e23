"""What a user sees: the step line, held-out standard errors (metrics, summary, tables), the
figures' titles and spreads, and what `agentrl rollout` writes by default."""
from __future__ import annotations

import io
import json
import math

import pytest
from rich.console import Console
from typer.testing import CliRunner

from agentrl_cli import config
from agentrl_cli.cli.main import app
from agentrl_cli.evaluation import runner as eval_runner
from agentrl_cli.evaluation.runner import task_clustered_se
from agentrl_cli.reporting import live, plots
from agentrl_cli.train import loop

from conftest import MICRO
from agentrl_cli.app.train import train as checked_train

# per-task success of every held-out check in the run below: task 0 always, task 1 on its
# first sample, task 2 never -> per-task means 1, 0.5, 0
PATTERN = {0: [True, True], 1: [True, False], 2: [False, False]}
HAND_SE = 0.5 / math.sqrt(3)        # sample std of (1, 0.5, 0) is 0.5; over sqrt(3 tasks)


def test_task_clustered_se_is_the_std_over_tasks_of_task_means_over_sqrt_tasks():
    assert task_clustered_se([1.0, 0.5, 0.0]) == pytest.approx(HAND_SE)
    assert task_clustered_se([0.25, 0.25, 0.25, 0.25]) == 0.0
    assert task_clustered_se([0.7]) is None


def _scripted_checks(monkeypatch):
    """Held-out checks whose per-task results are PATTERN (the micro model never succeeds)."""
    real, seen = eval_runner.run_episodes, {}

    def scripted(*a, **k):
        eps = real(*a, **k)
        for e in eps:
            i = seen.setdefault(e.group, [])
            e.success = PATTERN[e.group][len(i) % 2]
            i.append(1)
        return eps

    def per_check(*a, **k):
        seen.clear()
        return real_evaluate(*a, **k)

    real_evaluate = loop.evaluate
    monkeypatch.setattr(eval_runner, "run_episodes", scripted)
    monkeypatch.setattr(loop, "evaluate", per_check)


@pytest.fixture(scope="module")
def scripted_run(tmp_path_factory):
    """A 2-step grpo run, a held-out check at steps 0 and 2 only, with its step lines."""
    mp = pytest.MonkeyPatch()
    _scripted_checks(mp)
    out = tmp_path_factory.mktemp("run") / "run"
    buf = io.StringIO()
    cfg = config.load(method="grpo", sets=MICRO + ["train.steps=2", "train.eval_every=2",
                                                    "train.eval_samples=2"])
    try:
        summary = checked_train(cfg, out, log=lambda s: None,
                             progress=live.TrainProgress(Console(file=buf, width=200)))
    finally:
        mp.undo()
    return out, summary, buf.getvalue()


def test_metrics_rows_carry_the_task_clustered_se_at_every_check(scripted_run):
    out, _, _ = scripted_run
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    checks = [r for r in rows if "eval/success" in r]
    assert [r["step"] for r in checks] == [0, 2]
    for r in checks:
        assert r["eval/success"] == pytest.approx(0.5)
        assert r["eval/success_se"] == pytest.approx(HAND_SE)
    assert not any("eval/success_se" in r for r in rows if "eval/success" not in r)


def test_summary_json_has_base_and_final_se(scripted_run):
    out, summary, _ = scripted_run
    on_disk = json.loads((out / "summary.json").read_text())
    for s in (summary, on_disk):
        assert s["base_success_se"] == pytest.approx(HAND_SE)
        assert s["final_success_se"] == pytest.approx(HAND_SE)


def test_step_line_shows_a_dash_between_checks_and_value_se_at_a_check(scripted_run):
    _, _, text = scripted_run
    lines = {ln.split()[1]: ln for ln in text.splitlines() if ln.startswith("step ")}
    assert "held-out –" in lines["1"], lines["1"]          # no check at step 1
    assert "held-out 0.50±0.29" in lines["2"], lines["2"]  # the check at step 2


def test_summary_table_shows_se_for_base_and_trained(scripted_run):
    _, summary, _ = scripted_run
    buf = io.StringIO()
    Console(file=buf, width=200).print(live.summary_table(summary))
    row = next(ln for ln in buf.getvalue().splitlines() if "held-out success" in ln)
    assert row.count("0.500±0.289") == 2, row
    assert "standard error" in buf.getvalue()


def test_eval_report_shows_mean_at_1_with_se():
    res = {"pass@k": {"1": 0.5}, "pass^k": {"1": 0.5}, "mean@1": 0.5, "mean@1_se": HAND_SE,
           "tokens_per_question": 10.0, "n": 2, "tasks": 3}
    buf = io.StringIO()
    Console(file=buf, width=200).print(live.eval_table(res, "x"))
    assert "mean@1 0.500±0.289" in buf.getvalue()


class _Grab:
    """plots.save replaced: keep the figure instead of writing it."""

    def __init__(self, monkeypatch):
        self.figs = []
        monkeypatch.setattr(plots, "save", lambda fig, png: self.figs.append(fig))


def _errorbars(ax):
    from matplotlib.container import ErrorbarContainer

    return [c for c in ax.containers if isinstance(c, ErrorbarContainer)]


def test_run_learning_curve_names_the_run_and_has_se_bars(scripted_run, monkeypatch):
    out, _, _ = scripted_run
    assert (out / "learning_curve.png").is_file()
    from agentrl_cli.reporting.metrics import read_metrics

    grab = _Grab(monkeypatch)
    plots.learning_curve(read_metrics(out / "metrics.jsonl"), out / "x.png", method="grpo",
                         env="search", model="tiny", seed=0, checks="3 tasks x 2 samples")
    fig = grab.figs[0]
    title = fig._suptitle.get_text()
    for part in ("grpo on search", "model tiny", "seed 0", "3 tasks x 2 samples"):
        assert part in title, title
    ax = fig.axes[0]
    (bars,) = _errorbars(ax)
    segs = bars.lines[2][0].get_segments()              # one vertical bar per check
    assert [s[1][1] - s[0][1] for s in segs] == pytest.approx([2 * HAND_SE] * 2)
    assert any("base model" in t.get_text() for t in ax.get_legend().get_texts())


def _sweep(seeds):
    curve = lambda s: [(0, 0.2), (2, 0.3 + 0.1 * s)]                    # noqa: E731
    cells = []
    for name, method, beta in (("grpo-b0", "grpo", "0"), ("grpo-b1", "grpo", "1")):
        fin = [0.3 + 0.1 * s for s in seeds]
        m = sum(fin) / len(fin)
        sd = math.sqrt(sum((x - m) ** 2 for x in fin) / (len(fin) - 1)) if len(fin) > 1 else 0.0
        cells.append({"name": name, "method": method, "params": {"algo.beta": beta},
                      "seeds": list(seeds), "final_success_mean": m, "final_success_std": sd,
                      "base_success": [0.2] * len(seeds), "curves": [curve(s) for s in seeds]})
    return {"budget_tokens": 1234, "seeds": list(seeds), "env": "search",
            "axes": ["algo.beta"], "cells": cells, "best": "grpo-b0"}


def test_ablate_figures_say_mean_std_over_n_seeds_and_the_budget(monkeypatch, tmp_path):
    from matplotlib.collections import PolyCollection

    from agentrl_cli.reporting import ablation as ablate

    grab = _Grab(monkeypatch)
    res = _sweep([0, 1, 2])
    ablate.plot_curves(res, tmp_path / "a.png")
    ablate.plot_final_vs_param(res, tmp_path / "b.png")
    curves, final = grab.figs
    for fig in (curves, final):
        text = fig.axes[0].get_title() + (fig._suptitle.get_text() if fig._suptitle else "")
        assert "mean ± std over 3 seeds" in text, text
        assert "1234" in text, text
    assert any(isinstance(c, PolyCollection) for c in curves.axes[0].collections)   # the band
    (bars,) = _errorbars(final.axes[0]) or [None]
    assert bars is not None and bars.has_yerr


def test_ablate_figure_with_one_seed_says_there_is_no_spread(monkeypatch, tmp_path):
    from agentrl_cli.reporting import ablation as ablate

    grab = _Grab(monkeypatch)
    ablate.plot_curves(_sweep([0]), tmp_path / "a.png")
    assert "1 seed" in grab.figs[0].axes[0].get_title()


def _rollout(args, tmp_path):
    out = tmp_path / "out.jsonl"
    argv = ["rollout", "--out", str(out), *args]
    for s in MICRO:
        argv += ["--set", s]
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 0, r.output
    return [json.loads(x) for x in out.read_text().splitlines()], r.output


def test_bare_rollout_writes_n_linear_episodes(tmp_path):
    """No --method: plain episodes, even though the default recipe (focus) grows trees."""
    rows, text = _rollout(["--n", "3"], tmp_path)
    assert len(rows) == 3 and "trees" not in text
    for r in rows:
        assert "token_ids" in r and "response_mask" in r and "nodes" not in r


def test_rollout_group_size_counts_episodes_for_a_linear_method(tmp_path):
    rows, _ = _rollout(["--method", "grpo", "--n", "3", "-g", "2"], tmp_path)
    assert [r["group"] for r in rows] == [0, 0, 1]


def test_rollout_tree_method_n_counts_trees_one_per_task(tmp_path):
    rows, text = _rollout(["--method", "focus", "--n", "3", "-g", "2"], tmp_path)
    assert len(rows) == 3 and len({r["task_id"] for r in rows}) == 3
    assert all("nodes" in r and r["episodes"] for r in rows)
    assert "in 3 trees" in text


def test_rollout_help_says_what_n_counts():
    r = CliRunner().invoke(app, ["rollout", "--help"], env={"COLUMNS": "300"})
    text = " ".join(r.output.split())
    assert "Plain (linear) episodes unless --method names a tree method" in text
    assert "number of trees, one per task" in text


def test_ablate_step_lines_show_a_dash_between_checks():
    from agentrl_cli.ablate.run import StepLines

    lines = []
    s = StepLines("cell seed 0", lines.append)
    s.start(2, 0)
    row = {"reward/mean": 0.0, "rollout/tokens": 10, "time/step": 0.1}
    s.update(1, row)
    s.update(2, {**row, "eval/success": 0.5, "eval/success_se": HAND_SE})
    assert "held-out –" in lines[0] and "held-out 0.50±0.29" in lines[1], lines


def test_step_lines_print_the_eta_at_the_run_pace():
    """A train step line (no terminal) ends with the time left: the run's seconds per step so
    far (checks included) times the steps left; 0s at the last step."""
    clock = iter([100.0, 110.0, 130.0, 160.0])
    buf = io.StringIO()
    p = live.TrainProgress(Console(file=buf, width=60), clock=lambda: next(clock))
    p.start(total=4, done=1)                   # a resumed run: steps 2-4 left
    row = {"reward/mean": 0.5, "tokens/s": 100.0, "rollout/tool_calls": 2.0, "time/step": 10.0}
    for step in (2, 3, 4):
        p.update(step, row)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 3                     # one line a step, even on a narrow console
    assert lines[0].endswith("(10.0s, ETA 20s)"), lines     # 10 s for 1 step, 2 left
    assert lines[1].endswith("(10.0s, ETA 15s)"), lines     # 30 s for 2 steps, 1 left
    assert lines[2].endswith("(10.0s, ETA 0s)"), lines
    assert live.duration(65) == "1m05s" and live.duration(3720) == "1h02m"

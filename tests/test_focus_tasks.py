"""`rollout.focus_tasks=match`: a FOCUS step grows trees on as many distinct tasks as the
matched linear (GRPO) step draws under the budget, measured at step 0 and kept on resume; and
`rollout/tasks` / `rollout/mixed_groups` in every step's metrics."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from agentrl_cli.cli.main import app
from agentrl_cli.train import loop

from conftest import MICRO

runner = CliRunner()
# a budget that affords several times step 1's two tasks' groups of the micro model
SETS = [*MICRO, "rollout.budget_tokens=360", "train.eval_every=0"]


def _train(method: str, out, *extra: str):
    args = ["train", "--method", method, "--out", str(out)]
    for s in [*SETS, *extra]:
        args += ["--set", s]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return r


def _rows(run) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "rollout/tokens" in r]


def test_a_focus_step_covers_the_tasks_the_matched_grpo_step_draws(tmp_path):
    """GRPO's first step (the base policy, step 1's tasks and seed, the same budget) draws more
    tasks than `rollout.tasks_per_step` to spend its budget; with `rollout.focus_tasks=match`
    every FOCUS step learns from exactly that many, and without it from tasks_per_step."""
    _train("grpo", tmp_path / "grpo", "train.steps=1")
    grpo_tasks = _rows(tmp_path / "grpo")[0]["rollout/tasks"]
    assert grpo_tasks > 2                        # the budget drew fresh tasks beyond the step's 2
    r = _train("focus", tmp_path / "focus", "train.steps=2", "rollout.focus_tasks=match")
    assert f"tasks: {grpo_tasks} a step" in r.output
    rows = _rows(tmp_path / "focus")
    assert [row["rollout/tasks"] for row in rows] == [grpo_tasks, grpo_tasks]
    assert all(0.0 <= row["rollout/mixed_groups"] <= 1.0 for row in rows)
    assert all(row["rollout/mixed_groups"] == 1.0 - row["rollout/zero_spread_groups"]
               for row in rows)
    summary = json.loads((tmp_path / "focus" / "summary.json").read_text())
    assert summary["tasks_per_step"] == grpo_tasks
    _train("focus", tmp_path / "plain", "train.steps=1")
    assert _rows(tmp_path / "plain")[0]["rollout/tasks"] == 2


def test_the_matched_task_count_survives_resume(tmp_path, monkeypatch):
    """The count is measured once, at step 0, and kept in the checkpoint: a resumed run steps
    on the same count without measuring again."""
    out = tmp_path / "focus"
    _train("focus", out, "train.steps=1", "rollout.focus_tasks=match")
    count = _rows(out)[0]["rollout/tasks"]
    assert count > 2

    def measured_again(*a, **k):
        raise AssertionError("a resumed run measured its task count again")

    monkeypatch.setattr(loop, "linear_step_tasks", measured_again)
    r = runner.invoke(app, ["train", "--resume", str(out), "--steps", "2"])
    assert r.exit_code == 0, r.output
    assert [row["rollout/tasks"] for row in _rows(out)] == [count, count]
    assert json.loads((out / "summary.json").read_text())["tasks_per_step"] == count


def test_focus_tasks_is_checked_in_one_line():
    r = runner.invoke(app, ["train", "--method", "focus", "--set", "rollout.focus_tasks=many"])
    assert r.exit_code == 2
    assert "rollout.focus_tasks" in r.output and "match" in r.output
    assert "Traceback" not in r.output

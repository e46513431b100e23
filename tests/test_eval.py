"""agentrl eval: by default the trainer's held-out check (same tasks, samples and seed), with
progress and the checkpoint named."""
from __future__ import annotations

import json

from conftest import MICRO
from typer.testing import CliRunner

from agentrl_cli import config
from agentrl_cli.cli.main import app
from agentrl_cli.app.train import train as checked_train

runner = CliRunner()


def test_eval_of_a_run_reproduces_the_trainers_held_out_check(tmp_path, micro_policy):
    from agentrl_cli.train import loop

    cfg = config.load(method="grpo", sets=MICRO + ["train.steps=2", "train.eval_every=1",
                                                   "train.eval_tasks=4", "train.eval_samples=2"])
    out = tmp_path / "run"
    checked_train(cfg, out, log=lambda s: None)
    last = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()][-1]
    js = tmp_path / "eval.json"
    r = runner.invoke(app, ["eval", "--checkpoint", str(out), "--json", str(js)])
    assert r.exit_code == 0, r.output
    res = json.loads(js.read_text())
    assert (res["tasks"], res["n"]) == (4, 2) and list(res["pass@k"]) == ["1", "2"]
    assert res["mean@1"] == last["eval/success"]
    assert res["tokens_per_question"] == last["eval/tokens_per_question"]
    assert "run/step-000002" in r.output or "run/step-2" in r.output, r.output
    assert "trainer's held-out check at step 2" in r.output and "8/8 episodes" in r.output
    # asking for more samples: still the run's tasks, n = K
    r = runner.invoke(app, ["eval", "--checkpoint", str(out), "--pass-k", "4", "--json", str(js)])
    assert r.exit_code == 0, r.output
    res = json.loads(js.read_text())
    assert (res["tasks"], res["n"]) == (4, 4) and "trainer's held-out" not in r.output


def test_episode_jsonl_names_the_question_and_both_answers(tmp_path):
    out = tmp_path / "eps.jsonl"
    r = runner.invoke(app, ["rollout", "--policy", "expert", "--n", "3", "--out", str(out),
                            *sum((["--set", s] for s in MICRO + ["env.max_turns=12"]), [])])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    for row in rows:
        assert list(row)[:5] == ["task_id", "question", "model_answer", "gold_answer", "success"]
        assert row["question"].startswith("Question:") and "answer" not in row
        assert row["success"] and row["model_answer"] == row["gold_answer"] != ""

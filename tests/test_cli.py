"""CLI: user mistakes give one clear line and exit 2; train/eval/rollout run end to end."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from agentrl_cli.cli.main import app
from conftest import MICRO

runner = CliRunner()


def _sets(extra=()):
    out = []
    for s in [*MICRO, *extra]:
        out += ["--set", s]
    return out


@pytest.mark.parametrize("args, needle", [
    (["train", "--method", "nope"], "unknown method 'nope'"),
    (["train", "--env", "nowhere"], "unknown env 'nowhere'"),
    (["train", "--set", "train.lrr=1"], "did you mean 'train.lr'"),
    (["train", "--set", "train.lr=-1"], "train.lr must be > 0"),
    (["train", "--set", "train.steps=abc"], "train.steps expects"),
    (["train", "--set", "notakey"], "--set expects key=value"),
    (["eval", "--checkpoint", "/nonexistent/ckpt"], "no checkpoint found"),
    (["train", "--resume", "/nonexistent/run"], "no run found"),
    (["train", "--model", "./missing-model-dir"], "model not found"),
    (["eval", "--pass-k", "8", "--n", "4"], "must be >= --pass-k"),
])
def test_user_errors_are_one_line_exit_2(args, needle):
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in res.output


def test_malformed_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  lr: [1, 2\n")
    res = runner.invoke(app, ["train", "--config", str(bad)])
    assert res.exit_code == 2 and "malformed YAML" in res.output
    typo = tmp_path / "typo.yaml"
    typo.write_text("train:\n  stepz: 3\n")
    res = runner.invoke(app, ["train", "--config", str(typo)])
    assert res.exit_code == 2 and "did you mean 'train.steps'" in res.output


def test_diagnose_lists_its_subcommands_and_ablate_its_presets():
    res = runner.invoke(app, ["diagnose", "--help"])
    assert res.exit_code == 0
    assert all(c in res.output for c in ("audit-tree", "critic-rank", "variance", "tool-calls"))
    res = runner.invoke(app, ["ablate", "--help"])
    assert res.exit_code == 0 and "--preset" in res.output and "Example" in res.output


def test_help_for_every_command():
    for cmd in ("train", "rollout", "eval", "diagnose", "ablate", "view"):
        res = runner.invoke(app, [cmd, "--help"])
        assert res.exit_code == 0 and "Example" in res.output or cmd in ("diagnose", "ablate")


def test_train_then_eval_then_rollout_as_subprocesses(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "agentrl_cli.cli.main", "train", "--method", "grpo",
           "--out", str(out), "--steps", "2", *_sets(["train.save_every=1"])]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr + p.stdout
    summary = json.loads((out / "summary.json").read_text())
    for key in ("base_success", "final_success", "steps", "wall_seconds", "tokens_generated"):
        assert key in summary
    assert summary["steps"] == 2 and summary["tokens_generated"] > 0
    assert (out / "learning_curve.png").stat().st_size > 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for name in ("loss/policy", "adv/mean", "clipfrac", "kl/approx", "rollout/tokens", "rollout/tool_calls"):
        assert name in rows[1]
    js = tmp_path / "eval.json"
    p = subprocess.run([sys.executable, "-m", "agentrl_cli.cli.main", "eval", "--pass-k", "4",
                        "--tasks", "3", "--checkpoint", str(out), "--json", str(js),
                        *_sets()], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr + p.stdout
    res = json.loads(js.read_text())
    assert list(res["pass@k"]) == ["1", "2", "4"] and res["n"] == 4 and res["tasks"] == 3
    vals = [res["pass@k"][k] for k in ("1", "2", "4")]
    assert vals == sorted(vals)
    eps = tmp_path / "eps.jsonl"
    p = subprocess.run([sys.executable, "-m", "agentrl_cli.cli.main", "rollout", "--policy", "expert",
                        "--n", "5", "--out", str(eps), *_sets(["env.max_turns=12"])], capture_output=True, text=True, env=env,
                       timeout=600)
    assert p.returncode == 0, p.stderr + p.stdout
    lines = [json.loads(x) for x in eps.read_text().splitlines()]
    assert len(lines) == 5 and all(x["success"] for x in lines)
    assert all(x["num_tool_calls"] >= 3 for x in lines)

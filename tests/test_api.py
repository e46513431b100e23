"""The Python API (`agentrl_cli.api`): docs/python-api.md's example runs as written (with the
micro settings added), a step callback stops a run with a checkpoint that resumes, and the API
calls the commands' library functions."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from agentrl_cli import api
from agentrl_cli.app import train as launch_module
from conftest import MICRO

ROOT = Path(__file__).resolve().parents[1]


def _micro(monkeypatch):
    """api.load_config with the micro settings under the caller's `sets`."""
    real = api.load_config

    def micro(config=None, sets=None, **kw):
        given = [f"{k}={v}" for k, v in sets.items()] if isinstance(sets, dict) else list(sets or [])
        return real(config, MICRO + ["train.eval_tasks=4"] + given, **kw)

    monkeypatch.setattr(api, "load_config", micro)


def test_the_python_api_page_example_runs(tmp_path, monkeypatch):
    page = (ROOT / "docs" / "python-api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert len(blocks) == 2                # this example, then Python objects' (test_api_objects.py)
    _micro(monkeypatch)
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(blocks[0], "docs/python-api.md", "exec"), ns)
    run = tmp_path / "runs" / "api-example"
    assert [s for s, _, _ in ns["seen"]] == [1, 2, 3]          # stopped at 3 by StopTraining
    lrs = [lr for _, _, lr in ns["seen"]]
    assert lrs == pytest.approx([1e-4, 2e-4, 2e-4])      # 2 warm-up steps, then the cosine from 1
    assert ns["summary"]["steps"] == 4 and ns["summary"]["out"] == str(Path("runs/api-example"))
    assert 0.0 <= ns["result"]["mean@1"] <= 1.0 and ns["result"]["n"] == 2
    assert (run / "checkpoints" / "step-000003").is_dir() and (run / "checkpoints" / "step-000004").is_dir()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert len(ns["episodes"]) == 4 and (run / "episodes.jsonl").is_file()


def test_a_callback_returning_false_stops_with_a_checkpoint_and_resume_continues(tmp_path, monkeypatch):
    _micro(monkeypatch)
    cfg = api.load_config(method="grpo", sets={"train.steps": 5, "train.save_every": 0})
    calls = []
    summary = api.train(cfg, tmp_path / "run", on_step=lambda s, m: calls.append(s) or s < 2,
                        log=lambda s: None)
    assert calls == [1, 2] and summary["steps"] == 2
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*")) == ["step-000002"]
    summary = api.resume(tmp_path / "run", log=lambda s: None)
    assert summary["steps"] == 5
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5]
    assert api.resume(tmp_path / "run", log=lambda s: None) is None       # already ran its steps


def test_the_api_calls_the_commands_library_functions(tmp_path, monkeypatch):
    """train -> app.train.launch (what `agentrl train` calls), with the config as given."""
    seen = {}

    def fake(req, log=print, progress=None, announce=None, on_step=None):
        seen["req"], seen["on_step"] = req, on_step
        return tmp_path, {"steps": 0}

    assert api.launch is launch_module.launch
    monkeypatch.setattr(api, "launch", fake)           # app.train.launch, as the API calls it
    cfg = api.load_config(method="grpo", sets=MICRO)
    cb = lambda s, m: None  # noqa: E731
    out = api.train(cfg, tmp_path / "x", on_step=cb)
    assert seen["req"].run_config is cfg and seen["req"].out == tmp_path / "x"
    assert seen["on_step"] is cb and out == {"steps": 0, "out": str(tmp_path)}
    src = ast.parse((ROOT / "agentrl_cli" / "api.py").read_text())
    imported = {n.module for n in ast.walk(src) if isinstance(n, ast.ImportFrom)}
    assert {"app.train", "app.evaluate", "app.rollout"} <= imported


def test_a_mistake_through_the_api_is_the_commands_one_line(monkeypatch):
    from agentrl_cli.errors import ConfigError

    with pytest.raises(ConfigError, match="did you mean 'train.lr'"):
        api.load_config(method="grpo", sets={"train.lrr": 1})
    with pytest.raises(ConfigError, match="train.lr_schedule must be one of"):
        api.load_config(method="grpo", sets=["train.lr_schedule=exp"])

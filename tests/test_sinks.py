"""train.log: TensorBoard and W&B receive the rows of metrics.jsonl; checked with TensorBoard's
own event reader."""
from __future__ import annotations

import json
import sys
import types

import pytest
from conftest import MICRO

from agentrl_cli import config
from agentrl_cli.errors import ConfigError
from agentrl_cli.reporting.metrics import MetricsLog, read_metrics
from agentrl_cli.app.train import train as checked_train


def _tb_scalars(folder) -> dict[tuple[str, int], float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    ea.Reload()
    out = {}
    for tag in ea.Tags()["scalars"]:
        for ev in ea.Scalars(tag):
            assert (tag, ev.step) not in out, f"{tag} step {ev.step} written twice"
            out[(tag, ev.step)] = ev.value
    return out


def _jsonl_scalars(path) -> dict[tuple[str, int], float]:
    return {(k, r["step"]): float(v) for r in read_metrics(path) for k, v in r.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def test_a_tensorboard_run_holds_the_same_scalars_as_metrics_jsonl(tmp_path, micro_policy):
    from agentrl_cli.train import loop

    cfg = config.load(method="grpo", sets=MICRO + ["train.steps=2", "train.eval_every=1",
                                                   "train.log=tensorboard"])
    out = tmp_path / "run"
    checked_train(cfg, out, log=lambda s: None)
    tb, js = _tb_scalars(out / "tensorboard"), _jsonl_scalars(out / "metrics.jsonl")
    assert set(tb) == set(js) and len(js) > 20
    assert {"loss/policy", "eval/success", "rollout/tokens"} <= {k for k, _ in tb}
    for key, v in js.items():
        assert tb[key] == pytest.approx(v, rel=1e-6, abs=1e-6), key


def test_a_resumed_run_writes_each_step_once(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl", sinks="tensorboard")
    log.reset()
    for s in range(4):
        log.write({"step": s, "x": float(s)})
    log.close()
    log = MetricsLog(tmp_path / "metrics.jsonl", sinks="tensorboard")
    log.truncate_after(1)
    for s in (2, 3):
        log.write({"step": s, "x": 10.0 + s})
    log.close()
    assert _tb_scalars(tmp_path / "tensorboard") == {("x", 0): 0.0, ("x", 1): 1.0, ("x", 2): 12.0,
                                                     ("x", 3): 13.0}


def test_wandb_is_imported_only_when_chosen_and_gets_the_rows(tmp_path, monkeypatch):
    calls = {"log": []}

    class Run:
        def log(self, data, step):
            calls["log"].append((step, data))

        def finish(self):
            calls["finished"] = True

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: calls.setdefault("init", kw) and Run()
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    log = MetricsLog(tmp_path / "metrics.jsonl", sinks="tensorboard")
    log.write({"step": 0, "x": 1.0})
    log.close()
    assert "wandb" not in sys.modules
    monkeypatch.setitem(sys.modules, "wandb", fake)
    log = MetricsLog(tmp_path / "metrics.jsonl", sinks="wandb", config={"method": "grpo"})
    log.write({"step": 3, "loss/policy": 0.5, "note": "text", "flag": True})
    log.close()
    init = calls["init"]
    assert init["dir"] == str(tmp_path) and init["config"] == {"method": "grpo"}
    assert "mode" not in init   # wandb's own settings decide: WANDB_MODE=offline is honoured
    assert calls["log"] == [(3, {"loss/policy": 0.5})] and calls["finished"]
    assert (tmp_path / "wandb_id").read_text() == init["id"]


def test_unknown_sink_is_a_config_error():
    with pytest.raises(ConfigError, match="tensorboard, wandb"):
        config.load(sets=["train.log=tensorbord"])
    assert config.load(sets=["train.log=tensorboard,wandb"]).train.log == "tensorboard,wandb"

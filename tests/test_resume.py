"""Stopping mid-run and resuming reproduces the uninterrupted run exactly."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from agentrl_cli import config
from agentrl_cli.train import checkpoint, loop
from conftest import MICRO, train_until_interrupted
from agentrl_cli.app.train import train as checked_train

SETS = MICRO + ["train.steps=3", "train.save_every=1", "train.eval_every=2",
                "rollout.max_new_tokens=6"]
VOLATILE = ("time/", "tokens/s", "focus/bookkeeping")


def _rows(out):
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


@pytest.mark.parametrize("method,extra", [("grpo", []), ("mpo", ["model.critic=separate"]),
                                          # the LR schedule, its warm-up and the entropy bonus
                                          ("ppo", ["train.lr_schedule=cosine", "train.warmup_steps=2",
                                                   "train.critic_lr=1e-3", "algo.entropy_coef=0.01"]),
                                          ("focus", ["rollout.budget_tokens=104", "rollout.group_size=4"])])
def test_resume_reproduces_uninterrupted_run(tmp_path, monkeypatch, method, extra):
    """(mpo with a separate critic: the critic's own model and its optimiser state resume too;
    focus with a budget: the launch limit's record of earlier steps' spend, `rollout_carry`.)"""
    cfg = config.load(method=method, sets=SETS + extra)
    full = tmp_path / "full"
    checked_train(cfg, full, log=lambda s: None)

    part = tmp_path / "part"
    train_until_interrupted(monkeypatch, cfg, part, step=2)
    # a crashed run may have logged past its checkpoint; resume must drop that
    with (part / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 3, "bogus": 1}) + "\n")
    checked_train(cfg, part, resume=str(part), log=lambda s: None)

    assert _rows(full) == _rows(part)
    a = load_file(str(checkpoint.step_dir(full, 3) / "model.safetensors"))
    b = load_file(str(checkpoint.step_dir(part, 3) / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ca = checkpoint.load_state(checkpoint.step_dir(full, 3))["value_head"]
    cb = checkpoint.load_state(checkpoint.step_dir(part, 3))["value_head"]
    if method == "focus":    # the spend record goes on from the checkpoint's, not from zero
        ka = checkpoint.load_state(checkpoint.step_dir(full, 3))["rollout_carry"]
        kb = checkpoint.load_state(checkpoint.step_dir(part, 3))["rollout_carry"]
        assert ka == kb and ka["focus_spend"][1] == 3 * float(extra[0].split("=")[1])
        carry = checkpoint.load_state(checkpoint.step_dir(part, 2))["rollout_carry"]
        assert carry["focus_spend"][1] == 2 * float(extra[0].split("=")[1])
        assert carry["focus_spend"][0] > 0
    if method == "mpo":
        assert any(k.startswith("model.") for k in ca)
        assert ca.keys() == cb.keys() and all(torch.equal(ca[k], cb[k]) for k in ca)
    sa = json.loads((full / "summary.json").read_text())
    sb = json.loads((part / "summary.json").read_text())
    for key in ("base_success", "final_success", "tokens_generated", "steps"):
        assert sa[key] == sb[key]


def test_resume_after_the_last_checkpoint_keeps_the_final_check(tmp_path, monkeypatch):
    """A run stopped after its last checkpoint but before its summary (what `ablate` resumes):
    the summary's final success is the last held-out check, not the base model's."""
    real, calls = loop.evaluate, []

    def numbered(*a, **k):          # the micro model never succeeds: number the checks instead
        out = dict(real(*a, **k))
        calls.append(1)
        out["mean@1"] = 0.1 * len(calls)
        return out

    monkeypatch.setattr(loop, "evaluate", numbered)
    cfg = config.load(method="grpo", sets=SETS + ["train.steps=2"])
    out = tmp_path / "run"
    checked_train(cfg, out, log=lambda s: None)
    first = json.loads((out / "summary.json").read_text())
    assert (first["base_success"], first["final_success"]) == (0.1, 0.2)
    (out / "summary.json").unlink()
    checked_train(cfg, out, resume=str(out), log=lambda s: None)
    assert len(calls) == 2                       # nothing left to run or check
    again = json.loads((out / "summary.json").read_text())
    assert (again["base_success"], again["final_success"]) == (0.1, 0.2)

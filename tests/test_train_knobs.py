"""The knobs TRL and verl users expect: the learning-rate schedule with warm-up (`train.lr_schedule`,
`train.warmup_steps`, logged as `lr`), the policy's entropy (`policy/entropy`, from the update's
own logits) and its bonus (`algo.entropy_coef`), the KL estimator (`algo.kl_estimator`), and
docs/coming-from.md naming only keys that exist."""
from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from agentrl_cli import config, losses
from agentrl_cli.cli.main import app
from agentrl_cli.models.sequences import hidden_states, logprobs_from_hidden
from agentrl_cli.train.batch import forward
from agentrl_cli.train.learner import lr_factor, set_lr
from conftest import MICRO, random_batch, set_args
from agentrl_cli.app.train import train as checked_train

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _tr(schedule, warmup, steps):
    return SimpleNamespace(lr_schedule=schedule, warmup_steps=warmup, steps=steps)


def test_lr_factor_warms_up_then_follows_the_schedule():
    assert [lr_factor(_tr("constant", 0, 5), s) for s in range(1, 6)] == [1.0] * 5
    assert [lr_factor(_tr("constant", 4, 6), s) for s in range(1, 7)] == [0.25, 0.5, 0.75, 1, 1, 1]
    assert [lr_factor(_tr("linear", 2, 6), s) for s in range(1, 7)] == [0.5, 1, 1, 0.75, 0.5, 0.25]
    cos = [lr_factor(_tr("cosine", 0, 4), s) for s in range(1, 5)]
    assert cos == pytest.approx([1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5,
                                 0.5 * (1 + math.cos(3 * math.pi / 4))])


def test_set_lr_scales_the_policy_and_the_critic_rates_alike():
    p, c = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([{"params": [p]}, {"params": [c], "lr": 1e-3}], lr=2e-4)
    cfg = config.load(method="ppo", sets=["train.critic_lr=1e-3", "train.warmup_steps=4",
                                          "train.lr_schedule=linear", "train.steps=8"])
    learner = SimpleNamespace(optimizer=opt)
    assert set_lr(learner, cfg, 1) == pytest.approx(0.5e-4)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.5e-4, 0.25e-3])
    set_lr(learner, cfg, 8)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([2e-4 / 4, 1e-3 / 4])


_sets = set_args


def _rows(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][1:]


def test_cli_logs_the_scheduled_lr_and_the_entropy(tmp_path):
    run = tmp_path / "run"
    res = runner.invoke(app, ["train", "--method", "grpo", "--steps", "4", *_sets([
        "train.lr=1e-3", "train.lr_schedule=linear", "train.warmup_steps=2"]), "--out", str(run)])
    assert res.exit_code == 0, res.output
    rows = _rows(run)
    assert [r["lr"] for r in rows] == pytest.approx([5e-4, 1e-3, 1e-3, 5e-4])
    vocab = math.log(json.loads((run / "checkpoints" / "step-000004" / "config.json").read_text())
                     ["vocab_size"])
    assert all(0.0 < r["policy/entropy"] <= vocab for r in rows)
    res = runner.invoke(app, ["train", "--set", "train.lr_schedule=step"])
    assert res.exit_code == 2 and "train.lr_schedule must be one of constant, linear, cosine" in res.output


def test_entropy_is_the_same_in_every_forward_layout_and_matches_the_logits(micro_policy):
    model = copy.deepcopy(micro_policy[0]).eval()
    batch = random_batch([40, 23, 33, 12], model.config.vocab_size)
    with torch.no_grad():
        h = hidden_states(model, batch.input_ids, batch.attention_mask)
        logits = model.get_output_embeddings()(h).float() / 0.7
        ref = torch.distributions.Categorical(logits=logits[:, :-1]).entropy()
        outs = [forward(model, None, batch, 0.7, chunk=8, pack=p, entropy=True)
                for p in (False, True, "tree")]
    policy = batch.response_mask.bool()[:, 1:]
    for lp, _, ent in outs:
        torch.testing.assert_close(ent[:, 1:][policy], ref[policy], atol=1e-5, rtol=1e-5)
        assert float(ent[:, 1:][~policy].abs().max()) == 0.0
        torch.testing.assert_close(lp, outs[0][0], atol=1e-5, rtol=0)


def test_the_chunked_entropy_gradient_matches_autograd(micro_policy):
    model = copy.deepcopy(micro_policy[0]).eval()
    batch = random_batch([30, 17], model.config.vocab_size)
    grads = []
    for chunk in (0, 7):           # 0: plain autograd through log_softmax; 7: the custom backward
        model.zero_grad()
        h = hidden_states(model, batch.input_ids, batch.attention_mask)
        lp, ent = logprobs_from_hidden(model, h, batch.input_ids, 0.7, chunk, entropy=True)
        (lp.sum() * 0.3 + ent.sum()).backward()
        grads.append(model.get_output_embeddings().weight.grad.clone())
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-4)
    assert float(grads[0].abs().max()) > 0


def _train(tmp_path, name, extra):
    from agentrl_cli.train import loop

    cfg = config.load(method="grpo", sets=MICRO + ["train.steps=2", "rollout.group_size=4"] + extra)
    checked_train(cfg, tmp_path / name, log=lambda s: None)
    return _rows(tmp_path / name)


def test_entropy_bonus_and_kl_estimator_change_the_update_and_defaults_do_not(tmp_path):
    base = _train(tmp_path, "base", ["algo.kl_coef=0.5"])
    same = _train(tmp_path, "same", ["algo.kl_coef=0.5", "algo.kl_estimator=k3",
                                     "algo.entropy_coef=0"])
    drop = ("time/", "tokens/s")
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith(drop)} for r in rows]  # noqa: E731
    assert strip(base) == strip(same)
    bonus = _train(tmp_path, "bonus", ["algo.kl_coef=0.5", "algo.entropy_coef=0.5"])
    assert bonus[0]["loss/policy"] == base[0]["loss/policy"]     # step 1 rolls out the same
    assert bonus[1]["policy/entropy"] != base[1]["policy/entropy"]
    # the bonus moved the policy off the reference in step 1: step 2's KL terms differ by estimator
    k2 = _train(tmp_path, "k2", ["algo.kl_coef=0.5", "algo.entropy_coef=0.5", "algo.kl_estimator=k2"])
    assert bonus[1]["kl/ref"] > 0 and k2[1]["kl/ref"] > 0 and k2[1]["kl/ref"] != bonus[1]["kl/ref"]
    assert k2[0]["kl/ref"] == bonus[0]["kl/ref"] == 0.0


def test_kl_estimators_by_hand():
    new = torch.tensor([[-1.0, -2.0, -0.5]])
    ref = torch.tensor([[-1.5, -1.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    d = ref - new                                  # [-0.5, 1.0, 0]
    assert losses.kl_penalty(new, ref, mask, "k1").tolist() == [[0.5, -1.0, 0.0]]
    assert losses.kl_penalty(new, ref, mask, "k2").tolist() == [[0.125, 0.5, 0.0]]
    torch.testing.assert_close(losses.kl_penalty(new, ref, mask, "k3"),
                               (torch.exp(d) - d - 1) * mask)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        losses.kl_penalty(new, ref, mask, "k4")


def test_coming_from_names_only_keys_that_exist():
    page = (ROOT / "docs" / "coming-from.md").read_text()
    named = {key for key, star in re.findall(
        r"`((?:model|env|rollout|algo|train|context)\.[a-z_]+)(\*?)", page) if not star}
    assert len(named) > 25
    assert sorted(named - set(config.LEAF_TYPES)) == []
    methods = set(re.findall(r"`--method ([a-z_]+)`", page))
    from agentrl_cli.methods import METHODS
    assert methods and methods <= set(METHODS.names())

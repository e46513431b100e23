"""`train.checkpoint.open_checkpoint`: the one place a checkpoint becomes a policy and a critic
(diagnose, eval, --resume): the checkpoint's weights, its critic, its trainer state, and the
same errors as before."""
from __future__ import annotations

import copy

import pytest
import torch
from conftest import MICRO, random_value_head

from agentrl_cli import config
from agentrl_cli.errors import ConfigError
from agentrl_cli.models.critic import ValueHead, critic_from_checkpoint
from agentrl_cli.rollout.runtime import build_runtime
from agentrl_cli.train import checkpoint
from agentrl_cli.train.checkpoint import TrainerState, open_checkpoint


def _quiet(s: str) -> None:
    pass


@pytest.fixture(scope="module")
def saved(micro_policy, tmp_path_factory):
    """A run folder with one checkpoint: the micro model moved off its initial weights, a
    seeded value head, and a trainer state with every key `train.loop.save` writes."""
    model, tok, _, _ = micro_policy
    model = copy.deepcopy(model)
    with torch.no_grad():
        next(model.parameters()).add_(0.25)       # not the base model's weights
    head = random_value_head(model, seed=7)
    out = tmp_path_factory.mktemp("open") / "run"
    state = {"step": 3, "optimizer": {"state": {}, "param_groups": []},
             "value_head": head.state_dict(), "critic_config": None,
             "base_eval": {"mean@1": 0.25}, "last_eval": {"mean@1": 0.5}, "tokens_total": 123,
             "rollout_carry": {"spent": 4}, "method": "mpo"}
    ckpt = checkpoint.save(out, 3, model, tok, state)
    return out, ckpt, model, head


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_opens_to_its_weights_critic_and_state(saved):
    out, ckpt, model, head = saved
    cfg = config.load(sets=MICRO, method="mpo")
    opened = open_checkpoint(out, cfg, log=_quiet)            # a run folder: its newest checkpoint
    assert opened.path == ckpt and opened.runtime.cfg.model.name == str(ckpt)
    assert _same(opened.policy.state_dict(), model.state_dict())
    # the critic is the checkpoint's (dropping it fails here), as the old path rebuilt it
    assert isinstance(opened.critic, ValueHead) and not opened.critic.training
    assert _same(opened.critic.state_dict(), head.state_dict())
    old = critic_from_checkpoint(checkpoint.load_state(ckpt), opened.policy)
    assert _same(opened.critic.state_dict(), old.state_dict())
    s = opened.state
    assert isinstance(s, TrainerState)
    assert (s.step, s.tokens_total, s.method, s.rollout_carry) == (3, 123, "mpo", {"spent": 4})
    assert (s.base_eval, s.last_eval, s.critic_config) == ({"mean@1": 0.25}, {"mean@1": 0.5}, None)
    assert s.optimizer == {"state": {}, "param_groups": []} and _same(s.value_head, head.state_dict())
    assert open_checkpoint(ckpt, cfg, log=_quiet, with_critic=False).critic is None


def test_diagnostics_read_the_same_policy_and_critic(saved):
    from agentrl_cli.diagnostics.mc import load_checkpoint_policy

    out, ckpt, model, head = saved
    pol = load_checkpoint_policy(config.load(sets=MICRO, method="mpo"), out)
    assert pol.name == str(ckpt) and pol.cfg.model.name == str(ckpt)
    assert _same(pol.model.state_dict(), model.state_dict())
    assert _same(pol.critic.state_dict(), head.state_dict())


def test_a_critic_free_checkpoint_opens_without_a_critic(micro_policy, tmp_path):
    model, tok, _, _ = micro_policy
    ckpt = checkpoint.save(tmp_path / "run", 1, model, tok, {"step": 1, "value_head": None})
    opened = open_checkpoint(ckpt, config.load(sets=MICRO, method="grpo"), log=_quiet)
    assert opened.critic is None and opened.state.step == 1 and opened.state.optimizer is None
    assert opened.state.rollout_carry == {}


def test_a_damaged_checkpoint_is_the_same_error_as_find(saved, tmp_path):
    import shutil

    _, ckpt, _, _ = saved
    bad = tmp_path / "run" / "checkpoints" / ckpt.name
    shutil.copytree(ckpt, bad)
    with (bad / checkpoint.STATE_FILE).open("r+b") as f:   # same size, other bytes
        f.seek(100)
        f.write(b"\0\0\0\0")
    with pytest.raises(ConfigError) as want:
        checkpoint.find(bad)
    with pytest.raises(ConfigError) as got:
        open_checkpoint(bad, config.load(sets=MICRO, method="mpo"), log=_quiet)
    assert str(got.value) == str(want.value) and "damaged" in str(got.value)
    with pytest.raises(ConfigError, match="no checkpoint found"):
        open_checkpoint(tmp_path / "nothing", config.load(sets=MICRO), log=_quiet)


def test_into_a_live_runtime_and_critic_as_resume_loads_them(saved):
    """`into`: what `train.loop.open_run` does on --resume (weights with strict=False, the value
    head into the learner's critic when both are there)."""
    out, ckpt, model, head = saved
    cfg = config.load(sets=MICRO, method="mpo")
    rt = build_runtime(cfg, _quiet)
    assert not _same(rt.model.state_dict(), model.state_dict())
    critic = ValueHead(model.config.hidden_size)
    found = checkpoint.load_for_resume(out, _quiet)
    opened = open_checkpoint(found[0], cfg, into=rt, into_critic=critic, loaded=found[1:])
    assert opened.runtime is rt and opened.critic is critic and opened.path == ckpt
    assert _same(rt.model.state_dict(), model.state_dict())
    assert _same(critic.state_dict(), head.state_dict()) and opened.state.step == 3
    # read here when not given; no critic to load into: none made
    rt2 = build_runtime(cfg, _quiet)
    opened = open_checkpoint(ckpt, cfg, into=rt2, log=_quiet)
    assert opened.critic is None and _same(rt2.model.state_dict(), model.state_dict())

"""The tiny build's warm critic: a ridge fit of the base policy's own outcomes on its hidden
states, saved next to the model, and the trainer's value head starting from it."""
from __future__ import annotations

import torch
from safetensors.torch import load_file

from conftest import MICRO
from agentrl_cli import config
from agentrl_cli.engines.hf import HFEngine
from agentrl_cli.models.sequences import hidden_states, pad_episodes
from agentrl_cli.models.tiny import VALUE_HEAD
from agentrl_cli.app.tiny_build import fit_value_head
from agentrl_cli.train.learner import build_learner


def test_fit_saves_a_head_the_learner_starts_from(micro_policy, tmp_path):
    model, tok, fmt, spec = micro_policy
    tasks = spec.tasks("train", 4)
    path = tmp_path / VALUE_HEAD
    info = fit_value_head(model, HFEngine(model, fmt.pad_id), fmt, spec, tasks, 8, 256,
                          torch.Generator().manual_seed(0), path)
    assert info["states"] >= 8 and 0.0 <= info["success"] <= 1.0
    assert info["mse"] <= info["mse_const"] + 1e-9       # never worse than the mean in-sample
    head = load_file(str(path))
    assert head["weight"].shape == (1, model.config.hidden_size) and head["bias"].shape == (1,)
    # deterministic from the generator
    again = fit_value_head(model, HFEngine(model, fmt.pad_id), fmt, spec, tasks, 8, 256,
                           torch.Generator().manual_seed(0), tmp_path / "again.safetensors")
    assert again == info
    torch.testing.assert_close(load_file(str(tmp_path / "again.safetensors"))["weight"], head["weight"])
    cfg = config.load(sets=MICRO, method="focus")
    warm = build_learner(cfg, model, model_path=str(tmp_path), log=lambda s: None)
    torch.testing.assert_close(warm.critic.weight.detach(), head["weight"])
    torch.testing.assert_close(warm.critic.bias.detach(), head["bias"])
    cold = build_learner(cfg, model, model_path=str(tmp_path / "none"), log=lambda s: None)
    assert float(cold.critic.weight.detach().abs().sum()) == 0.0
    assert float(cold.critic.bias.detach()) == 0.5
    # token-level GAE and MPO's intra-turn trace read the critic at every token, where the
    # turn-start fit does not hold: they start cold
    for method in ("ppo", "mpo"):
        other = build_learner(config.load(sets=MICRO, method=method), model,
                              model_path=str(tmp_path), log=lambda s: None)
        assert float(other.critic.weight.detach().abs().sum()) == 0.0, method


def test_fit_recovers_a_planted_linear_value(micro_policy, tmp_path, monkeypatch):
    """Outcomes that are a known linear function of the turn-start hidden states are recovered."""
    model, tok, fmt, spec = micro_policy
    from agentrl_cli.app import tiny_build          # fit_value_head's own name for it

    real = tiny_build.run_episodes
    torch.manual_seed(1)
    w_true = torch.randn(model.config.hidden_size) * 0.05

    def planted(*a, **k):        # reward := an affine function of h(first turn start)
        eps = real(*a, **k)
        ids, _, attn = pad_episodes(eps, fmt.pad_id)
        with torch.no_grad():
            h = hidden_states(model, ids, attn).float()
        raw = torch.stack([h[b, e.turns[0].start - 1] for b, e in enumerate(eps)]) @ w_true
        scaled = 0.5 + 0.4 * (raw - raw.mean()) / (raw - raw.mean()).abs().max()  # in [0.1, 0.9]
        for e, r in zip(eps, scaled.tolist()):
            e.reward = r
            for t in e.turns[1:]:            # keep one state per episode: the critic's target is exact
                t.start = e.turns[0].start
        return eps

    monkeypatch.setattr(tiny_build, "run_episodes", planted)
    info = fit_value_head(model, HFEngine(model, fmt.pad_id), fmt, spec, spec.tasks("train", 8),
                          64, 256, torch.Generator().manual_seed(0), tmp_path / VALUE_HEAD)
    assert info["mse"] < 0.25 * info["mse_const"]

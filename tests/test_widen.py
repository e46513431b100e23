"""`agentrl widen`: a wider copy of a decoder that computes the same function (a critic with more
capacity through `model.critic_path`)."""
from __future__ import annotations

import copy
import json

import pytest
import torch
from typer.testing import CliRunner

from agentrl_cli import config
from agentrl_cli.cli.main import app
from agentrl_cli.models.widen import check_widened, widen

from conftest import MICRO


def _ids(model, n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (3, n), generator=g)


@pytest.mark.parametrize("factor,mlp", [(2, True), (3, False)])
def test_widened_model_computes_the_same_function(micro_policy, factor, mlp):
    model = micro_policy[0]
    wide = widen(model, factor, noise=0.05, widen_mlp=mlp, seed=1)
    h = model.config.hidden_size
    assert wide.config.hidden_size == factor * h
    assert wide.config.intermediate_size == model.config.intermediate_size * (factor if mlp else 1)
    ids = _ids(model)
    assert check_widened(model, wide, ids) < 1e-5
    with torch.no_grad():
        lo, lw = model(input_ids=ids).logits, wide(input_ids=ids).logits
    torch.testing.assert_close(lw, lo, rtol=1e-4, atol=1e-4)
    # the copies differ (zero-sum noise), and their parts sum to the source's weights
    q, qw = model.model.layers[0].self_attn.q_proj.weight, wide.model.layers[0].self_attn.q_proj.weight
    parts = qw.split(h, dim=1)
    assert not torch.equal(parts[0], parts[1])
    torch.testing.assert_close(sum(parts), q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_other_llama_style_decoders_widen_too(arch):
    """Qwen2 (q/k/v biases) and Llama (with an MLP bias), random weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    if arch == "llama":
        kw.update(mlp_bias=True, attention_bias=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **kw)).eval()
    with torch.no_grad():                       # biases are zero at init: make them count
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.normal_(0, 0.1)
    assert any(n.endswith(".bias") for n, _ in model.named_parameters())
    wide = widen(model, 2, noise=0.05)
    assert check_widened(model, wide, _ids(model)) < 1e-5


def test_without_noise_the_copies_stay_equal_and_a_bad_factor_is_refused(micro_policy):
    model = micro_policy[0]
    wide = widen(model, 2, noise=0.0)
    h = model.config.hidden_size
    a, b = wide.model.layers[0].mlp.up_proj.weight.split(h, dim=1)
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="factor"):
        widen(model, 1)


def test_noise_breaks_the_copies_symmetry_under_training(micro_policy):
    """With equal parts every copy gets the same gradient (here from a head that reads every
    copy alike); with the noise they do not."""
    model = micro_policy[0]
    h = model.config.hidden_size
    ids = _ids(model, seed=3)
    grads = []
    for noise in (0.0, 0.05):
        wide = widen(model, 2, noise=noise, seed=2).train()
        out = wide(input_ids=ids, output_hidden_states=True).hidden_states[-1]
        (out * torch.linspace(-1, 1, h).repeat(2)).sum().backward()
        g = wide.model.embed_tokens.weight.grad
        grads.append(float((g[:, :h] - g[:, h:]).abs().max()))
    assert grads[0] == 0.0 and grads[1] > 0.0


def test_widen_command_writes_a_critic_folder_the_trainer_loads(micro_policy, tmp_path):
    from agentrl_cli.models.critic import SeparateCritic
    from agentrl_cli.models.loading import model_path
    from agentrl_cli.train.learner import build_learner

    out = tmp_path / "wide"
    args = ["widen", "--out", str(out), "--factor", "2"]
    for s in MICRO:
        args += ["--set", s]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "hidden states equal the source's" in res.output
    info = json.loads((out / "widen.json").read_text())
    assert info["hidden_size"] == 2 * micro_policy[0].config.hidden_size
    assert info["hidden_state_rel_diff"] < 1e-5
    again = CliRunner().invoke(app, args)
    assert again.exit_code != 0 and "not an empty folder" in again.output

    cfg = config.load(sets=MICRO + ["model.critic=separate", f"model.critic_path={out}"],
                      method="focus")
    learner = build_learner(cfg, copy.deepcopy(micro_policy[0]), model_path=model_path(cfg),
                            log=lambda s: None)
    assert isinstance(learner.critic, SeparateCritic)
    assert learner.critic.head.in_features == info["hidden_size"]

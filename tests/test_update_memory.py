"""The update's memory checked before any rollout, as the rollout's is: the estimate's arithmetic
on a hand-computed model, a default micro-batch lowered to fit (and said), a micro-batch the
user chose refused in one line naming the keys."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agentrl_cli import config
from agentrl_cli.cli.main import app
from agentrl_cli.errors import ConfigError
from agentrl_cli.app import preflight
from conftest import MICRO

runner = CliRunner(env={"COLUMNS": "1000"})
FAST = MICRO + ["train.eval_every=0", "train.steps=1"]
# hidden 64, 2 layers, 4 heads of 16 (q width 64), 2 KV heads (kv width 32), MLP 128, vocab 1000
SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 1000,
         "tie_word_embeddings": True}


def test_the_estimate_by_hand():
    # a layer: q 64x64, k and v 64x32 each, o 64x64, MLP 3 x 64x128, two norms of 64, q/k norms of 16
    layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64 + 2 * 16
    assert layer == 37024
    n, sides = preflight.parameter_count(SMALL)
    assert n == 1000 * 64 + 2 * layer + 64 == 138112          # tied embeddings, final norm
    assert sides == 128 + 2 * 96 + 128 + 2 * 192 + 192 == 1024  # in + out of the 7 projections
    # per token and layer: 4 x 64 + 6 x 64 + 4 x 32 + 4 x 128 = 1280 floats = 5120 bytes
    full = preflight.update_bytes(SMALL, tokens=100, policy_tokens=40, chunk=512, dtype_bytes=4)
    assert full == {"weights": 138112 * 4, "optimiser": 3 * 138112 * 4,
                    "activations": 100 * 2 * 5120, "lm_head": 40 * 1000 * 4 * 3, "tree_mask": 0}
    lora = preflight.update_bytes(SMALL, 100, 40, 512, 4, lora_rank=8)
    assert lora["optimiser"] == 3 * 8 * 1024 * 2 * 4                 # adapters only
    assert lora["weights"] == 138112 * 4 + 8 * 1024 * 2 * 4
    ckpt = preflight.update_bytes(SMALL, 100, 40, 512, 4, checkpointing=True)
    assert ckpt["activations"] == 100 * (2 * 64 * 4 + 5120)         # layer inputs + one layer
    ref = preflight.update_bytes(SMALL, 100, 40, 16, 4, reference=True, tree_mask=True)
    assert ref["weights"] == 2 * 138112 * 4 and ref["lm_head"] == 16 * 1000 * 12
    assert ref["tree_mask"] == 100 * 100 * 5


def _micro_model() -> dict:
    from agentrl_cli.app.tiny_build import ensure_model

    cfg = config.load(method="grpo", sets=FAST)
    ensure_model(cfg, log=lambda s: None)
    model = preflight._model_json(cfg)
    assert model is not None
    return model


def test_a_default_microbatch_is_lowered_to_fit_and_said(tmp_path, monkeypatch):
    model = _micro_model()
    cfg = config.load(method="grpo", sets=FAST)
    at = lambda t: sum(preflight.update_parts(cfg, model, t).values())  # noqa: E731
    assert cfg.train.max_tokens_per_microbatch == 4096
    limit = (at(2048) + at(4096)) // 2                                 # 2,048 fits, 4,096 not
    monkeypatch.setattr(preflight, "available_memory", lambda: limit)
    res = runner.invoke(app, ["train", "--method", "grpo", "--out", str(tmp_path / "run"),
                              *[a for s in FAST for a in ("--set", s)]])
    assert res.exit_code == 0, res.output
    assert "train.max_tokens_per_microbatch=2048: at the default 4,096 the update would need" in res.output
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["train"]["max_tokens_per_microbatch"] == 2048


def test_a_microbatch_the_user_chose_is_refused_in_one_line(tmp_path, monkeypatch):
    model = _micro_model()
    cfg = config.load(method="grpo", sets=FAST)
    limit = sum(preflight.update_parts(cfg, model, 4096).values()) + 1
    monkeypatch.setattr(preflight, "available_memory", lambda: limit)
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--method", "grpo", "--out", str(out),
                              *[a for s in [*FAST, "train.max_tokens_per_microbatch=16384"]
                                for a in ("--set", s)]])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    assert lines[0].startswith("error: the update would need about") or "the update would need about" in lines[0]
    assert "train.max_tokens_per_microbatch=16,384), above the" in lines[0]
    assert "lower train.max_tokens_per_microbatch (to 4,096) or set model.gradient_checkpointing=true" in lines[0]
    assert not (out / "metrics.jsonl").exists()


@pytest.mark.parametrize("tokens", [4096, 16384])
def test_the_check_passes_where_memory_is_plenty(tokens):
    model = _micro_model()
    cfg = config.load(method="grpo", sets=[*FAST, f"train.max_tokens_per_microbatch={tokens}"])
    assert preflight.check_update_memory(cfg, available=2**40, log=pytest.fail) is cfg
    with pytest.raises(ConfigError, match="the update would need about"):
        preflight.check_update_memory(cfg, available=1, log=lambda s: None)

"""LoRA through PEFT: only the adapters train, the reference is the base with adapters disabled
(no copy), checkpoints hold the adapters and resume exactly, eval and rollout load them over the
base, and merged weights (what the vLLM engine receives) equal PEFT's own merge."""
from __future__ import annotations

import copy
import json
import sys

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from agentrl_cli import config
from agentrl_cli.cli.main import app
from agentrl_cli.errors import ConfigError
from agentrl_cli.models import loading, lora
from agentrl_cli.models.sequences import token_logprobs
from agentrl_cli.train import checkpoint, loop
from agentrl_cli.train.learner import build_learner, score, update
from agentrl_cli.app.tiny_build import load_policy
from conftest import MICRO, random_batch, train_until_interrupted
from agentrl_cli.app.train import train as checked_train

LORA = ["model.lora_rank=4", "model.lora_alpha=8"]
VOLATILE = ("time/", "tokens/s")


def _lora_policy(extra=()):
    cfg = config.load(method="grpo", sets=MICRO + LORA + ["algo.kl_coef=0.1", *extra])
    model, tok, fmt, path = load_policy(cfg, log=lambda s: None)
    return cfg, model, path


def _logprobs(model, batch):
    with torch.no_grad():
        return token_logprobs(model, batch.input_ids, batch.attention_mask)


def test_only_adapters_train_and_the_reference_is_the_base():
    cfg, model, path = _lora_policy()
    assert lora.is_lora(model)
    learner = build_learner(cfg, model, model_path=path, log=lambda s: None)
    names = {id(p): n for n, p in model.named_parameters()}
    opt = [p for g in learner.optimizer.param_groups for p in g["params"]]
    assert opt and all(".lora_" in names[id(p)] for p in opt)
    assert len(opt) == sum(1 for n in names.values() if ".lora_" in n)
    # the reference is the same module: no parameter of its own
    assert isinstance(learner.reference, lora.BaseView)
    assert {id(p) for p in learner.reference.parameters()} == set(names)

    base = loading.load_model(path, cfg).eval()       # the plain model, no adapters
    batch = random_batch([40, 33, 28, 40], model.config.vocab_size, seed=1)
    with torch.no_grad():                             # adapters that already move the policy
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.normal_(std=0.02)
    assert torch.equal(_logprobs(learner.reference, batch), _logprobs(base, batch))
    assert not torch.allclose(_logprobs(model, batch), _logprobs(base, batch))

    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" not in n}
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" in n}
    batch.advantages = torch.randn(batch.input_ids.shape, generator=torch.Generator().manual_seed(0))
    score(learner, batch, cfg)
    assert batch.ref_logprobs is not None
    update(learner, batch, cfg, step=1)
    for n, p in model.named_parameters():
        if n in frozen:
            assert p.grad is None and torch.equal(p, frozen[n]), n   # base weights byte-identical
    assert all(not torch.equal(p, adapters[n]) for n, p in model.named_parameters()
               if n in adapters and ".lora_A." in n)
    # after the step: the reference is still the base, the policy has moved away from both
    ref = _logprobs(learner.reference, batch)
    assert torch.equal(ref, _logprobs(base, batch))
    assert (ref - _logprobs(model, batch)).abs().max() > 1e-4


def test_resume_reproduces_an_uninterrupted_lora_run_and_eval_loads_it(tmp_path, monkeypatch):
    """ppo (a value head on the adapted backbone, advantages from step 1) with a KL term to the
    base, adapter dropout; run 2 steps, resume to 3, compare with 3 uninterrupted steps."""
    sets = MICRO + LORA + ["model.lora_dropout=0.1", "algo.kl_coef=0.05", "train.steps=3",
                           "train.save_every=1", "train.eval_every=2", "rollout.max_new_tokens=6"]
    cfg = config.load(method="ppo", sets=sets)
    full, part = tmp_path / "full", tmp_path / "part"
    checked_train(cfg, full, log=lambda s: None)
    train_until_interrupted(monkeypatch, cfg, part, step=2)
    checked_train(cfg, part, resume=str(part), log=lambda s: None)

    def rows(out):
        rs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rs]

    assert len(rows(full)) == 4 and rows(full) == rows(part)
    ck = checkpoint.step_dir(full, 3)
    assert not (ck / checkpoint.WEIGHTS_FILE).exists() and (ck / lora.ADAPTER_FILE).is_file()
    a, b = load_file(str(ck / lora.ADAPTER_FILE)), load_file(str(checkpoint.step_dir(part, 3) / lora.ADAPTER_FILE))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    start = load_file(str(checkpoint.step_dir(full, 1) / lora.ADAPTER_FILE))
    assert any(not torch.equal(a[k], start[k]) for k in a)     # the adapters did train
    # module_state names every adapter tensor as the PEFT module does
    model = load_policy(cfg, log=lambda s: None)[0]
    assert set(lora.module_state(a)) <= set(model.state_dict())

    res = CliRunner().invoke(app, ["eval", "--checkpoint", str(ck), "--json", str(tmp_path / "e.json")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "e.json").read_text())["checkpoint"] == str(ck)
    res = CliRunner().invoke(app, ["rollout", "--checkpoint", str(full), "--n", "1", "--out",
                                   str(tmp_path / "r.jsonl"), *sum((["--set", s] for s in MICRO), [])])
    assert res.exit_code == 0, res.output
    # --model <adapters> without LoRA: the adapters merged into the base (not the base alone)
    ev = config.load(sets=MICRO + [f"model.name={ck}"])
    adapted = load_policy(ev, log=lambda s: None)[0]
    assert not lora.is_lora(adapted)
    merged = {k: v for k, v in adapted.state_dict().items()}
    base = loading.load_model(loading.model_path(cfg), cfg).state_dict()
    assert any(not torch.equal(merged[k], base[k]) for k in base if k in merged)


def test_merged_weights_equal_peft_merge():
    _, model, _ = _lora_policy()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.normal_(std=0.05)
    merged = lora.merged_state_dict(model)
    want = copy.deepcopy(model).merge_and_unload().state_dict()
    assert merged.keys() == want.keys()
    assert all(torch.allclose(merged[k], want[k], atol=1e-6) for k in want)
    assert any(not torch.equal(merged[k], model.get_base_model().state_dict()
                               .get(k.replace(".weight", ".base_layer.weight"), merged[k]))
               for k in merged if k.endswith("q_proj.weight"))


def test_default_targets_and_option_errors():
    _, model, _ = _lora_policy()
    targets = set(model.peft_config["default"].target_modules)
    assert targets == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    with pytest.raises(ConfigError, match="no module named nope_proj"):
        _lora_policy(["model.lora_targets=q_proj,nope_proj"])
    with pytest.raises(ConfigError, match="lora_rank must be >= 0"):
        _lora_policy(["model.lora_rank=-1"])


def test_missing_peft_is_one_line_naming_pip_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)      # `import peft` raises ImportError
    with pytest.raises(ConfigError, match="pip install peft"):
        _lora_policy()
    cfg = config.load(sets=MICRO)                       # no LoRA: PEFT is never imported
    assert not lora.is_lora(load_policy(cfg, log=lambda s: None)[0])


def test_a_checkpoint_without_weights_or_adapters_is_damaged(tmp_path):
    ck = tmp_path / "checkpoints" / "step-000001"
    ck.mkdir(parents=True)
    torch.save({"step": 1}, ck / checkpoint.STATE_FILE)
    checkpoint.write_manifest(ck)
    assert "lists neither model.safetensors nor adapter_model.safetensors" in checkpoint.verify(ck)
    (ck / lora.ADAPTER_FILE).write_bytes(b"x")
    checkpoint.write_manifest(ck)
    assert checkpoint.verify(ck) is None


def _cli_sets(extra=()):
    return sum((["--set", s] for s in [*MICRO, *extra]), [])


def _step_metrics(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()
            if json.loads(x)["step"] > 0]


def test_a_merged_lora_checkpoint_trains_every_weight(tmp_path):
    """`--model <a LoRA checkpoint>` with `model.lora_rank=0`: the adapters merged into the base,
    and then a full fine-tune in which the policy's own weights move (PEFT loads the adapters
    over a frozen base; merged as loaded, nothing of the policy would train)."""
    runner = CliRunner()
    lora_run, full_run = tmp_path / "lora", tmp_path / "full"
    res = runner.invoke(app, ["train", "--method", "grpo", "--steps", "1", "--out", str(lora_run),
                              *_cli_sets(LORA)])
    assert res.exit_code == 0, res.output
    ck = checkpoint.step_dir(lora_run, 1)
    assert (ck / lora.ADAPTER_FILE).is_file()
    # an entropy bonus: a gradient on every policy weight whatever the micro model's rewards
    res = runner.invoke(app, ["train", "--method", "grpo", "--model", str(ck), "--steps", "1",
                              "--out", str(full_run),
                              *_cli_sets(["model.lora_rank=0", "algo.entropy_coef=0.1"])])
    assert res.exit_code == 0, res.output
    assert _step_metrics(full_run)[0]["grad_norm"] > 0
    merged = load_policy(config.load(sets=MICRO + [f"model.name={ck}"]), log=lambda s: None)[0]
    assert not lora.is_lora(merged) and all(p.requires_grad for p in merged.parameters())
    trained = load_file(str(checkpoint.step_dir(full_run, 1) / checkpoint.WEIGHTS_FILE))
    start = merged.state_dict()
    moved = [k for k in trained if k in start and not torch.equal(trained[k], start[k])]
    assert any("q_proj" in k for k in moved) and any("mlp" in k for k in moved), moved


class _OddNames(torch.nn.Module):
    """A model whose linear layers have no known projection name (eight of them)."""

    def __init__(self):
        super().__init__()
        from transformers import PretrainedConfig

        self.config = PretrainedConfig(hidden_size=8)
        self.mix = torch.nn.ModuleDict({f"mix{i}": torch.nn.Linear(8, 8) for i in range(8)})


def test_no_known_projection_lists_the_linear_layers_and_the_key():
    cfg = config.load(sets=MICRO + LORA)
    with pytest.raises(ConfigError) as e:
        lora.wrap(_OddNames(), cfg, "odd")
    msg = str(e.value)
    assert "\n" not in msg and "model.lora_targets=" in msg
    assert "mix0, mix1, mix2, mix3, mix4, mix5 and 2 more" in msg, msg
    assert lora.linear_names(_OddNames()) == [f"mix{i}" for i in range(8)]


@pytest.mark.parametrize("rank, needle", [
    ("100000", "model.lora_rank=100000 is above this model's hidden width"),
    ("-1", "model.lora_rank must be >= 0"),
])
def test_a_rank_out_of_bounds_is_one_line_before_any_rollout(tmp_path, rank, needle):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", "--method", "grpo", "--steps", "1", "--out", str(out),
                                   *_cli_sets([f"model.lora_rank={rank}"])])
    assert res.exit_code == 2, res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error")]
    assert len(errors) == 1 and needle in errors[0] and "Traceback" not in res.output
    assert not (out / "metrics.jsonl").exists()      # no step, not even the base evaluation
    width = load_policy(config.load(sets=MICRO), log=lambda s: None)[0].config.hidden_size
    assert str(width) in errors[0] or rank == "-1"


_IDS = dict(vocab_size=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
_LLAMA_LIKE = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
_NEOX_LIKE = {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"}
FAMILIES = {   # a config of each family (one layer, width 32) -> its default LoRA targets
    "qwen2": ("Qwen2Config", dict(num_key_value_heads=2), _LLAMA_LIKE),
    "mistral": ("MistralConfig", dict(num_key_value_heads=2), _LLAMA_LIKE),
    "phi": ("PhiConfig", {}, {"q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2"}),
    "phi3": ("Phi3Config", {}, {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}),
    "gpt2": ("GPT2Config", dict(n_embd=32, n_layer=1, n_head=4), {"c_attn", "c_proj", "c_fc"}),
    "gpt_neox": ("GPTNeoXConfig", {}, _NEOX_LIKE),
    "falcon": ("FalconConfig", {}, _NEOX_LIKE),
}


def _family_model(name):
    import transformers

    cls, extra, _ = FAMILIES[name]
    sizes = {} if name == "gpt2" else dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                           intermediate_size=64)
    if name == "falcon":
        sizes.pop("intermediate_size")
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**_IDS, **sizes, **extra))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_default_targets_cover_the_common_families_and_their_adapters_train(family):
    model = _family_model(family)
    assert set(lora.default_targets(model)) == FAMILIES[family][2]
    cfg = config.load(sets=MICRO + LORA)
    peft_model = lora.wrap(model, cfg, family)
    assert set(peft_model.peft_config["default"].target_modules) == FAMILIES[family][2]
    ids = torch.randint(3, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    peft_model.train()
    peft_model(input_ids=ids, labels=ids).loss.backward()
    grads = [(n, p.grad) for n, p in peft_model.named_parameters() if p.requires_grad]
    assert grads and all(".lora_" in n for n, _ in grads)
    assert any(g is not None and g.abs().max() > 0 for n, g in grads if ".lora_B." in n)

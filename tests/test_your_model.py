"""A researcher's own Hugging Face model: a model folder of another family (Llama) with its own
tokenizer trains through the CLI and its checkpoint evaluates; a chat template that lacks what
agent episodes need is a one-line error naming what is missing, and `model.chat_template`
supplies one."""
from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from agentrl_cli import config
from agentrl_cli.cli.main import app
from agentrl_cli.errors import ConfigError
from agentrl_cli.models.chat import ChatFormat, template_problem
from agentrl_cli.models.loading import load_policy
from conftest import MICRO

runner = CliRunner()
SPECIAL = ["<pad>", "<s>", "</s>"]
# Llama-2-style turns closed by the EOS token, with a tool role
TEMPLATE = ("{% for m in messages %}<s>[{{ m['role'] }}] {{ m['content'] }}</s>\n{% endfor %}"
            "{% if add_generation_prompt %}<s>[assistant] {% endif %}")
NO_TOOL = ("{% for m in messages %}{% if m['role'] != 'tool' %}<s>[{{ m['role'] }}] "
           "{{ m['content'] }}</s>\n{% endif %}{% endfor %}"
           "{% if add_generation_prompt %}<s>[assistant] {% endif %}")
# the last assistant message gets a thinking block the earlier ones lose (as Qwen3's does)
UNSTABLE = ("{% for m in messages %}<s>[{{ m['role'] }}] {% if m['role'] == 'assistant' and "
            "loop.last %}<think></think>{% endif %}{{ m['content'] }}</s>\n{% endfor %}"
            "{% if add_generation_prompt %}<s>[assistant] {% endif %}")


def _texts(n: int = 300) -> list[str]:
    """A few hundred strings of the search env: prompts, expert actions, observations."""
    from agentrl_cli.envs.search import make_search_spec

    spec = make_search_spec(n_entities=100, n_train=595, n_eval=60)
    rng, texts = random.Random(0), []
    env = spec.make()
    texts.append(env.system_prompt)
    for task in spec.tasks("train", 40):
        texts.append(env.reset(task))
        for _ in range(6):
            action = spec.expert(env, rng)
            res = env.step(action)
            texts += [action, res.observation or ""]
            if res.terminated or res.truncated:
                break
    texts += [d.text for d in spec.world.docs]
    return [t for t in texts if t][:n]


def _tokenizer(template: str | None):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(_texts(), trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIAL, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>",
                                  pad_token="<pad>")
    if template is not None:
        tok.chat_template = template
    return tok


def _llama_folder(path, template: str | None = TEMPLATE):
    """A random Llama model (about 300K parameters) with its own tokenizer, as a HF folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = _tokenizer(template)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=192,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=1024, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    assert 100_000 < sum(p.numel() for p in model.parameters()) < 1_000_000
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _gpt2_folder(path):
    """A random GPT-2 model (about 200K parameters: Conv1D projections c_attn, c_proj, c_fc)
    with its own tokenizer, as a HF folder."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = _tokenizer(TEMPLATE)
    cfg = GPT2Config(vocab_size=len(tok), n_embd=64, n_layer=2, n_head=4, n_positions=1024,
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    GPT2LMHeadModel(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return _llama_folder(tmp_path_factory.mktemp("llama") / "model")


def _sets(extra=()):
    return sum((["--set", s] for s in [*MICRO, *extra]), [])


@pytest.mark.parametrize("extra", [[], ["model.lora_rank=4"]], ids=["full", "lora"])
def test_llama_family_trains_two_grpo_steps_and_its_checkpoint_evaluates(llama_dir, tmp_path, extra):
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--method", "grpo", "--env", "search", "--model",
                              str(llama_dir), "--steps", "2", "--out", str(out), *_sets(extra)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["rollout/tokens"] > 0 and r["rollout/logprob_gap"] < 1e-3 for r in steps)
    ck = out / "checkpoints" / "step-000002"
    if extra:       # the adapters over the folder's Llama, on its projections
        conf = json.loads((ck / "adapter_config.json").read_text())
        assert conf["base_model_name_or_path"] == str(llama_dir.resolve())
        assert set(conf["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj",
                                               "gate_proj", "up_proj", "down_proj"}
    else:
        assert json.loads((ck / "config.json").read_text())["model_type"] == "llama"
    res = runner.invoke(app, ["eval", "--checkpoint", str(out), "--json", str(tmp_path / "e.json")])
    assert res.exit_code == 0, res.output
    got = json.loads((tmp_path / "e.json").read_text())
    assert got["checkpoint"] == str(ck) and got["tokens_per_question"] > 0


def test_llama_episodes_round_trip_through_the_template(llama_dir):
    """Token-in, token-out: prompt + action + observation ids equal the ids of the rendered
    conversation (this template is prefix-stable; each observation is its delta)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(llama_dir)
    fmt = ChatFormat.from_tokenizer(tok)
    assert fmt.stop_ids == (tok.eos_token_id,)
    ids = fmt.prompt_ids("sys", "q") + fmt.encode("search(x)") + [fmt.stop_ids[0]]
    ids += fmt.observation_ids("found y")
    want = tok.apply_chat_template(
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"},
         {"role": "assistant", "content": "search(x)"}, {"role": "tool", "content": "found y"}],
        tokenize=False, add_generation_prompt=True)
    assert tok.decode(ids) == want


@pytest.mark.parametrize("template, needle", [
    (None, "has no chat template"),
    (NO_TOOL, "drops the `tool` role"),
    ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}",
     "does not end an assistant message with a stop token"),
])
def test_a_template_lacking_what_episodes_need_is_named(template, needle):
    tok = _tokenizer(template)
    assert needle in template_problem(tok)
    with pytest.raises(ConfigError, match="model.chat_template=PATH"):
        ChatFormat.from_tokenizer(tok)
    assert template_problem(_tokenizer(TEMPLATE)) is None
    assert template_problem(_tokenizer(UNSTABLE)) is None     # earlier turns re-render: fine


def test_template_errors_exit_2_and_model_chat_template_fixes_them(tmp_path):
    bad = _llama_folder(tmp_path / "no-template", template=None)
    res = runner.invoke(app, ["eval", "--model", str(bad), "--env", "search", *_sets()])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.startswith("error")]
    assert len(lines) == 1 and "has no chat template" in lines[0] and str(bad) in lines[0]
    assert "Traceback" not in res.output
    jinja = tmp_path / "chat.jinja"
    jinja.write_text(TEMPLATE)
    cfg = config.load(sets=[*MICRO, f"model.name={bad}", f"model.chat_template={jinja}"])
    model, tok, fmt, _ = load_policy(cfg, log=lambda s: None)
    assert tok.chat_template == TEMPLATE and fmt.stop_ids == (tok.eos_token_id,)
    unstable = tmp_path / "unstable.jinja"      # re-renders earlier turns: each delta is taken
    unstable.write_text(UNSTABLE)
    _, tok, fmt, _ = load_policy(config.load(sets=[*MICRO, f"model.name={bad}",
                                                   f"model.chat_template={unstable}"]), log=lambda s: None)
    assert tok.decode(fmt.observation_ids("found y")) == "\n<s>[tool] found y</s>\n<s>[assistant] "
    with pytest.raises(ConfigError, match="model.chat_template: no file"):
        load_policy(config.load(sets=[*MICRO, f"model.name={bad}",
                                      f"model.chat_template={tmp_path / 'none.jinja'}"]),
                    log=lambda s: None)


def test_gpt2_family_trains_lora_on_its_conv1d_projections(tmp_path):
    """GPT-2's projections are transformers' Conv1D (weight stored as in x out): LoRA finds
    c_attn, c_proj and c_fc by default, adapts them with fan_in_fan_out, a step trains the
    adapters, and the merged weights (what a vLLM engine receives) equal PEFT's own merge."""
    import copy

    import torch
    from safetensors.torch import load_file

    from agentrl_cli.models import lora

    model_dir, out = _gpt2_folder(tmp_path / "gpt2"), tmp_path / "run"
    # an entropy bonus: a gradient on the adapters whatever the random model's rewards
    res = runner.invoke(app, ["train", "--method", "grpo", "--env", "search", "--model",
                              str(model_dir), "--steps", "1", "--out", str(out),
                              *_sets(["model.lora_rank=4", "algo.entropy_coef=0.1"])])
    assert res.exit_code == 0, res.output
    assert "lora: rank 4 adapters on c_attn, c_fc, c_proj" in res.output
    ck = out / "checkpoints" / "step-000001"
    conf = json.loads((ck / "adapter_config.json").read_text())
    assert set(conf["target_modules"]) == {"c_attn", "c_proj", "c_fc"} and conf["fan_in_fan_out"]
    adapters = load_file(str(ck / "adapter_model.safetensors"))
    assert any(".lora_B." in k and v.abs().max() > 0 for k, v in adapters.items())  # B starts at 0

    policy = load_policy(config.load(sets=[*MICRO, f"model.name={ck}", "model.lora_rank=4"]),
                         log=lambda s: None)[0]
    merged, want = lora.merged_state_dict(policy), copy.deepcopy(policy).merge_and_unload().state_dict()
    assert merged.keys() == want.keys()
    assert all(torch.allclose(merged[k], want[k], atol=1e-6) for k in want)
    res = runner.invoke(app, ["train", "--method", "grpo", "--env", "search", "--model",
                              str(model_dir), "--steps", "1", "--out", str(tmp_path / "bad"),
                              *_sets(["model.lora_rank=4", "model.lora_targets=q_proj"])])
    assert res.exit_code == 2 and "its linear layers: c_attn, c_fc, c_proj, lm_head" in res.output

"""MCP tools as an env: the tools a stdio MCP server lists (examples/mcp_calc_server.py, started
by the tests) become the env's JSON-schema tools; tasks and the reward come from the user's file
(examples/mcp_calc_env.py); it trains from the CLI and from `agentrl_cli.api`."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl_cli import config
from agentrl_cli.cli.main import app
from agentrl_cli.envs.base import Task, make_env_spec
from agentrl_cli.envs.mcp_env import MCPSpec
from agentrl_cli.envs.tool_calls import tool_spec
from conftest import MICRO
from test_gym_env import _one_line_error, _sets

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "mcp_calc_env.py"
SERVER = [sys.executable, str(ROOT / "examples" / "mcp_calc_server.py")]
runner = CliRunner()

STATEFUL = f'''
import importlib.util
_s = importlib.util.spec_from_file_location("mcp_calc_for_stateful", {str(EXAMPLE)!r})
calc = importlib.util.module_from_spec(_s)
_s.loader.exec_module(calc)


def make(seed=0, max_turns=6):
    spec = calc.make(seed, max_turns=max_turns)
    spec.stateless = False        # the server's state is not copied: no forks
    return spec
'''


@pytest.fixture(scope="module")
def spec():
    s = make_env_spec(config.load(**{"env.name": f"{EXAMPLE}:make"}).env)
    yield s
    s.close()


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    """A random Qwen3 model with the Hermes template (as test_tool_formats builds it)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    import test_tool_formats as ttf

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(ttf._texts(), trainers.BpeTrainer(
        vocab_size=1000, special_tokens=ttf.SPECIAL, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>")
    tok.add_tokens(ttf.TAGS)
    tok.chat_template = ttf.HERMES
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, max_position_embeddings=4096, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, tie_word_embeddings=True)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("qwen3-mcp") / "model"
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_the_servers_tools_are_the_envs_json_schema_tools(spec):
    names = [s["function"]["name"] for s in spec.tool_schemas]
    assert names == ["add", "multiply", "answer"]
    mul = spec.tool_schemas[1]["function"]
    assert mul["description"] == "Multiply two numbers: a * b."
    assert mul["parameters"]["required"] == ["a", "b"]
    assert mul["parameters"]["properties"]["a"]["type"] == "number"
    assert "- multiply(a: number, b: number)" in spec.system_prompt


def test_text_calls_reach_the_server_and_the_users_reward_scores_the_answer(spec):
    task = spec.tasks("train")[0]
    env = spec.make()
    assert env.reset(task) == task.prompt
    r = env.step('multiply({"a": 6, "b": 7})')
    assert (r.observation, r.reward, r.terminated, r.info["tool"], r.info["error"]) == (
        "42", 0.0, False, "multiply", False)
    r = env.step('add({"a": "x", "b": 1})')
    assert r.info["error"] and "add" in r.observation          # the server's own error
    r = env.step("hello")
    assert r.info["error"] and r.observation.startswith("error: no tool call")
    r = env.step(f"answer({task.answer})")
    assert (r.reward, r.terminated, r.info["success"]) == (1.0, True, True)
    env.reset(task)
    assert env.step("answer(-1)").reward == 0.0
    env.reset(task)
    results = [env.step("add(1)") for _ in range(spec.max_turns)]
    assert [r.truncated for r in results] == [False] * (spec.max_turns - 1) + [True]


def test_hermes_calls_reach_the_server_as_dicts(spec):
    env = tool_spec(spec, "hermes", "mcp").make()
    env.reset(spec.tasks("eval")[0])
    r = env.step('<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>')
    assert r.observation == "42" and not r.info["error"]
    r = env.step('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    assert r.info["error"] and "missing its required argument 'b'" in r.observation


def test_tasks_as_dicts_a_server_that_exits_and_one_that_does_not_start():
    spec = MCPSpec(SERVER, tasks=lambda split: [{"prompt": "Compute 2 + 3.", "answer": "5"}],
                   reward=lambda task, answer: float(answer == task.answer))
    (task,) = spec.tasks("eval")
    assert (task.task_id, task.answer) == ("eval-00000", "5")
    env = spec.make()
    env.reset(task)
    assert env.step('add({"a": 2, "b": 3})').observation == "5"
    spec.close()
    with pytest.raises(ConnectionError, match="has exited"):
        env.step('add({"a": 2, "b": 3})')
    from agentrl_cli.errors import ConfigError

    with pytest.raises(ConfigError, match="the MCP server .* did not start"):
        MCPSpec([sys.executable, "-c", "import sys; sys.exit(3)"], tasks={}, reward=lambda t, a: 0.0)


def test_the_example_passes_check_env_and_trains_from_the_cli(model_dir, tmp_path):
    res = runner.invoke(app, ["check-env", f"{EXAMPLE}:make"])
    assert res.exit_code == 0, res.output
    assert "100 train / 20 eval tasks with gold answers" in res.output
    for method in ("grpo", "focus"):          # stateless tools: FOCUS forks the episodes
        out = tmp_path / method
        res = runner.invoke(app, ["train", "--method", method, "--env", f"{EXAMPLE}:make",
                                  "--model", str(model_dir), "--steps", "2", "--out", str(out),
                                  *_sets()])
        assert res.exit_code == 0, res.output
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if r["step"] > 0] == [1, 2]


def test_a_stateful_server_env_is_refused_by_focus(model_dir, tmp_path):
    f = tmp_path / "stateful_mcp.py"
    f.write_text(STATEFUL)
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--method", "focus", "--env", f"{f}:make",
                              "--model", str(model_dir), "--steps", "1", "--out", str(out), *_sets()])
    _one_line_error(res, "method focus forks episodes (snapshot/restore)")
    assert "the MCP server's state cannot be copied" in res.output and not out.exists()


def test_the_api_trains_it_with_the_servers_tools_as_json_schema_tools(qwen3_dir, tmp_path):
    from agentrl_cli import api

    sets = [*MICRO, "model.tool_format=hermes", "rollout.max_tokens=1536", "train.trace_every=1",
            "train.steps=2"]
    cfg = api.load_config(sets=sets, method="grpo", env=f"{EXAMPLE}:make", model=str(qwen3_dir))
    seen = []
    out = tmp_path / "api-run"
    api.train(cfg, out, log=lambda s: None, on_step=lambda step, row: seen.append(step))
    assert seen == [1, 2]
    trace = json.loads((out / "traces" / "step-000001.json").read_text())
    ep = trace["episodes"][0]
    prompt = "".join(ep["tokens"][:ep["turns"][0]["start"]])
    for name in ("add", "multiply", "answer"):
        assert f'"name": "{name}"' in prompt
    assert "<tools>" in prompt and "Multiply two numbers" in prompt


def test_a_task_object_is_kept():
    spec = MCPSpec(SERVER, tasks={"train": [Task("t1", "Compute 1 + 1.", "2")]},
                   reward=lambda task, answer: 1.0)
    try:
        assert spec.tasks("train") == [Task("t1", "Compute 1 + 1.", "2")]
        from agentrl_cli.errors import ConfigError

        with pytest.raises(ConfigError, match="has no 'eval' tasks"):
            spec.tasks("eval")
    finally:
        spec.close()


def test_a_spec_that_is_dropped_stops_its_server():
    """The client task does not keep its connection alive: collecting the spec closes the
    client and the server (as `spec.close()` and interpreter exit do)."""
    import gc

    spec = MCPSpec(SERVER, tasks={"eval": [{"prompt": "p", "answer": "1"}]},
                   reward=lambda task, answer: 0.0)
    served = spec.connection._state["served"]
    assert not served.done()
    del spec
    gc.collect()
    served.result(timeout=30)

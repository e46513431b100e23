"""Tools as real models write them: the envs' tools as JSON schemas rendered by the chat template
(`tools=`), calls in the model's own format (`model.tool_format`: hermes, llama3-json), malformed
calls as error observations, and templates that render earlier turns differently from the last
(Qwen3's thinking blocks) taken as they are: each new message is the delta of the rendering,
the policy's tokens are kept as generated. A random Qwen3-architecture model with its own
tokenizer and a Hermes-style template trains through the CLI."""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl_cli import config
from agentrl_cli.cli.main import app
from agentrl_cli.context import make_spec
from agentrl_cli.context.episode import LiveEpisode, append_turn, apply_step, new_episode
from agentrl_cli.envs.base import ENVS, StepResult, Task, make_env_spec
from agentrl_cli.envs.tool_calls import TOOL_FORMATS, check_schemas, function_tool, tool_spec
from agentrl_cli.errors import ConfigError
from agentrl_cli.models.chat import ChatFormat, render, template_problem
from conftest import MICRO

runner = CliRunner()
DATA = Path(__file__).parent / "data"
QWEN3 = (DATA / "qwen3_like.jinja").read_text()
HERMES = (DATA / "hermes.jinja").read_text()
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAGS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>"]
# ChatML turns that ignore tools=: fine for `text`, not for a JSON tool format
PLAIN = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _search_spec(fmt: str = "hermes", max_turns: int = 3):
    env = config.load(sets=[*MICRO, f"env.max_turns={max_turns}"]).env
    return tool_spec(make_env_spec(env), fmt, "search")


def _call(name: str, **args) -> str:
    return TOOL_FORMATS["hermes"].write(name, args)


def _texts() -> list[str]:
    """Strings a search episode holds: prompts, calls in both formats, observations, schemas."""
    spec = make_env_spec(config.load(sets=MICRO).env)
    rng, texts = random.Random(0), [json.dumps(s) for s in spec.tool_schemas] * 5
    env = spec.make()
    for task in spec.tasks("train", 40):
        texts.append(env.reset(task))
        for _ in range(6):
            action = spec.expert(env, rng)
            res = env.step(action)
            texts += [action, res.observation or "", _search_spec().write_call(action)]
            if res.terminated or res.truncated:
                break
    return texts + [QWEN3, HERMES]


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(_texts(), trainers.BpeTrainer(
        vocab_size=1000, special_tokens=SPECIAL, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>")
    tok.add_tokens(TAGS)          # as Qwen's: whole tokens that decoding keeps
    return tok


def _with(tok, template: str):
    import copy

    tok = copy.deepcopy(tok)
    tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory, tokenizer):
    """A random Qwen3 model (2 layers, hidden 64) with the tokenizer and the Hermes template."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = _with(tokenizer, HERMES)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, max_position_embeddings=4096, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, tie_word_embeddings=True)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("qwen3") / "model"
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


# ---------------------------------------------------------------- tools as JSON schemas

@pytest.mark.parametrize("env", ["search", "locate", "rules", "math"])
def test_builtin_envs_declare_their_tools_as_json_schemas(env):
    spec = make_env_spec(config.EnvConfig(name=env))
    schemas = check_schemas(spec.tool_schemas, env)
    assert tuple(s["function"]["name"] for s in schemas) == spec.make().tools
    for s in schemas:
        params = s["function"]["parameters"]
        assert s["function"]["description"] and params["required"] == list(params["properties"])
    assert spec.tools_system_prompt != spec.make().system_prompt


@pytest.mark.parametrize("bad, needle", [
    ([], "non-empty list"),
    ([{"name": "f"}], "tool_schemas[0] is not"),
    ([{"type": "function", "function": {"description": "no name"}}], "has no name"),
    ([function_tool("f", "d", required=("x", "y"), x=("string", ""))], "required names"),
])
def test_a_malformed_schema_is_a_one_line_error(bad, needle):
    with pytest.raises(ConfigError, match="env 'mine'") as e:
        check_schemas(bad, "mine")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_tool_formats_match_the_config_choices():
    assert ("text", *TOOL_FORMATS) == config._CHOICES["model.tool_format"]
    with pytest.raises(ConfigError, match="model.tool_format must be one of text, hermes, llama3-json"):
        config.load(sets=[*MICRO, "model.tool_format=xml"])
    assert config.load().model.tool_format == "text"
    assert _search_spec("text").__class__.__name__ == "SearchSpec"      # text: nothing wraps


# ---------------------------------------------------------------- calls in the model's format

def test_a_hermes_call_acts_as_the_env_text_call():
    spec, plain = _search_spec(), make_env_spec(config.load(sets=MICRO).env)
    task = spec.tasks("train", 1)[0]
    env, ref = spec.make(), plain.make()
    env.reset(task), ref.reset(task)
    start = task.meta["chain"][0]
    got = env.step(f"<think>\nlook it up\n</think>\n\n{_call('search', query=start)}")
    want = ref.step(f"search({start})")
    assert got.observation == want.observation and "d" in got.observation and not got.info["error"]
    assert env.history[-1]["action"] == f"search({start})" and env.tool_schemas == spec.tool_schemas
    assert "tool(" not in env.system_prompt and "answer" in env.system_prompt


def test_a_llama3_json_call_acts_as_the_env_text_call():
    spec = _search_spec("llama3-json")
    task = spec.tasks("train", 1)[0]
    env = spec.make()
    env.reset(task)
    res = env.step('<|python_tag|>{"name": "answer", "parameters": {"text": "%s"}}' % task.answer)
    assert res.terminated and res.reward == 1.0 and res.info["success"]
    assert spec.write_call("open(d3)") == '{"name": "open", "parameters": {"doc_id": "d3"}}'


@pytest.mark.parametrize("message, needle", [
    ('<tool_call>{"name": "search", "arguments": {"query": "x"</tool_call>', "is not valid JSON"),
    ('<tool_call>{"name": "browse", "arguments": {"url": "x"}}</tool_call>',
     "unknown tool 'browse'; the tools: search, open, answer"),
    ('<tool_call>{"name": "open", "arguments": {}}</tool_call>',
     "open is missing its required argument 'doc_id'"),
    ('<tool_call>{"name": "open", "arguments": {"doc_id": 12}}</tool_call>',
     "open's argument 'doc_id' must be string, got 12"),
    ('<tool_call>{"name": "open", "arguments": {"doc_id": "d1", "page": 2}}</tool_call>',
     "open has no argument 'page'; its arguments: doc_id"),
    (_call("search", query="a") + _call("search", query="b"), "one tool call per message, got 2"),
    ('<tool_call>{"name": "search", "arguments": {"query": "x"}}', "not closed"),
    ('<tool_call>["search"]</tool_call>', 'a tool call is a JSON object with "name"'),
    ("search(Mira Quell) please", "no tool call; call one tool per message as <tool_call>"),
])
def test_a_malformed_call_is_an_error_observation(message, needle):
    spec = _search_spec()
    env = spec.make()
    env.reset(spec.tasks("train", 1)[0])
    res = env.step(message)
    assert needle in res.observation and res.observation.startswith("error: ")
    assert res.info["error"] and not res.terminated and not res.truncated and res.reward == 0.0
    assert env.steps == 1          # the env counted the message: turn limits still hold


def test_malformed_calls_still_end_the_episode_at_max_turns():
    spec = _search_spec()
    env = spec.make()
    env.reset(spec.tasks("train", 1)[0])
    results = [env.step("<tool_call>{oops</tool_call>") for _ in range(3)]    # MICRO: 3 turns
    assert [r.truncated for r in results] == [False, False, True]


def test_a_user_env_gets_calls_as_dicts_and_one_without_schemas_is_named(tmp_path):
    class Env:
        system_prompt, max_turns = "Use f.", 3

        def reset(self, task):
            self.calls = []
            return task.prompt

        def step(self, action):
            return StepResult(f"text: {action}", 0.0, False, False, {"error": True})

        def step_call(self, name, arguments):
            self.calls.append((name, arguments))
            return StepResult(f"{name} {arguments['n'] + 1}", 0.0, False, False, {"tool": name})

        def snapshot(self):
            return list(self.calls)

        def restore(self, state):
            self.calls = list(state)

    class Spec:
        name = "mine"
        tool_schemas = [function_tool("f", "add one", n=("integer", "a number"))]

        def make(self):
            return Env()

        def tasks(self, split, n=None):
            return [Task("t0", "go", "1")]

    env = tool_spec(Spec(), "hermes", "mine").make()
    env.reset(Task("t0", "go", "1"))
    assert env.step(_call("f", n=41)).observation == "f 42" and env.inner.calls == [("f", {"n": 41})]
    assert "must be integer, got true" in env.step(_call("f", n=True)).observation
    Spec.tool_schemas = None
    with pytest.raises(ConfigError, match="env 'mine' declares no tool_schemas .* model.tool_format=hermes"):
        tool_spec(Spec(), "hermes", "mine")


# ---------------------------------------------------------------- templates, deltas, masks

def test_templates_that_rerender_earlier_turns_are_accepted(tokenizer):
    tok = _with(tokenizer, QWEN3)
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>\nhm\n</think>\n\na"}]
    last = render(tok, msgs, False)
    later = render(tok, msgs + [{"role": "tool", "content": "o"}], True)
    assert not later.startswith(last[:last.rindex("<|im_end|>")])    # not prefix-stable
    for fmt in ("text", "hermes", "llama3-json"):
        assert template_problem(tok, fmt) is None
    assert template_problem(_with(tokenizer, HERMES), "hermes") is None


@pytest.mark.parametrize("template, fmt, needle", [
    (PLAIN, "hermes", "does not render the tool schemas (tools=), which model.tool_format=hermes needs"),
    ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'tool' %}"
     "{{ loop.index }}{% endif %}{{ m['content'] }}<|im_end|>\n{% endfor %}"
     "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
     "text", "renders a tool message differently after the first and the second assistant"),
])
def test_a_template_lacking_what_a_format_needs_is_named(tokenizer, template, fmt, needle):
    tok = _with(tokenizer, template)
    assert needle in template_problem(tok, fmt)
    with pytest.raises(ConfigError, match="model.chat_template=PATH"):
        ChatFormat.from_tokenizer(tok, tool_format=fmt)
    assert template_problem(tok, "text") is None or fmt == "text"


def _episode(fmt, spec, actions: list[str]):
    """Feed hand-written model outputs as the policy's tokens through the runner's bookkeeping."""
    task = spec.tasks("train", 1)[0]
    env = spec.make()
    user = env.reset(task)
    live = LiveEpisode(new_episode(task, 0, fmt.prompt_ids(env.system_prompt, user, env.tool_schemas)), env)
    generated = []
    for action in actions:
        ids = fmt.encode(action) + [fmt.stop_ids[0]]
        generated.append(ids)
        turn = append_turn(live.ep, ids, [-0.5] * len(ids), fmt.decode_action(ids))
        if apply_step(live, fmt, turn, 4096, 64) is None:
            break
    return live.ep, env, generated, user


def test_a_multi_turn_hermes_episode_keeps_policy_tokens_and_masks_only_them(tokenizer):
    """Qwen3-like template: earlier thinking blocks are dropped on re-rendering, yet the stored
    policy tokens are those generated, each observation is the template's delta, and only the
    policy's tokens carry loss."""
    tok = _with(tokenizer, QWEN3)
    fmt = ChatFormat.from_tokenizer(tok, tool_format="hermes")
    spec = _search_spec(max_turns=12)
    rng = random.Random(0)
    probe = spec.make()
    task = spec.tasks("train", 1)[0]
    probe.reset(task)
    actions = []
    for _ in range(8):                # the expert's calls, in hermes, each after some thinking
        a = spec.expert(probe, rng)
        actions.append(f"<think>\nstep {len(actions)}\n</think>\n\n{a}")
        if probe.step(a).terminated:
            break
    actions.insert(1, '<tool_call>{"name": "open", "arguments": {"doc_id": 7}}</tool_call>')
    ep, env, generated, user = _episode(fmt, spec, actions)
    assert ep.finish == "answer" and ep.success and len(ep.turns) == len(actions)
    assert "must be string, got 7" in ep.turns[1].observation
    mask = [i for i, m in enumerate(ep.response_mask) if m]
    want = [i for t in ep.turns for i in range(t.start, t.end)]
    assert mask == want and all(ep.logprobs[i] == -0.5 for i in mask)
    assert [ep.token_ids[t.start:t.end] for t in ep.turns] == generated    # token out, as generated
    msgs = [{"role": "system", "content": env.system_prompt}, {"role": "user", "content": user}]
    for t in ep.turns[:-1]:
        msgs += [{"role": "assistant", "content": t.action}, {"role": "tool", "content": t.observation}]
        delta = tok.decode(ep.token_ids[t.obs_start:t.obs_end])
        assert delta == (f"\n<|im_start|>user\n<tool_response>\n{t.observation}\n</tool_response>"
                         f"<|im_end|>\n<|im_start|>assistant\n")
        assert render(tok, msgs, True, env.tool_schemas).endswith(delta)
    prompt = tok.decode(ep.token_ids[:ep.turns[0].start])
    assert '<tools>\n{"type": "function", "function": {"name": "search"' in prompt


def test_a_malformed_model_output_in_the_cli_setting_is_an_error_observation(qwen3_dir, tokenizer):
    """The run's own runtime objects (the model folder's template, `make_spec` under
    model.tool_format=hermes) on a hand-written model output with a broken call."""
    from agentrl_cli.models.loading import chat_format

    cfg = config.load(sets=[*MICRO, f"model.name={qwen3_dir}", "model.tool_format=hermes"])
    _, fmt = chat_format(cfg, str(qwen3_dir))
    out = '<tool_call>\n{"name": "search", "arguments": {"query": "Zorblax" }\n</tool_call>'
    ep, _, _, _ = _episode(fmt, make_spec(cfg), [out])
    assert ep.turns[0].action == out
    assert ep.turns[0].observation.startswith("error: the tool call is not valid JSON")
    assert tokenizer.decode(ep.token_ids[ep.turns[0].obs_start:]).startswith(
        "\n<|im_start|>tool\n<tool_response>\nerror: the tool call is not valid JSON")


def test_a_qwen3_model_trains_two_grpo_steps_with_json_tools(qwen3_dir, tmp_path):
    out = tmp_path / "run"
    sets = [*MICRO, "model.tool_format=hermes", "rollout.max_tokens=1536", "train.trace_every=1"]
    res = runner.invoke(app, ["train", "--method", "grpo", "--env", "search", "--model",
                              str(qwen3_dir), "--steps", "2", "--out", str(out),
                              *sum((["--set", s] for s in sets), [])])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["step"] > 0] == [1, 2]
    trace = json.loads((out / "traces" / "step-000001.json").read_text())
    ep = trace["episodes"][0]
    prompt = "".join(ep["tokens"][:ep["turns"][0]["start"]])
    for name in ("search", "open", "answer"):
        assert f'"name": "{name}"' in prompt
    assert "<tools>" in prompt and "doc_id" in prompt
    observations = [t["observation"] for e in trace["episodes"] for t in e["turns"]]
    assert any(o.startswith("error: ") and "<tool_call>" in o for o in observations)


def test_a_template_without_tools_under_hermes_exits_2(tmp_path, qwen3_dir):
    jinja = tmp_path / "plain.jinja"
    jinja.write_text(PLAIN)
    res = runner.invoke(app, ["eval", "--model", str(qwen3_dir), "--env", "search",
                              *sum((["--set", s] for s in [*MICRO, "model.tool_format=hermes",
                                                            f"model.chat_template={jinja}"]), [])])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.startswith("error")]
    assert len(lines) == 1 and "does not render the tool schemas" in lines[0]


def test_the_python_api_trains_the_qwen3_model_with_json_tools(qwen3_dir, tmp_path):
    """The same run from Python (`agentrl_cli.api`): two GRPO steps with hermes tool calls, a
    step callback that sees each row, the traced prompt holding the tool schemas."""
    from agentrl_cli import api

    sets = [*MICRO, "model.tool_format=hermes", "rollout.max_tokens=1536", "train.trace_every=1",
            "train.steps=2"]
    cfg = api.load_config(sets=sets, method="grpo", env="search", model=str(qwen3_dir))
    assert cfg.model.tool_format == "hermes"
    seen = []
    out = tmp_path / "api-run"
    summary = api.train(cfg, out, log=lambda s: None,
                        on_step=lambda step, row: seen.append((step, row["rollout/tokens"])))
    assert [s for s, _ in seen] == [1, 2] and all(t > 0 for _, t in seen)
    assert (out / "summary.json").is_file() and "final_success" in summary
    trace = json.loads((out / "traces" / "step-000001.json").read_text())
    ep = trace["episodes"][0]
    prompt = "".join(ep["tokens"][:ep["turns"][0]["start"]])
    assert "<tools>" in prompt and '"name": "search"' in prompt


# a tool env whose scripted expert writes hostile tool calls: deeply nested JSON, a huge
# integer, 16,384 unclosed tags (one per task), then a valid answer
HOSTILE_ENV = '''
from agentrl_cli.envs import StepResult, Task
from agentrl_cli.envs.tool_calls import function_tool

HOSTILE = {
    "t0": "<tool_call>" + "[" * 100_000 + "</tool_call>",
    "t1": '<tool_call>{"name": "search", "arguments": {"query": ' + "9" * 5000 + "}}</tool_call>",
    "t2": "<tool_call>" * 16_384,
}


class Env:
    system_prompt = "Search, then answer."

    def reset(self, task):
        self.task, self.steps = task, 0
        return task.prompt

    def step(self, action):
        self.steps += 1
        done = action.startswith("answer(")
        return StepResult("noted", 1.0 if done else 0.0, done, False, {"error": not done})

    def snapshot(self):
        return {"task": self.task, "steps": self.steps}

    def restore(self, state):
        self.task, self.steps = state["task"], state["steps"]


class Spec:
    name = "hostile"
    reward_range = (0.0, 1.0)
    tool_schemas = [function_tool("search", "Search.", query=("string", "the query")),
                    function_tool("answer", "Answer; ends the episode.", text=("string", "it"))]

    def make(self):
        return Env()

    def tasks(self, split, n=None):
        tasks = [Task(t, f"Question {t}.", "done") for t in HOSTILE]
        return tasks if n is None else tasks[:n]

    def expert(self, env, rng, error_rate=0.0):
        return HOSTILE[env.task.task_id] if env.steps == 0 else "answer(done)"


def make(seed=0, max_turns=3):
    return Spec()
'''


def test_hostile_tool_calls_from_the_policy_are_error_observations(qwen3_dir, tmp_path):
    """`agentrl rollout` of a policy that writes deeply nested JSON, a 5,000-digit integer and
    16,384 unclosed <tool_call> tags: each episode gets an error observation naming the
    problem (not an env error, not a traceback), answers on its next turn and ends; the
    command finishes (rollout.max_tokens: a context that holds them)."""
    f = tmp_path / "hostile_env.py"
    f.write_text(HOSTILE_ENV)
    out = tmp_path / "eps.jsonl"
    t0 = time.time()
    res = runner.invoke(app, ["rollout", "--env", f"{f}:make", "--model", str(qwen3_dir),
                              "--policy", "expert", "--n", "3", "--out", str(out),
                              *sum((["--set", s] for s in [*MICRO, "model.tool_format=hermes",
                                                             "rollout.max_tokens=400000"]), [])])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert time.time() - t0 < 120
    eps = {e["task_id"]: e for e in map(json.loads, out.read_text().splitlines())}
    needles = {"t0": "nests JSON deeper than 32 levels",
               "t1": "a number in the tool call has 5,000 characters",
               "t2": "not closed"}
    assert set(eps) == set(needles), list(eps)
    for task, needle in needles.items():
        first, last = eps[task]["turns"][0], eps[task]["turns"][-1]
        assert first["observation"].startswith("error: ") and needle in first["observation"], \
            (eps[task]["finish"], first["observation"][:300])
        assert len(eps[task]["turns"]) == 2 and eps[task]["reward"] == 1.0, eps[task]["finish"]
        assert "env_error" not in json.dumps(eps[task].get("meta", {})), eps[task].get("meta")

"""Every place a user's code runs is guarded as `env.step` is (envs/guard.py): an env's `reset`,
`snapshot` and `restore`, reward functions and FOCUS allocators are timed, their exits and
exceptions are one line naming the function, its file and the task; rewards are numbers in
range, scored on copies; a world whose every episode fails stops the run
(`env.max_error_rate`); check-env names the key a snapshot shares with the live env; tool
calls are parsed in linear time with bounded JSON; lone surrogates never reach the tokenizer;
a full disk in any save and an empty train split are one line."""
from __future__ import annotations

import errno
import json
import sys
import time

import pytest
from typer.testing import CliRunner

from agentrl_cli.cli.main import app
from agentrl_cli.envs.base import StepResult
from agentrl_cli.envs.tool_calls import TOOL_FORMATS, ToolCallEnv, ToolCallError, function_tool, read_call
from agentrl_cli.rollout.rewards import RewardFn, apply_rewards
from agentrl_cli.types import Episode
from test_env_boundary import _error_line, _sets

runner = CliRunner()

# an env whose fault is an option: env.mode
WORLD = '''
import sys

from agentrl_cli.envs import StepResult, Task


class World:
    system_prompt = "Reply with anything; the second message ends the episode."

    def __init__(self, mode):
        self.mode, self.state = mode, {"hist": []}

    def reset(self, task):
        if self.mode == "raise_reset":
            raise ValueError("no such task")
        self.state = {"hist": []}
        return task.prompt

    def step(self, action):
        if self.mode == "exit_step":
            sys.exit(3)
        if self.mode == "raise":
            raise RuntimeError("the world is down")
        self.state["hist"].append(len(action))
        done = len(self.state["hist"]) >= 2
        obs = "" if done else ("lone \\ud800 surrogate" if self.mode == "surrogate" else "ok")
        return StepResult(obs, 1.0 if done else 0.0, done, False, {})

    def snapshot(self):
        if self.mode == "exit_snapshot":
            sys.exit(4)
        return self.state if self.mode == "alias" else {"hist": list(self.state["hist"])}

    def restore(self, state):
        self.state = {"hist": list(state["hist"])}


class Spec:
    name = "world"

    def __init__(self, mode):
        self.mode = mode
        self._tasks = [Task(f"t{i}", f"Say {i}.", str(i)) for i in range(8)]

    def make(self):
        if self.mode == "exit_make":
            sys.exit(5)
        return World(self.mode)

    def tasks(self, split, n=None):
        if self.mode == "exit_tasks":
            sys.exit(6)
        out = self._tasks[:4] if split == "train" else self._tasks[4:]
        if split == "train" and self.mode == "empty_train":
            out = []
        return list(out if n is None else out[:n])


def make(seed=0, mode="ok", max_turns=3):
    return Spec(mode)
'''

REWARDS = '''
import sys
import time

def exits(task_id):
    sys.exit(0)

def text(task_id):
    return "0.5"

def huge(task_id):
    return 1e300

def sleeps(task_id):
    time.sleep(30)

def cheat(episode):
    episode.reward = 100.0
    return 0.0
'''

ALLOCATOR = '''
import sys

def leave(candidates, ctx):
    sys.exit(0)
'''


@pytest.fixture
def world(tmp_path):
    f = tmp_path / "world_env.py"
    f.write_text(WORLD)
    return f"{f}:make"


# ------------------------------------------------------------------ the env's other calls
@pytest.mark.parametrize("mode, needles", [
    ("raise_reset", [", step reset: reset() (", "world_env.py:", ") raised ValueError: no such task"]),
    ("exit_step", [", step 1: step() (", ") raised SystemExit: 3: an env must not end the process"]),
])
def test_a_raising_reset_or_an_exiting_step_is_one_named_line(mode, needles, world, model_dir,
                                                              tmp_path):
    res = runner.invoke(app, ["rollout", "--env", world, "--model", model_dir, "--n", "2",
                              "--out", str(tmp_path / "eps.jsonl"), *_sets(f"env.mode={mode}")])
    _error_line(res, f"env '{world}', task t", *needles)
    assert not (tmp_path / "eps.jsonl").exists()


@pytest.mark.parametrize("command, mode, needles", [
    (["check-env"], "exit_step", [", step 1: step(", "world_env.py:", ") raised SystemExit: 3: an "
                                  "env must not end the process (during the fork check)"]),
    (["check-env"], "exit_snapshot", [": the env raised SystemExit: 4: an env must not end the "
                                      "process (during the fork check)"]),
    (["train", "--method", "grpo"], "exit_step", [") raised SystemExit: 3: an env must not end the "
                                                  "process (during the determinism check)"]),
    (["train", "--method", "focus"], "exit_snapshot", ["raised SystemExit: 4", "(during the fork check)"]),
])
def test_an_env_exiting_in_the_checks_before_a_run_is_one_named_line(command, mode, needles, world,
                                                                    model_dir, tmp_path):
    """check-env, and train's determinism and fork checks (before any model loads), call the
    env outside the rollout's guard: an exit there is the same one line, not the env's exit
    code and no output."""
    args = ([world, "--set", f"env.mode={mode}"] if command == ["check-env"] else
            ["--env", world, "--model", model_dir, "--out", str(tmp_path / "run"),
             *_sets("train.steps=1", f"env.mode={mode}")])
    res = runner.invoke(app, [*command, *args])
    _error_line(res, f"env '{world}', task t", *needles)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("mode, needles", [
    ("exit_make", [": make() (", "world_env.py:", ") raised SystemExit: 5: an env must not end the process"]),
    ("exit_tasks", [": tasks('", "world_env.py:", ") raised SystemExit: 6: an env must not end the process"]),
])
def test_a_spec_whose_make_or_tasks_exits_is_one_named_line(mode, needles, world, model_dir, tmp_path):
    """The spec's `make()` and `tasks()` run under the guard too (no determinism or fork check
    runs before a rollout): an exit is one line, not the spec's exit code and no output."""
    res = runner.invoke(app, ["rollout", "--env", world, "--model", model_dir, "--n", "2",
                              "--out", str(tmp_path / "eps.jsonl"), *_sets(f"env.mode={mode}")])
    _error_line(res, f"env '{world}'", *needles)
    assert not (tmp_path / "eps.jsonl").exists()


def test_a_lone_surrogate_in_an_observation_is_replaced(world, model_dir, tmp_path):
    out = tmp_path / "eps.jsonl"
    res = runner.invoke(app, ["rollout", "--env", world, "--model", model_dir, "--n", "2",
                              "--out", str(out), *_sets("env.mode=surrogate")])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "lone \\ufffd surrogate" in text or "lone \ufffd surrogate" in text, text[:500]


def test_check_env_names_the_key_a_snapshot_shares_with_the_live_env(world):
    res = runner.invoke(app, ["check-env", world, "--set", "env.mode=alias"])
    assert res.exit_code == 2, res.output
    assert "shares mutable state with the live env" in res.output, res.output
    assert "snapshot()['hist']" in res.output, res.output
    ok = runner.invoke(app, ["check-env", world])
    assert "shares mutable state" not in ok.output, ok.output


def test_focus_refuses_an_aliasing_snapshot_before_any_model_work(world, model_dir, tmp_path):
    res = runner.invoke(app, ["train", "--method", "focus", "--env", world, "--model", model_dir,
                              "--out",
                              str(tmp_path / "run"), *_sets("env.mode=alias", "train.steps=1")])
    _error_line(res, "fails the fork check", "snapshot()['hist']")


# ------------------------------------------------------------------ a failing world stops
def test_a_world_whose_every_episode_fails_stops_the_run(world, model_dir, tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--method", "grpo", "--env", world, "--model", model_dir,
                              "--out", str(out), *_sets("env.mode=raise", "train.steps=2")])
    _error_line(res, f"env '{world}': 4 of the 4 episodes of step 1 ended in an env error, "
                     "above env.max_error_rate=0.99; the first: task t",
                "RuntimeError: the world is down")
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()] \
        if (out / "metrics.jsonl").exists() else []
    assert not any(r["step"] > 0 for r in rows)


def test_an_empty_train_split_is_one_line(world, model_dir, tmp_path):
    res = runner.invoke(app, ["train", "--method", "grpo", "--env", world, "--model", model_dir,
                              "--out", str(tmp_path / "run"),
                              *_sets("env.mode=empty_train", "env.deterministic=false",
                                     "train.steps=1")])
    _error_line(res, f"env '{world}' has no training tasks")


# ------------------------------------------------------------------ reward functions
@pytest.mark.parametrize("fn, extra, needles", [
    ("exits", [], ["raised SystemExit: 0: user code must not end the process"]),
    ("text", [], ["returned str '0.5', not a number"]),
    ("huge", [], ["returned 1e+300, outside [-1e+06, 1e+06]"]),
    ("sleeps", ["env.step_timeout_s=1"], ["did not return within 1 s (env.step_timeout_s"]),
])
def test_a_faulty_reward_function_is_one_line_naming_it_its_file_and_the_task(
        fn, extra, needles, tmp_path):
    f = tmp_path / "shaping.py"
    f.write_text(REWARDS)
    t0 = time.time()
    res = runner.invoke(app, ["train", "--method", "grpo", *_sets("train.steps=1", *extra),
                              "--reward", f"{f}:{fn}", "--out", str(tmp_path / "r")])
    _error_line(res, f"reward '{fn}' ({f}:{fn}) on task search-train-", "shaping.py:", *needles)
    if fn == "sleeps":
        assert time.time() - t0 < 120


def test_a_reward_function_scores_a_copy_of_the_episode(tmp_path):
    ep = Episode(task_id="t0", group=0, token_ids=[1, 2], response_mask=[0, 1], logprobs=[0, 0],
                 turn_index=[-1, 0], segment_starts=[1], segment_index=[-1, 0], answer="a",
                 question="q", reward=1.0, finish="answer")
    cheat = RewardFn("cheat", "shaping.py:cheat", 1.0,
                     lambda episode: setattr(episode, "reward", 100.0) or 0.0, ("episode",))
    apply_rewards(ep, (cheat,), "add")
    assert ep.reward == 1.0 and ep.meta.reward_env == 1.0


def test_a_raising_trl_style_reward_is_named_by_its_own_file():
    """A function with TRL's signature runs inside an adapter; its error names the user's
    function's file and line, not the adapter's."""
    from agentrl_cli.envs.guard import UserCodeError
    from agentrl_cli.rollout.rewards import TRL_COLUMNS, score, trl_adapter

    def trl_reward(prompts, completions, **kwargs):
        raise ValueError("bad batch")

    fn = trl_adapter("mine.py:trl_reward", trl_reward)
    params = ("episode", "messages", *TRL_COLUMNS)
    r = RewardFn("trl_reward", "mine.py:trl_reward", 1.0, fn, params)
    ep = Episode(task_id="t0", group=0, token_ids=[1, 2], response_mask=[0, 1], logprobs=[0, 0],
                 turn_index=[-1, 0], segment_starts=[1], segment_index=[-1, 0], answer="a",
                 question="q", reward=1.0, finish="answer")
    with pytest.raises(UserCodeError) as e:
        score(r, {**{k: None for k in params}, "task_id": "t0", "episode": ep,
                  "messages": [{"role": "user", "content": "q"}]})
    assert f"test_user_code_guards.py:{trl_reward.__code__.co_firstlineno}" in str(e.value)
    assert "rewards.py" not in str(e.value) and "raised ValueError: bad batch" in str(e.value)


# ------------------------------------------------------------------ allocators
def test_an_exiting_allocator_is_one_line_naming_it(tmp_path):
    f = tmp_path / "alloc.py"
    f.write_text(ALLOCATOR)
    res = runner.invoke(app, ["train", "--method", "focus", "--out", str(tmp_path / "run"),
                              *_sets("train.steps=1", "rollout.group_size=4",
                                     f"algo.focus_allocator={f}:leave")])
    _error_line(res, f"focus allocator '{f}:leave' on tasks search-train-", "alloc.py:",
                "raised SystemExit: 0: user code must not end the process")


# ------------------------------------------------------------------ tool-call parsing
SEARCH = (function_tool("search", "Search.", query=("string", "the query")),)
HERMES = TOOL_FORMATS["hermes"]


@pytest.mark.parametrize("body, needle", [
    ("[" * 100_000, "nests JSON deeper than 32 levels"),
    ('{"name": "search", "arguments": {"query": ' + "9" * 5000 + "}}",
     "a number in the tool call has 5,000 characters"),
    ('{"name": "search", "arguments": {"query": 1e999}}', "is not finite"),
    ('{"name": "search", "arguments": {"query": NaN}}', "NaN is not JSON"),
])
def test_hostile_json_in_a_tool_call_is_an_error_observation(body, needle):
    with pytest.raises(ToolCallError, match=needle):
        read_call(f"<tool_call>{body}</tool_call>", HERMES, SEARCH)

    class Inner:
        system_prompt = "s"

        def step(self, action):
            return StepResult("error: malformed", 0.0, False, False, {"error": True})

    res = ToolCallEnv(Inner(), HERMES, SEARCH, None).step(f"<tool_call>{body}</tool_call>")
    assert needle in res.observation and res.info["error"]


def test_hermes_parsing_is_linear_in_unclosed_tags():
    t0 = time.perf_counter()
    for n in (16_384, 65_536):
        with pytest.raises(ToolCallError, match="not closed"):
            read_call("<tool_call>" * n, HERMES, SEARCH)
    assert time.perf_counter() - t0 < 0.5
    text = 'a <tool_call>{"name": "search", "arguments": {"query": "[[x"}}</tool_call> b'
    assert read_call(text, HERMES, SEARCH) == ("search", {"query": "[[x"})


# ------------------------------------------------------------------ a full disk in any save
def test_a_full_disk_in_any_save_is_one_line(tmp_path, monkeypatch, model_dir):
    from agentrl_cli.app import rollout as rollout_command

    def full(out, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(out))

    monkeypatch.setattr(rollout_command, "write_rollout", full)
    out = tmp_path / "eps.jsonl"
    res = runner.invoke(app, ["rollout", "--model", model_dir, "--n", "1", "--out", str(out),
                              *_sets()])
    _error_line(res, f"cannot write {out} (No space left on device): the disk is full")


# ------------------------------------------------------------------ snapshot and restore
class _Forking:
    """An env whose snapshot or restore fails: `fault` = (method, how)."""

    system_prompt = "s"

    def __init__(self, fault):
        self.fault = fault

    def _maybe_fail(self, method):
        if self.fault == (method, "exit"):
            sys.exit(5)
        if self.fault == (method, "raise"):
            raise KeyError("gone")

    def snapshot(self):
        self._maybe_fail("snapshot")
        return {"pos": 1}

    def restore(self, state):
        self._maybe_fail("restore")


@pytest.mark.parametrize("method, how, needle", [
    ("snapshot", "exit", "raised SystemExit: 5: an env must not end the process"),
    ("snapshot", "raise", "raised KeyError: 'gone'"),
    ("restore", "exit", "raised SystemExit: 5: an env must not end the process"),
    ("restore", "raise", "raised KeyError: 'gone'"),
])
def test_a_failing_snapshot_or_restore_is_one_line_naming_it(method, how, needle):
    from agentrl_cli.envs.guard import EnvContractError, GuardedEnv, Limits

    env = GuardedEnv(_Forking((method, how)), Limits("forking", (0.0, 1.0), 5.0, 1000))
    call = env.snapshot if method == "snapshot" else lambda: env.restore({"pos": 1})
    with pytest.raises(EnvContractError) as e:
        call()
    line = str(e.value)
    fn = getattr(_Forking, method)
    assert line.startswith("env 'forking'") and f"{method}() (" in line, line
    assert f"test_user_code_guards.py:{fn.__code__.co_firstlineno})" in line and needle in line
    assert "\n" not in line
    healthy = GuardedEnv(_Forking(None), Limits("forking", (0.0, 1.0), 5.0, 1000))
    assert healthy.snapshot() == {"pos": 1} and healthy.restore({"pos": 1}) is None

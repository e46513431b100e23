"""BFCL multi-turn adapter: ground-truth replay is solved, corrupted replays are not, and every
verdict agrees with BFCL's own `multi_turn_checker`; observations are the backends' outputs;
malformed calls are error observations; turns, snapshot/restore and the step cap.

The whole suite (800 tasks) is checked by benchmarks/check_bfcl.py; these tests use a sample
that covers all eight backend classes and all four categories. They need bfcl-eval installed
(`pip install --no-deps bfcl-eval==2026.3.23`, as .ci/run does)."""
from __future__ import annotations

import json
import pickle
import random

import pytest

from agentrl_cli.errors import ConfigError
from agentrl_cli.envs import ENVS, bfcl

NAMES = ["bfcl-multi-turn-base", "bfcl-multi-turn-miss-func", "bfcl-multi-turn-miss-param",
         "bfcl-multi-turn-long-context"]
# (env, task index): every backend class (base 0/2/14/15/50/100/150) and every category
SAMPLE = [(NAMES[0], i) for i in (0, 2, 14, 15, 50, 100, 150, 199)] + [
    (NAMES[1], 0), (NAMES[1], 120), (NAMES[2], 0), (NAMES[2], 170), (NAMES[3], 0), (NAMES[3], 101)]


def _spec(name):
    return ENVS.get(name)(seed=0)


def _expert_run(spec, task, seed=0):
    env = spec.make()
    env.reset(task)
    rng = random.Random(seed)
    for _ in range(500):
        res = env.step(spec.expert(env, rng))
        if res.terminated or res.truncated:
            return env, res
    raise AssertionError("expert did not finish")


def test_registered_categories_and_tasks():
    for name in NAMES:
        assert name in ENVS
    spec = _spec(NAMES[0])
    tasks = spec.tasks("eval")
    assert len(tasks) == 200 and len({t.task_id for t in tasks}) == 200
    entry = bfcl.load_entries("base")[0]
    assert tasks[0].task_id == entry["id"] == "multi_turn_base_0"
    assert tasks[0].prompt == entry["question"][0][0]["content"]
    assert json.loads(tasks[0].answer) == entry["ground_truth"]
    assert [t.task_id for t in spec.tasks("eval", 3)] == [t.task_id for t in tasks[:3]]
    with pytest.raises(ConfigError, match="only an eval split"):
        spec.tasks("train")


@pytest.mark.parametrize("name,index", SAMPLE)
def test_expert_solved_corruptions_not_and_bfcl_agrees(name, index):
    spec = _spec(name)
    task = spec.tasks("eval")[index]
    entry = spec._entries[task.task_id]
    env, res = _expert_run(spec, task)
    assert res.terminated and res.reward == 1.0 and res.info["success"]
    assert env.decoded and bfcl.reference_check(entry, env.decoded)["valid"]
    plan = bfcl.ground_truth_plan(entry)
    assert bfcl.run_plan(spec.make(), task, plan).reward == 1.0
    rng = random.Random(index)
    dropped = bfcl.corrupt_plan(plan, rng, "drop")
    assert sum(map(len, dropped)) == sum(map(len, plan)) - 1
    env = spec.make()
    res = bfcl.run_plan(env, task, dropped)
    assert res.reward == 0.0 and not res.info["success"] and env.failure is not None
    assert not bfcl.reference_check(entry, env.decoded)["valid"]
    changed = bfcl.corrupt_plan(plan, rng, "change")
    if changed is not None:  # a changed argument may leave BFCL's checks unchanged: agree with it
        env = spec.make()
        res = bfcl.run_plan(env, task, changed)
        assert bool(res.info["success"]) == bfcl.reference_check(entry, env.decoded)["valid"]


def test_changed_argument_fails_the_state_check():
    spec = _spec(NAMES[0])
    task = spec.tasks("eval")[0]
    plan = bfcl.ground_truth_plan(spec._entries[task.task_id])
    assert str(plan[0][1]) == "mkdir(dir_name='temp')"
    plan[0][1] = bfcl.Call("mkdir", (), {"dir_name": "tmp"})
    env = spec.make()
    res = bfcl.run_plan(env, task, plan)
    assert res.reward == 0.0 and env.failure["error_type"] == "multi_turn:instance_state_mismatch"


def test_observations_are_the_backends_outputs():
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.gorilla_file_system import (
        GorillaFileSystem)

    spec = _spec(NAMES[0])
    task = spec.tasks("eval")[0]
    entry = spec._entries[task.task_id]
    env = spec.make()
    assert env.reset(task) == task.prompt
    assert "cd" in env.system_prompt and "[func_name1(params_name1=params_value1" in env.system_prompt
    fs = GorillaFileSystem()
    fs._load_scenario(json.loads(json.dumps(entry["initial_config"]["GorillaFileSystem"])))
    res = env.step("[cd(folder='document')]")
    assert res.observation == json.dumps(fs.cd(folder="document"))
    res = env.step("mkdir(dir_name='temp')")
    fs.mkdir(dir_name="temp")
    res = env.step("[ls(), pwd()]")
    assert res.observation == (f"ls() -> {json.dumps(fs.ls())}\n"
                               f"pwd() -> {json.dumps(fs.pwd())}")
    assert "temp" in res.observation and not res.terminated and not res.truncated
    res = env.step("cd(folder='nowhere')")   # a backend error is the backend's own message
    assert res.observation == json.dumps(fs.cd(folder="nowhere"))
    assert env.step("fly_to_mars(speed=3)").observation == \
        "Error during execution: name 'fly_to_mars' is not defined"


@pytest.mark.parametrize("bad", ["[cd(folder='document'", "cd('document')",
                                 "[cd(folder=os.getcwd())]", "cd(folder='a') cd(folder='b')",
                                 "[1, 2]", "mkdir(**{'dir_name': 'x'})"])
def test_malformed_calls_are_error_observations(bad):
    spec = _spec(NAMES[0])
    env = spec.make()
    env.reset(spec.tasks("eval")[0])
    before = pickle.dumps(env.snapshot()["state"]["backends"])
    res = env.step(bad)
    assert res.observation.startswith("error:") and res.info["error"]
    assert not res.terminated and not res.truncated and env.turn == 0
    assert pickle.dumps(env.snapshot()["state"]["backends"]) == before
    assert env.decoded == [[]]


def test_text_ends_the_turn_and_delivers_the_next_user_message():
    spec = _spec(NAMES[1])   # miss_func: turn 3 reveals a held-out function
    task = spec.tasks("eval")[0]
    entry = spec._entries[task.task_id]
    assert "sort" not in {d["name"] for d in entry["functions"]}
    env = spec.make()
    env.reset(task)
    obs = [env.step("Moving on.").observation for _ in range(3)]
    assert obs[0] == "User: " + entry["question"][1][0]["content"]
    assert obs[1] == "User: " + entry["question"][2][0]["content"]
    assert "'name': 'sort'" in obs[2] and "I have updated some more functions" in obs[2]
    assert env.turn == 3 and env.failure["error_type"] == "multi_turn:empty_turn_model_response"
    assert env.step("[]").observation.startswith("User: ")   # an empty call list ends a turn too
    res = env.step("Done.")
    assert res.terminated and res.reward == 0.0 and res.observation == ""
    assert env.step("ls()").info["error"]                      # the episode is over


def test_snapshot_restore_deep_copies_backends():
    spec = _spec(NAMES[0])
    task = spec.tasks("eval")[0]
    env = spec.make()
    env.reset(task)
    env.step("cd(folder='document')")
    snap = env.snapshot()
    pickle.loads(pickle.dumps(snap))                # picklable
    env.step("mkdir(dir_name='scratch')")
    assert "scratch" in env.step("ls()").observation
    env.restore(snap)
    assert "scratch" not in env.step("ls()").observation
    env.restore(snap)                               # the snapshot itself was not mutated
    rng = random.Random(0)
    first = []
    while True:
        res = env.step(spec.expert(env, rng))
        first.append(res.observation)
        if res.terminated:
            break
    assert res.reward == 1.0 and "scratch" not in " ".join(first)
    env.restore(snap)
    again = []
    while True:
        res = env.step(spec.expert(env, rng))
        again.append(res.observation)
        if res.terminated:
            break
    assert again == first and res.reward == 1.0


def test_too_many_call_messages_in_a_turn_fail_the_task():
    spec = ENVS.get(NAMES[0])(seed=0, max_turns=2)
    env = spec.make()
    env.reset(spec.tasks("eval")[0])
    assert not env.step("pwd()").truncated and not env.step("ls()").truncated
    res = env.step("pwd()")
    assert res.truncated and not res.info["success"]
    assert env.failure["error_type"] == "multi_turn:force_terminated"
    # with the same cap the expert packs a long turn into fewer messages and still solves it
    task = next(t for t in spec.tasks("eval")
                if max(len(c) for c in spec._entries[t.task_id]["ground_truth"]) > 4)
    assert _expert_run(spec, task)[1].reward == 1.0


def test_imperfect_expert_fails_some_tasks():
    spec = _spec(NAMES[0])
    res = [_expert_run(spec, t)[1].reward for t in spec.tasks("eval", 20)]
    noisy = []
    for t in spec.tasks("eval", 20):
        env = spec.make()
        env.reset(t)
        rng = random.Random(1)
        while True:
            r = env.step(spec.expert(env, rng, error_rate=0.5))
            if r.terminated or r.truncated:
                break
        noisy.append(r.reward)
    assert sum(res) == 20 and sum(noisy) < 20


def test_parse_calls():
    assert bfcl.parse_calls("All done, the file is sorted.") is None
    assert bfcl.parse_calls("```python\n[ls(a=True)]\n```")[0].kwargs == {"a": True}
    calls = bfcl.parse_calls("[cd(folder='a'), mv(source='x', destination='y')]")
    assert [str(c) for c in calls] == ["cd(folder='a')", "mv(source='x', destination='y')"]
    assert str(bfcl.parse_calls("sort('f.txt')", positional=True)[0]) == "sort('f.txt')"
    assert str(bfcl.parse_calls("[cd(folder='a')")[0]) == "cd(folder='a')"   # BFCL adds the "]"
    with pytest.raises(ValueError, match="keyword"):
        bfcl.parse_calls("sort('f.txt')")

"""The env boundary as a careless or hostile env author meets it: every rollout checks each
reset and step (types, finite reward in the declared range, not both ended flags, timeout,
observation size) and stops in one line naming the env, task and step; env exceptions are
counted and the first one logged; `agentrl check-env` names each check as it starts, respects
the timeout, reports a file that exits at import, and checks snapshot/restore at the states the
scripted expert and random play reach; `agentrl train` refuses a non-deterministic user env
before any model work."""
from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from agentrl_cli import config
from agentrl_cli.cli.main import app
from agentrl_cli.envs.base import ENVS, make_env_spec
from agentrl_cli.envs.checker import check_env, difference, require_determinism
from agentrl_cli.envs.guard import EnvContractError, call_with_timeout, StepTimeout
from agentrl_cli.errors import ConfigError
from conftest import MICRO

runner = CliRunner()

# an env whose misbehaviour is an option: env.mode, env.reward, env.declared
PROBE = '''
import random
import time

from agentrl_cli.envs import StepResult, Task


class Probe:
    system_prompt = "Reply with anything; the second message ends the episode."

    def __init__(self, mode, reward):
        self.mode, self.reward, self.n = mode, reward, 0

    def reset(self, task):
        self.n = 0
        return 42 if self.mode == "int_reset" else task.prompt

    def step(self, action):
        self.n += 1
        if self.mode == "sleep":
            time.sleep(20)
        if self.mode == "raise":
            raise ValueError("boom in step")
        if self.mode == "huge":
            return StepResult("x" * 2_000_000, 0.0, False, False, {})
        if self.mode == "random":
            return StepResult(str(random.random()), 0.0, False, False, {})
        done = self.n >= 2
        return StepResult("" if done else "ok", float(self.reward) if done else 0.0, done,
                          done and self.mode == "both", {})

    def snapshot(self):
        return self.n

    def restore(self, state):
        self.n = state


class Spec:
    name = "probe"

    def __init__(self, mode, reward, declared):
        self.mode, self.reward = mode, reward
        if declared:
            self.reward_range = (0.0, 1.0)
        self._tasks = [Task(f"t{i}", f"Say {i}.", str(i)) for i in range(8)]

    def make(self):
        return Probe(self.mode, self.reward)

    def tasks(self, split, n=None):
        out = self._tasks[:4] if split == "train" else self._tasks[4:]
        return list(out if n is None else out[:n])


def make(seed=0, mode="ok", reward=1.0, declared=False, max_turns=3):
    return Spec(mode, reward, declared)
'''

# a grid walk with a scripted expert; `forget` breaks forking as a careless author would:
# "restore" (restore() drops the position) or "snapshot" (snapshot() omits it)
WALK = '''
import re

from agentrl_cli.envs import StepResult, Task

MOVES = {"north": (0, 1), "south": (0, -1), "east": (1, 0), "west": (-1, 0)}


class Walk:
    system_prompt = "Reach the goal cell: move(DIR), DIR a compass direction; then answer(done)."

    def __init__(self, forget):
        self.forget, self.task, self.pos, self.n, self.done = forget, None, (0, 0), 0, False

    def reset(self, task):
        self.task, self.pos, self.n, self.done = task, (0, 0), 0, False
        return task.prompt

    def step(self, action):
        if self.done:
            return StepResult("error: the episode is over", 0.0, False, False, {})
        self.n += 1
        m = re.fullmatch(r"move\\((\\w+)\\)", action.strip())
        if action.strip() == "answer(done)":
            self.done = True
            ok = self.pos == tuple(self.task.meta["goal"])
            return StepResult("", float(ok), True, False, {"success": ok})
        if m and m.group(1) in MOVES:
            dx, dy = MOVES[m.group(1)]
            self.pos = (self.pos[0] + dx, self.pos[1] + dy)
            obs = f"at {self.pos[0]} {self.pos[1]}"
        else:
            obs = "error: move(DIR) or answer(done)"
        if self.n >= 8:
            self.done = True
            return StepResult("", 0.0, False, True, {})
        return StepResult(obs, 0.0, False, False, {})

    def snapshot(self):
        state = {"task": self.task, "pos": self.pos, "n": self.n, "done": self.done}
        if self.forget == "snapshot":
            del state["pos"]
        return state

    def restore(self, state):
        self.task, self.n, self.done = state["task"], state["n"], state["done"]
        if self.forget not in ("restore", "snapshot"):
            self.pos = state["pos"]


class Spec:
    name = "walk"

    def __init__(self, forget):
        self.forget = forget
        self._tasks = [Task(f"walk-{i}", f"Walk to cell {i % 3 + 1} {i % 2 + 1}.", "done",
                            {"goal": (i % 3 + 1, i % 2 + 1)}) for i in range(8)]

    def make(self):
        return Walk(self.forget)

    def tasks(self, split, n=None):
        out = self._tasks[:4] if split == "train" else self._tasks[4:]
        return list(out if n is None else out[:n])

    def expert(self, env, rng, error_rate=0.0):
        if rng.random() < error_rate:
            return "move(up)"
        (x, y), (gx, gy) = env.pos, env.task.meta["goal"]
        if (x, y) == (gx, gy):
            return "answer(done)"
        return "move(east)" if x < gx else "move(west)" if x > gx else \\
            "move(north)" if y < gy else "move(south)"


def make(seed=0, forget="nothing", max_turns=8):
    return Spec(forget)
'''


@pytest.fixture
def probe(tmp_path):
    f = tmp_path / "probe_env.py"
    f.write_text(PROBE)
    return f"{f}:make"


@pytest.fixture
def walk(tmp_path):
    f = tmp_path / "walk_env.py"
    f.write_text(WALK)
    return f"{f}:make"


def _sets(*extra):
    return [a for s in [*MICRO, *extra] for a in ("--set", s)]


def _error_line(res, *needles):
    """Exit 2, no traceback, and a last line `error: ...` holding every needle; the one error
    line."""
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and errors[0] == lines[-1], res.output
    for needle in needles:
        assert needle in errors[0], res.output
    return errors[0]


# ------------------------------------------------------------------ 1-2: every rollout step
@pytest.mark.parametrize("method, reward, needle", [
    ("grpo", "nan", "reward nan is not a finite number"),
    ("ppo", "nan", "reward nan is not a finite number"),
    ("grpo", "1e30", "reward 1e+30 is outside the env's reward_range [-1e+06, 1e+06]"),
])
def test_a_garbage_reward_stops_training_in_one_line(method, reward, needle, probe, model_dir,
                                                     tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--method", method, "--env", probe, "--model", model_dir,
                              "--out", str(out), *_sets(f"env.reward={reward}", "train.steps=2")])
    line = _error_line(res, f"env '{probe}', task ", ", step 2: ", needle)
    assert "Traceback" not in res.output, line
    assert not (out / "metrics.jsonl").exists() or not any(
        json.loads(r)["step"] > 0 for r in (out / "metrics.jsonl").read_text().splitlines())


@pytest.mark.parametrize("options, needles", [
    (["env.reward=-5", "env.declared=true"],
     [", step 2: ", "reward -5 is outside the env's reward_range [0, 1]"]),
    (["env.reward=inf"], [", step 2: ", "reward inf is not a finite number"]),
    (["env.mode=int_reset"], [", step reset: ", "reset returned int, not str"]),
    (["env.mode=both"], [", step 2: ", "terminated and truncated both True"]),
    (["env.mode=huge"], [", step 1: ", "an observation of 2,000,000 characters, above "
                                       "env.max_observation_chars=1,000,000"]),
    (["env.mode=sleep", "env.step_timeout_s=1"],
     [", step 1: ", "step() did not return within 1 s (env.step_timeout_s"]),
])
def test_a_rollout_stops_at_a_protocol_violation_in_one_line(options, needles, probe, model_dir,
                                                             tmp_path):
    t0 = time.time()
    res = runner.invoke(app, ["rollout", "--env", probe, "--model", model_dir, "--n", "2",
                              "--out", str(tmp_path / "eps.jsonl"), *_sets(*options)])
    _error_line(res, f"env '{probe}', task t", *needles)
    assert time.time() - t0 < 15              # a hung step does not hang the command
    assert not (tmp_path / "eps.jsonl").exists()


def test_env_exceptions_are_counted_and_the_first_is_logged_once(probe, model_dir, tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--method", "grpo", "--env", probe, "--model", model_dir,
                              "--out", str(out), *_sets("env.mode=raise", "train.steps=2",
                                                        "env.max_error_rate=1")])
    assert res.exit_code == 0, res.output
    assert res.output.count("raised in step()") == 1, res.output
    assert "task t" in res.output and "step 1: ValueError: boom in step" in res.output
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert [r["env/exceptions"] for r in steps] == [4, 4]     # 2 tasks x 2 episodes per step
    assert "ValueError: boom in step" in steps[0]["env/first_exception"]
    assert "env/first_exception" not in steps[1]


def test_the_step_timeout_and_the_declared_range_at_the_library_level():
    assert call_with_timeout(lambda x: x + 1, 1, 5.0) == 2
    with pytest.raises(KeyError):             # an exception inside passes through unchanged
        call_with_timeout(lambda x: {}[x], "k", 5.0)
    t0 = time.time()
    with pytest.raises(StepTimeout):
        call_with_timeout(time.sleep, 5, 0.2)
    assert time.time() - t0 < 2
    from agentrl_cli.envs.guard import reward_range

    class Declared:
        reward_range = (1, 0)
    with pytest.raises(ConfigError, match=r"reward_range \(1, 0\) is not"):
        reward_range(Declared())


# ------------------------------------------------------------------ 3: check-env's progress
def test_check_env_names_each_check_and_respects_the_timeout(probe):
    t0 = time.time()
    res = runner.invoke(app, ["check-env", probe, "--set", "env.mode=sleep",
                              "--set", "env.step_timeout_s=1"])
    _error_line(res, f"env '{probe}', task t4, step 1: ", "did not return within 1 s",
                "during the fork check")
    assert time.time() - t0 < 15
    assert "  fork: snapshot/restore at every state" in res.stderr
    res = runner.invoke(app, ["check-env", probe, "--set", "env.mode=huge"])
    assert res.exit_code == 2
    assert "an observation of 2,000,000 characters, above env.max_observation_chars" in res.stdout


LOOPING_FACTORY = "import time\n\ndef make(**options):\n    while True:\n        time.sleep(0.01)\n"


def test_a_factory_that_never_returns_ends_in_one_line(tmp_path):
    """The factory runs under env.step_timeout_s: a loop in it is one line and exit 2."""
    f = tmp_path / "loops_env.py"
    f.write_text(LOOPING_FACTORY)
    t0 = time.time()
    res = runner.invoke(app, ["check-env", f"{f}:make", "--set", "env.step_timeout_s=3"])
    _error_line(res, f"env '{f}:make': its factory did not return within 3 s")
    assert time.time() - t0 < 30
    # past a second in the factory, the lines say where it is (a quick failure is one line)
    assert "  factory: loading the env and calling its factory" in res.stderr


def test_a_task_list_that_never_returns_ends_in_one_line(tmp_path):
    """A spec whose `tasks()` hangs stops check-env with one line naming the tasks check."""
    f = tmp_path / "slow_tasks_env.py"
    f.write_text(PROBE + "\nSpec.tasks = lambda self, split, n=None: time.sleep(60)\n")
    res = runner.invoke(app, ["check-env", f"{f}:make", "--set", "env.step_timeout_s=1"])
    _error_line(res, "tasks('train') did not return within 1 s", "during the tasks check")


def test_check_env_lines_show_while_it_works(tmp_path):
    """Each line reaches the terminal as its check starts (flushed, not at exit): with a
    factory that sleeps and no timeout, the first lines are there while the process runs."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    f = tmp_path / "sleepy_env.py"
    f.write_text("import time\n\ndef make(**options):\n    time.sleep(600)\n")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    p = subprocess.Popen([sys.executable, "-m", "agentrl_cli.cli.main", "check-env", f"{f}:make",
                          "--set", "env.step_timeout_s=0"], stderr=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, text=True, env=env, cwd=tmp_path)
    import threading

    stop = threading.Timer(120, p.kill)       # buffered lines would come only at its end
    stop.start()
    try:
        first = p.stderr.readline()
        second = p.stderr.readline()
        assert p.poll() is None               # still in the factory: the lines came unbuffered
    finally:
        stop.cancel()
        p.kill()
        p.wait()
    assert first.startswith(f"checking env '{f}:make'")
    assert second.startswith("  factory: loading the env and calling its factory")


@pytest.mark.parametrize("body, needle", [
    ("raise SystemExit(3)\n", "SystemExit: the file exits at import (exit code 3)"),
    ("import sys\nsys.exit()\n", "SystemExit: the file exits at import"),
    ("raise RuntimeError('no GPU here')\n", "RuntimeError: no GPU here"),
])
def test_a_file_that_exits_or_raises_at_import_is_one_line(body, needle, tmp_path):
    f = tmp_path / "exits_env.py"
    f.write_text(body)
    res = runner.invoke(app, ["check-env", f"{f}:make"])
    _error_line(res, f"env '{f}:make'", "does not import", needle)


# ------------------------------------------------------------------ 4: forks at real states
@pytest.mark.parametrize("forget, needle", [
    ("restore", "the expert's state at depth 1: its snapshot()['pos'] is (0, 0), the original's (1, 0)"),
    ("snapshot", "the expert's state at depth 1: after 'move(east)' it gave ('at 1 0', "),
])
def test_a_restore_that_forgets_the_position_fails_check_env(forget, needle, walk):
    res = runner.invoke(app, ["check-env", walk, "--set", f"env.forget={forget}"])
    assert res.exit_code == 2, res.output
    assert res.stdout.startswith("fork: a fresh env restored from snapshot() diverged from the "
                                 "original at task walk-4, "), res.stdout
    assert needle in res.stdout, res.stdout


def test_a_walk_that_forks_exactly_passes(walk):
    res = runner.invoke(app, ["check-env", walk])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith(f"ok: env '{walk}'") and "scripted expert: yes" in res.stdout


@pytest.mark.parametrize("name", ["search", "locate", "rules", "math"])
def test_built_in_envs_fork_exactly_at_expert_and_random_states(name):
    section = config.load(**{"env.name": name}).env
    report = check_env(lambda s: make_env_spec(section, s), seed=0, max_turns=section.max_turns,
                       timeout_s=60)
    assert report.problems == []
    assert report.fork_states >= 30           # expert (gold and erring) and random, deep


def test_difference_names_where_two_snapshots_differ():
    class Agent:
        def __init__(self, pos):
            self.pos, self.log = pos, ["a"]
    assert difference({"a": [1, Agent((0, 0))]}, {"a": [1, Agent((0, 0))]}) is None
    assert difference({"a": [1, Agent((0, 0))]}, {"a": [1, Agent((2, 1))]}) == \
        "its snapshot()['a'][1].pos is (0, 0), the original's (2, 1)"
    assert "['b'] is missing" in difference({"a": 1}, {"a": 1, "b": 2})
    assert difference(float("nan"), float("nan")) is None


# ------------------------------------------------------------------ 5: determinism in train
def test_train_refuses_a_non_deterministic_env_before_any_model_work(probe, model_dir, tmp_path):
    out = tmp_path / "run"
    t0 = time.time()
    res = runner.invoke(app, ["train", "--method", "grpo", "--env", probe, "--model", model_dir,
                              "--out", str(out), *_sets("env.mode=random")])
    _error_line(res, f"env '{probe}' is not deterministic per seed: determinism: two specs from "
                     "seed 0: the same actions (a random) on task t4 gave different results",
                "env.deterministic=false")
    assert time.time() - t0 < 10 and not out.exists()
    # the opt-out: a warning, and training goes on
    section = config.load(sets=["env.mode=random", "env.deterministic=false"],
                          **{"env.name": probe}).env
    said = []
    t0 = time.time()
    require_determinism(section, said.append)
    assert time.time() - t0 < 3
    assert len(said) == 1 and said[0].startswith(f"warning: env '{probe}' is not deterministic")
    require_determinism(config.load(**{"env.name": probe}).env, said.append)   # deterministic
    assert len(said) == 1
    assert ENVS.is_user(probe)


def test_the_violation_error_is_located():
    e = EnvContractError("calc.py:make", "reward nan is not a finite number")
    assert str(e) == "env 'calc.py:make': reward nan is not a finite number"
    assert str(e.at("t3", 2)) == "env 'calc.py:make', task t3, step 2: reward nan is not a finite number"
    import pickle

    again = pickle.loads(pickle.dumps(e.at("t3", 2)))        # as a Ray worker's error travels
    assert isinstance(again, ConfigError) and str(again) == str(e.at("t3", 2))


def test_the_guard_never_shadows_the_envs_own_attributes():
    """An env's own `steps` and `task_id` are read through the guard as they are: after a
    restore the guarded env reports the restored env's step count, not the guard's tally."""
    from agentrl_cli import config
    from agentrl_cli.context import make_spec

    spec = make_spec(config.load(sets=["env.name=search"]))
    env = spec.make()
    env.reset(spec.tasks("eval")[0])
    env.step("search(x)")
    snap = env.snapshot()
    env.step("search(y)")
    assert env.steps == env.inner.steps == 2
    env.restore(snap)
    assert env.steps == env.inner.steps == 1

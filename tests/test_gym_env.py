"""Gymnasium both ways: a `gymnasium.Env` with text spaces trains as an agentrl env (`--env
gym:ID`, a `FILE.py:make` returning one), forks by deep copy or is refused by FOCUS/VinePPO in
one line; every agentrl env is `gymnasium.make("agentrl/NAME-v0")` and passes Gymnasium's own
env checker."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from typer.testing import CliRunner

from agentrl_cli import config
from agentrl_cli.cli.main import app
from agentrl_cli.envs import ENVS
from agentrl_cli.envs.as_gymnasium import gym_id
from agentrl_cli.envs.base import make_env_spec
from agentrl_cli.envs.gym_env import SPLIT_SEEDS
from conftest import MICRO
from test_user_env import _one_line_error

ROOT = Path(__file__).resolve().parents[1]
GUESS = ROOT / "examples" / "guess_number_gym.py"
CALC = ROOT / "examples" / "calculator_env.py"
runner = CliRunner()

# gym envs for the mapping and the refusals: intermediate rewards, a lock (no deep copy), a
# Box observation space
ODD = '''
import string, threading
import gymnasium as gym
from gymnasium import spaces


class Steps(gym.Env):
    """Each step pays 0.25; the third ends the episode."""
    metadata = {"render_modes": []}

    def __init__(self):
        self.observation_space = spaces.Text(100, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(100, min_length=0, charset=string.printable)
        self.n = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = 0
        return f"start {int(self.np_random.integers(100))}", {"answer": "x"}

    def step(self, action):
        self.n += 1
        return f"step {self.n}", 0.25, self.n >= 3, False, {}


class Locked(Steps):
    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()


class Boxed(Steps):
    def __init__(self):
        super().__init__()
        self.observation_space = spaces.Box(0, 1, (2,))


def steps():
    return Steps()


def locked():
    return Locked()


def boxed():
    return Boxed()
'''


def _sets(extra=()):
    return sum((["--set", s] for s in [*MICRO, *extra]), [])


@pytest.fixture
def odd(tmp_path):
    f = tmp_path / "odd_gym.py"
    f.write_text(ODD)
    return f


# ---------------------------------------------------------------- agentrl envs as gymnasium.Env


def test_every_agentrl_env_is_registered_with_gymnasium():
    assert ENVS.names()
    for name in ENVS.names():
        assert gym_id(name) in gymnasium.registry, name
    assert "agentrl/env-v0" in gymnasium.registry


@pytest.mark.parametrize("env", ["search", "locate", "rules", "math", "allocation"])
def test_builtin_envs_pass_gymnasiums_env_checker(env):
    made = gymnasium.make(f"agentrl/{env}-v0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # a Gymnasium checker warning fails the test
        gym_check_env(made.unwrapped)
    obs, info = made.reset(seed=3)
    assert isinstance(obs, str) and obs and info["system_prompt"] == made.unwrapped.system_prompt
    assert obs in made.observation_space


def test_a_user_env_through_agentrl_env_v0_passes_the_checker_and_plays():
    made = gymnasium.make("agentrl/env-v0", env=f"{CALC}:make", n_ops=1, max_turns=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gym_check_env(made.unwrapped)
    obs, info = made.reset(seed=0)
    assert obs.startswith("Compute ")
    obs, reward, terminated, truncated, _ = made.step(f"answer({info['answer']})")
    assert (reward, terminated, truncated) == (1.0, True, False)


def test_reset_seed_draws_a_task_and_options_pick_one():
    made = gymnasium.make("agentrl/math-v0").unwrapped
    a = made.reset(seed=5)[1]["task_id"]
    assert made.reset(seed=5)[1]["task_id"] == a
    assert len({made.reset(seed=s)[1]["task_id"] for s in range(20)}) > 5
    spec = make_env_spec(config.load(**{"env.name": "math"}).env)
    tasks = spec.tasks("train")
    assert made.reset(options={"index": 2})[0] == tasks[2].prompt
    assert made.reset(options={"task_id": tasks[4].task_id})[1]["answer"] == tasks[4].answer
    held_out = gymnasium.make("agentrl/math-v0", split="eval").unwrapped
    assert held_out.reset(options={"index": 0})[0] == spec.tasks("eval")[0].prompt


# ---------------------------------------------------------------- gymnasium.Env as agentrl envs


def test_tasks_are_reset_seeds_and_the_reward_is_the_sum_on_the_final_step(odd):
    spec = make_env_spec(config.load(**{"env.name": f"{odd}:steps"}).env)
    train, held = spec.tasks("train"), spec.tasks("eval")
    assert len(train) == 200 and len(held) == 50 and spec.tasks("train", 3) == train[:3]
    assert [t.meta["seed"] for t in train[:2]] == [0, 1]
    assert held[0].meta["seed"] == SPLIT_SEEDS
    env = spec.make()
    assert env.reset(train[7]) == train[7].prompt
    rewards = [env.step("go") for _ in range(3)]
    assert [r.reward for r in rewards] == [0.0, 0.0, 0.75]
    assert [r.info["gym_reward"] for r in rewards] == [0.25] * 3
    assert rewards[-1].terminated and rewards[-1].observation == ""
    assert rewards[-1].info["final_observation"] == "step 3"
    other = make_env_spec(config.load(**{"env.name": f"{odd}:steps", "env.seed": 1}).env)
    assert other.tasks("train", 1)[0].meta["seed"] == 2 * SPLIT_SEEDS


def test_an_action_outside_the_space_is_an_error_observation():
    spec = make_env_spec(config.load(**{"env.name": f"{GUESS}:make", "env.max_turns": 3}).env)
    env = spec.make()
    env.reset(spec.tasks("train")[0])
    r = env.step("x" * 65)
    assert r.info["error"] and "65 characters" in r.observation and not r.terminated
    r = env.step("\u00e9")
    assert r.info["error"] and "characters the env does not take" in r.observation
    r = env.step("1")
    assert r.truncated or r.terminated            # max_turns=3: the third message ends it


def test_the_example_passes_check_env_and_trains_from_the_api(model_dir, tmp_path):
    res = runner.invoke(app, ["check-env", f"{GUESS}:make", "--set", "env.n_train=20"])
    assert res.exit_code == 0, res.output
    assert "20 train / 50 eval tasks with gold answers" in res.output
    from agentrl_cli import api

    cfg = api.load_config(sets=[*MICRO, "train.steps=2", "env.high=4"], method="grpo",
                          env=f"{GUESS}:make", model=str(model_dir))
    seen = []
    summary = api.train(cfg, tmp_path / "run", log=lambda s: None,
                        on_step=lambda step, row: seen.append(row["rollout/tokens"]))
    assert len(seen) == 2 and all(t > 0 for t in seen) and "final_success" in summary


def test_the_round_trip_gym_id_of_an_agentrl_env_trains_from_the_cli(model_dir, tmp_path):
    """`gym:agentrl/search-v0`: search as a gymnasium.Env, back as an agentrl env; FOCUS forks
    it by deep copy."""
    for method in ("grpo", "focus"):
        out = tmp_path / method
        res = runner.invoke(app, ["train", "--method", method, "--env", "gym:agentrl/search-v0",
                                  "--model", str(model_dir), "--steps", "2", "--out", str(out),
                                  *_sets(["train.trace_every=1"])])
        assert res.exit_code == 0, res.output
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if r["step"] > 0] == [1, 2]
    assert json.loads((out / "config.json").read_text())["env"]["name"] == "gym:agentrl/search-v0"


def test_the_round_trip_draws_its_tasks_from_the_split_it_is_given():
    native = make_env_spec(config.load(**{"env.name": "math"}).env)
    held_out = {t.prompt for t in native.tasks("eval")}
    for split, inside in (("train", False), ("eval", True)):
        spec = make_env_spec(config.load(sets=[f"env.split={split}"],
                                         **{"env.name": "gym:agentrl/math-v0"}).env)
        prompts = [t.prompt for t in spec.tasks("train", 10)]
        assert all((p in held_out) == inside for p in prompts), split


def test_a_gym_id_with_a_module_and_its_options(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    cfg = config.load(sets=["env.high=3", "env.n_train=5"],
                      **{"env.name": "gym:guess_number_gym:GuessNumber-v0"})
    spec = make_env_spec(cfg.env)
    assert len(spec.tasks("train")) == 5
    assert {t.answer for t in spec.tasks("eval")} <= {"1", "2", "3"}


def test_bad_gym_envs_are_one_line(odd, tmp_path):
    _one_line_error(runner.invoke(app, ["check-env", "gym:agentrl/nope-v0"]),
                    "env 'gym:agentrl/nope-v0': Environment `nope` doesn't exist")
    _one_line_error(runner.invoke(app, ["check-env", f"{odd}:boxed"]),
                    "its gymnasium observation space is Box, not Text")


@pytest.mark.parametrize("method", ["focus", "vineppo"])
def test_an_env_that_cannot_be_deep_copied_is_refused_by_forking_methods(method, odd, model_dir,
                                                                         tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--method", method, "--env", f"{odd}:locked",
                              "--model", str(model_dir), "--steps", "1", "--out", str(out), *_sets()])
    _one_line_error(res, f"method {method} forks episodes (snapshot/restore)")
    assert "snapshot() at" in res.output and "lock" in res.output
    assert not out.exists()


def test_grpo_trains_an_env_that_cannot_be_deep_copied(odd, model_dir, tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--method", "grpo", "--env", f"{odd}:locked",
                              "--model", str(model_dir), "--steps", "1", "--out", str(out), *_sets()])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["step"] > 0] == [1]

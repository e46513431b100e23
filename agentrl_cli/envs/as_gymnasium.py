"""Every agentrl env as a `gymnasium.Env`: `gymnasium.make("agentrl/search-v0")` (any registered
env NAME as `agentrl/NAME-v0`), or `gymnasium.make("agentrl/env-v0", env="my_env.py:make")` for
a user env. Importing `agentrl_cli.envs` registers the ids when gymnasium is installed.

How the two protocols map (docs/envs.md, "Gymnasium"):

  spaces        observation and action are text (`AnyText`): any characters, the observation
                up to `env.max_observation_chars`, the action (the agent's whole message) up to
                `MAX_ACTION_CHARS`; `sample()` draws printable ASCII.
  reset         `reset(seed=s)` seeds the env's generator and draws a task of `split` with it
                (so the same seed gives the same task); `options={"task_id": ID}` or
                `{"index": K}` picks one. The observation is the first user message; the info
                holds "task_id", "answer" (the gold answer, for the caller's checks: not
                for the agent) and "system_prompt" (the tools and their syntax).
  step          the action goes to the agentrl env's `step`; the StepResult is returned as
                (observation, reward, terminated, truncated, info), unchanged: the reward is
                the outcome on the final step and 0 before.
"""
from __future__ import annotations

import string
from dataclasses import fields
from typing import Any

import gymnasium as gym
from gymnasium import spaces

from ..config import EnvConfig
from ..errors import ConfigError
from .base import ENVS, make_env_spec

__all__ = ["AgentrlEnv", "AnyText", "MAX_ACTION_CHARS", "gym_id", "register_envs"]

MAX_ACTION_CHARS = 10_000
_FIELDS = {f.name for f in fields(EnvConfig)} - {"name", "seed", "options"}


class AnyText(spaces.Text):
    """Text of any characters, `min_length` to `max_length` long (Gymnasium's `Text` admits only
    its charset's); `sample()` draws from printable ASCII."""

    def __init__(self, max_length: int, min_length: int = 0, seed: int | None = None):
        super().__init__(max_length, min_length=min_length, charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"AnyText({self.min_length}, {self.max_length})"


def _section(env: str, seed: int, options: dict) -> EnvConfig:
    """The env section of `env` with `options`: a built-in's own keys as fields, a user env's
    in `options` (as `--set env.KEY=VALUE` would put them)."""
    if ENVS.is_user(env):
        return EnvConfig(name=env, seed=seed, options=dict(options))
    known = {k: v for k, v in options.items() if k in _FIELDS}
    return EnvConfig(name=env, seed=seed, **known,
                     options={k: v for k, v in options.items() if k not in _FIELDS})


class AgentrlEnv(gym.Env):
    """An agentrl env (`env`: a registered name or a user env) as a `gymnasium.Env` over the
    tasks of `split` ("train" | "eval"); `options` are the env's options."""

    metadata = {"render_modes": []}

    def __init__(self, env: str = "search", split: str = "train", seed: int = 0,
                 render_mode: str | None = None, **options: Any):
        section = _section(env, seed, options)
        self._spec = make_env_spec(section)
        self._tasks = self._spec.tasks(split)
        if not self._tasks:
            raise ConfigError(f"env '{env}' has no {split} tasks")
        self._by_id = {t.task_id: t for t in self._tasks}
        self._env = None
        self.render_mode = render_mode
        self.observation_space = AnyText(section.max_observation_chars)
        self.action_space = AnyText(MAX_ACTION_CHARS)
        self.system_prompt = self._spec.make().system_prompt

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        if "task_id" in options:
            if options["task_id"] not in self._by_id:
                raise ValueError(f"no task '{options['task_id']}' in this split")
            task = self._by_id[options["task_id"]]
        elif "index" in options:
            task = self._tasks[int(options["index"]) % len(self._tasks)]
        else:
            task = self._tasks[int(self.np_random.integers(len(self._tasks)))]
        self._env = self._spec.make()
        obs = self._env.reset(task)
        return obs, {"task_id": task.task_id, "answer": task.answer,
                     "system_prompt": self._env.system_prompt}

    def step(self, action: str):
        if self._env is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        r = self._env.step(action)
        return r.observation, float(r.reward), bool(r.terminated), bool(r.truncated), dict(r.info)


def gym_id(name: str) -> str:
    """The Gymnasium id of agentrl env `name`."""
    return f"agentrl/{name}-v0"


def register_envs(names: list[str]) -> None:
    """Register `agentrl/NAME-v0` for each of `names`, and `agentrl/env-v0` (any env, by
    `env=`), with Gymnasium; ids already registered are left as they are."""
    entry = f"{__name__}:AgentrlEnv"
    for name in names:
        if gym_id(name) not in gym.registry:
            gym.register(gym_id(name), entry_point=entry, kwargs={"env": name})
    if "agentrl/env-v0" not in gym.registry:
        gym.register("agentrl/env-v0", entry_point=entry)

"""A `gymnasium.Env` with text observation and action spaces as an agentrl env.

Two ways in: `--env gym:ID` (`gymnasium.make(ID, **options)`; `ID` may be `module:Name-v0`,
which Gymnasium imports first), or a user factory `FILE.py:make` that returns a
`gymnasium.Env` (called again for every fresh env). How the two protocols map (docs/envs.md,
"Gymnasium"):

  task          train task k of env seed s resets the gym env with seed
                `s * 2 * SPLIT_SEEDS + k`, held-out task k with `... + SPLIT_SEEDS + k`: the two
                splits never share a reset seed. The task's prompt is that reset's observation;
                its gold answer is the reset info's "answer" (else empty).
  reset(task)   `gym.reset(seed=task.meta["seed"])`'s observation.
  step(action)  the agent's whole message is the gym action; an action outside the action
                space (too long, a character its charset lacks) is an error observation and
                does not reach the gym env.
  reward        agentrl reads one outcome per episode: the sum of the gym rewards, given on the
                final step (0 before); each step's own reward is in info["gym_reward"].
  ends          gym's `terminated` and `truncated` as they are (terminated wins if both), and
                truncated after `max_turns` messages (default: the gym spec's
                max_episode_steps, else 12), so every episode ends.
  info          "success" from the gym info when present (else reward > 0), "error" for an
                action outside the space; the final observation in info["final_observation"].
  forking       snapshot() deep-copies the gym env (and the episode's counters); an env that
                cannot be deep-copied or pickled fails the fork check, so FOCUS and VinePPO
                refuse it in one line; GRPO and the other linear methods never fork.
"""
from __future__ import annotations

import copy
import sys
from typing import Any, Callable

from ..errors import ConfigError
from .base import StepResult, Task

__all__ = ["GYM_OPTIONS", "GymAdapter", "GymSpec", "GymTextEnv", "SPLIT_SEEDS", "gym_id_factory",
           "is_gym_env"]

SPLIT_SEEDS = 1_000_000     # reset seeds per split (the most tasks a split may have)
GYM_OPTIONS = ("n_train", "n_eval", "max_turns")
_INSTALL = "pip install 'agentrl[gym]' (or pip install gymnasium)"


def _gymnasium():
    try:
        # deferred: optional extra (gymnasium)
        import gymnasium
    except ImportError as e:
        raise ConfigError(f"a Gymnasium env needs the gymnasium package: {_INSTALL}") from e
    return gymnasium


def is_gym_env(obj: Any) -> bool:
    """Whether `obj` is a `gymnasium.Env` (gymnasium is not imported to answer no)."""
    gym = sys.modules.get("gymnasium")
    return gym is not None and isinstance(obj, gym.Env)


def _check_text_spaces(env: Any, name: str) -> None:
    # deferred: optional extra (gymnasium)
    from gymnasium.spaces import Text

    for what in ("observation", "action"):
        space = getattr(env, f"{what}_space", None)
        if not isinstance(space, Text):
            raise ConfigError(f"env '{name}': its gymnasium {what} space is "
                              f"{type(space).__name__}, not Text (agentrl envs are text in, text out)")


class GymTextEnv:
    """One episode at a time of a gym env, under the TextEnv protocol (the module docstring)."""

    def __init__(self, gym_env: Any, max_turns: int, system_prompt: str):
        self.gym, self.max_turns, self.system_prompt = gym_env, max_turns, system_prompt
        self.turns, self.total, self.done, self.terminated, self.truncated = 0, 0.0, False, False, False

    def reset(self, task: Task) -> str:
        obs, _ = self.gym.reset(seed=task.meta["seed"])
        self.turns, self.total, self.done, self.terminated, self.truncated = 0, 0.0, False, False, False
        return obs

    def step(self, action: str) -> StepResult:
        if self.done:
            return StepResult("error: the episode is over", 0.0, self.terminated, self.truncated,
                              {"error": True, "success": False})
        self.turns += 1
        if not isinstance(action, str) or not self.gym.action_space.contains(action):
            obs, reward, term, trunc = self._outside(action), 0.0, False, False
            info: dict = {"error": True}
        else:
            obs, reward, term, trunc, gym_info = self.gym.step(action)
            info = {**gym_info, "gym_reward": float(reward)}
        self.total += float(reward)
        self.terminated = bool(term)
        self.truncated = not self.terminated and (bool(trunc) or self.turns >= self.max_turns)
        self.done = self.terminated or self.truncated
        if not self.done:
            return StepResult(obs, 0.0, False, False, info)
        info["final_observation"] = obs
        return StepResult("", self.total, self.terminated, self.truncated, info)

    def _outside(self, action: Any) -> str:
        space = self.gym.action_space
        if not isinstance(action, str):
            return "error: the action is not text"
        if not space.min_length <= len(action) <= space.max_length:
            return (f"error: the action has {len(action)} characters; the env takes "
                    f"{space.min_length} to {space.max_length}")
        bad = sorted({c for c in action if c not in space.character_set})
        return f"error: the action holds characters the env does not take: {''.join(bad[:10])!r}"

    def snapshot(self) -> Any:
        """A deep copy of the gym env and the counters (an env whose objects cannot be copied
        raises here, and the fork check says so)."""
        return copy.deepcopy((self.gym, self.turns, self.total, self.done, self.terminated,
                              self.truncated))

    def restore(self, state: Any) -> None:
        (self.gym, self.turns, self.total, self.done, self.terminated,
         self.truncated) = copy.deepcopy(state)


class GymSpec:
    """The spec of a gym env: `make_gym()` gives a fresh `gymnasium.Env` (`first`, if given, is
    the first one, already made); tasks are reset seeds (the module docstring)."""

    def __init__(self, make_gym: Callable[[], Any], name: str, seed: int = 0, n_train: int = 200,
                 n_eval: int = 50, max_turns: int | None = None, first: Any = None):
        _gymnasium()
        for k, v in (("n_train", n_train), ("n_eval", n_eval)):
            if not isinstance(v, int) or not 0 < v <= SPLIT_SEEDS:
                raise ConfigError(f"env '{name}': {k} must be an integer in 1..{SPLIT_SEEDS}, got {v!r}")
        self.name, self.seed, self._make_gym = name, seed, make_gym
        self.n = {"train": n_train, "eval": n_eval}
        self._probe = first if first is not None else make_gym()
        _check_text_spaces(self._probe, name)
        spec = getattr(self._probe, "spec", None)
        self.max_turns = int(max_turns or getattr(spec, "max_episode_steps", None) or 12)
        self.system_prompt = str(getattr(self._probe.unwrapped, "system_prompt", "") or "")
        rr = getattr(self._probe.unwrapped, "reward_range", None)
        if rr is not None:
            self.reward_range = (float(rr[0]), float(rr[1]))
        self._tasks: dict[str, list[Task]] = {}

    def make(self) -> GymTextEnv:
        return GymTextEnv(self._make_gym(), self.max_turns, self.system_prompt)

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        if split not in self.n:
            raise ConfigError(f"env '{self.name}': no split '{split}' (train, eval)")
        count = self.n[split] if n is None else min(n, self.n[split])
        have = self._tasks.setdefault(split, [])
        base = self.seed * 2 * SPLIT_SEEDS + (SPLIT_SEEDS if split == "eval" else 0)
        for k in range(len(have), count):
            obs, info = self._probe.reset(seed=base + k)
            have.append(Task(f"{split}-{k:05d}", obs, str(info.get("answer", "")), {"seed": base + k}))
        return have[:count]


def gym_id_factory(env_id: str) -> Callable[..., GymSpec]:
    """The factory of `--env gym:ID`: `factory(seed=0, n_train=200, n_eval=50, max_turns=None,
    **kwargs)`, the `kwargs` going to `gymnasium.make(ID, ...)`."""
    def factory(seed: int = 0, n_train: int = 200, n_eval: int = 50, max_turns: int | None = None,
                **kwargs: Any) -> GymSpec:
        gym = _gymnasium()
        try:
            first = gym.make(env_id, **kwargs)
        except gym.error.Error as e:
            raise ConfigError(f"env 'gym:{env_id}': {' '.join(str(e).split())}") from e
        return GymSpec(lambda: gym.make(env_id, **kwargs), f"gym:{env_id}", seed, n_train,
                       n_eval, max_turns, first=first)

    return factory


class GymAdapter:
    """A user factory (`FILE.py:make`) that returns a `gymnasium.Env`: its spec is a `GymSpec`
    whose fresh envs come from calling the factory again; `n_train`, `n_eval` and `max_turns`
    are options of the adapter when the factory does not take them."""

    options = GYM_OPTIONS

    def accepts(self, obj: Any) -> bool:
        return is_gym_env(obj)

    def __call__(self, obj: Any, remake: Callable[[], Any], name: str, seed: int,
                 **options: Any) -> GymSpec:
        return GymSpec(remake, name, seed, first=obj, **options)

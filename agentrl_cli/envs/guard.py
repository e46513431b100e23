"""The env boundary, checked on every step of every rollout (docs/your-env.md, "Checked on
every step").

`guard_spec(spec, section)` wraps an env spec so that each of its envs (`GuardedEnv`) checks
what crosses the boundary: `reset` returns text; `step` returns a `StepResult` of the right
types, a finite reward inside the spec's declared `reward_range` (`reward_range`), never both
`terminated` and `truncated`, an observation of at most `env.max_observation_chars`
characters; `reset` and `step` return within `env.step_timeout_s` seconds. A violation raises
`EnvContractError`, one line naming the env, the task and the step, so a run stops instead of
training on garbage. An exception raised inside `step` is not a violation: it passes through
unchanged (the rollout ends that episode as a failed one and counts it, `env/exceptions`).

The timeout runs the call on a pooled worker thread and waits for it (`call_with_timeout`). A
thread cannot be killed: a worker whose call timed out is abandoned (a daemon thread, it does
not keep the process alive) and the run stops with the error.
"""
from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ConfigError

DEFAULT_REWARD_RANGE = (-1e6, 1e6)   # a spec without `reward_range`: only garbage is refused


class EnvContractError(ConfigError):
    """An env broke the protocol during a rollout: one line naming the env, the task and the
    step (`at` fills in what the caller knows better)."""

    def __init__(self, env: str, problem: str, task: str | None = None, step: Any = None):
        self.env, self.problem, self.task, self.step = env, problem, task, step
        where = "".join([f", task {task}" if task is not None else "",
                         f", step {step}" if step is not None else ""])
        super().__init__(f"env '{env}'{where}: {problem}")

    def at(self, task: str, step: Any) -> "EnvContractError":
        """The same error, located at `task` and `step`."""
        return EnvContractError(self.env, self.problem, task, step)

    def __reduce__(self):   # pickled whole (a Ray rollout worker's error reaches the trainer)
        return EnvContractError, (self.env, self.problem, self.task, self.step)


class StepTimeout(TimeoutError):
    """A call did not return within its timeout (its worker thread is abandoned)."""


def reward_range(spec) -> tuple[float, float]:
    """The rewards `spec` declares (`spec.reward_range = (low, high)`), else
    `DEFAULT_REWARD_RANGE`; a declaration that is not two finite numbers, low < high, is a
    one-line `ConfigError`."""
    declared = getattr(spec, "reward_range", None)
    if declared is None:
        return DEFAULT_REWARD_RANGE
    try:
        lo, hi = (float(v) for v in declared)
        ok = math.isfinite(lo) and math.isfinite(hi) and lo < hi
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(f"env '{getattr(spec, 'name', '?')}': reward_range {declared!r} is not "
                          "(low, high), two finite numbers with low < high")
    return lo, hi


_TYPES = (("observation", str), ("reward", (int, float)), ("terminated", bool),
          ("truncated", bool), ("info", dict))


def result_problem(res: Any, rewards: tuple[float, float] | None = None,
                   max_chars: int | None = None) -> str | None:
    """What is wrong with a step's result, or None: types, a finite reward (in `rewards`
    when given), not both ended flags, an observation of at most `max_chars` characters."""
    for attr, types in _TYPES:
        v = getattr(res, attr, _TYPES)
        if v is _TYPES:
            return f"step returned a {type(res).__name__} without .{attr} (return envs.StepResult)"
        if not isinstance(v, types) or (attr == "reward" and isinstance(v, bool)):
            name = types.__name__ if isinstance(types, type) else "float"
            return f"step returned .{attr} of type {type(v).__name__}, not {name}"
    r = res.reward
    if not math.isfinite(r):
        return f"reward {r} is not a finite number"
    if rewards is not None and not rewards[0] <= r <= rewards[1]:
        return (f"reward {r:g} is outside the env's reward_range [{rewards[0]:g}, {rewards[1]:g}] "
                "(declare spec.reward_range)")
    if res.terminated and res.truncated:
        return "terminated and truncated both True (an episode ends one way)"
    if max_chars is not None and len(res.observation) > max_chars:
        return observation_too_long(len(res.observation), max_chars)
    return None


def observation_too_long(n: int, max_chars: int) -> str:
    return (f"an observation of {n:,} characters, above env.max_observation_chars={max_chars:,}")


class _Worker:
    """A daemon thread that runs one call at a time."""

    def __init__(self):
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="agentrl-env-step", daemon=True).start()

    def _serve(self) -> None:
        while True:
            fn, arg = self.inbox.get()
            try:
                self.outbox.put((True, fn(arg)))
            except BaseException as e:  # noqa: BLE001  (handed back to the caller's thread)
                self.outbox.put((False, e))


_IDLE: list[_Worker] = []            # workers free for the next call (any thread takes one)


def call_with_timeout(fn: Callable[[Any], Any], arg: Any, timeout_s: float,
                      slow: tuple[float, Callable[[], None]] | None = None) -> Any:
    """`fn(arg)`, or `StepTimeout` when it has not returned after `timeout_s` seconds (0: no
    timeout, called directly unless `slow` is given). An exception inside `fn` is raised here,
    unchanged. `slow` = (seconds, callback): once the call has taken that long the callback
    runs (a progress line: a quick call says nothing) and the wait goes on."""
    if not timeout_s and slow is None:
        return fn(arg)
    try:
        worker = _IDLE.pop()
    except IndexError:
        worker = _Worker()
    worker.inbox.put((fn, arg))
    t0 = time.monotonic()
    try:
        if slow is not None and (not timeout_s or slow[0] < timeout_s):
            try:
                ok, value = worker.outbox.get(timeout=slow[0])
            except queue.Empty:
                slow[1]()
                rest = None if not timeout_s else max(0.0, timeout_s - (time.monotonic() - t0))
                ok, value = worker.outbox.get(timeout=rest)
        else:
            ok, value = worker.outbox.get(timeout=timeout_s)
    except queue.Empty:
        raise StepTimeout(f"did not return within {timeout_s:g} s") from None
    _IDLE.append(worker)
    if not ok:
        raise value
    return value


@dataclass(frozen=True)
class Limits:
    """What a guarded env enforces (from the spec and the env section)."""

    env: str                                  # the env's name, for the error line
    rewards: tuple[float, float]              # the declared (or default) reward range
    step_timeout_s: float                     # 0: no timeout
    max_observation_chars: int


class GuardedEnv:
    """An env whose every `reset` and `step` is checked against `Limits` (module docstring);
    `snapshot`, `restore` and every other attribute are the inner env's."""

    def __init__(self, inner, limits: Limits):
        self.inner, self.limits = inner, limits
        # the guard's own bookkeeping, named so it never shadows the inner env's attributes
        # (an env's `steps` or `task_id` stays its own, through `__getattr__`)
        self.guard_task: str | None = None    # known after reset (not after restore)
        self.guard_steps = 0

    @property
    def system_prompt(self) -> str:
        return self.inner.system_prompt

    def _call(self, fn, arg, what: str):
        try:
            return call_with_timeout(fn, arg, self.limits.step_timeout_s)
        except StepTimeout as e:
            raise self.error(f"{what} {e} (env.step_timeout_s; the run stops: a hung call "
                             "cannot be interrupted)") from None

    def error(self, problem: str, step: Any = None) -> EnvContractError:
        return EnvContractError(self.limits.env, problem, self.guard_task,
                                self.guard_steps if step is None else step)

    def reset(self, task) -> str:
        self.guard_task, self.guard_steps = getattr(task, "task_id", None), 0
        obs = self._call(self.inner.reset, task, "reset()")
        if not isinstance(obs, str):
            raise self.error(f"reset returned {type(obs).__name__}, not str (the first user "
                             "message)", "reset")
        if len(obs) > self.limits.max_observation_chars:
            raise self.error(observation_too_long(len(obs), self.limits.max_observation_chars),
                             "reset")
        return obs

    def step(self, action: str):
        self.guard_steps += 1
        res = self._call(self.inner.step, action, "step()")
        bad = result_problem(res, self.limits.rewards, self.limits.max_observation_chars)
        if bad is not None:
            raise self.error(bad)
        return res

    def snapshot(self) -> Any:
        return self.inner.snapshot()

    def restore(self, state: Any) -> None:
        self.guard_task = None
        self.inner.restore(state)

    def __getattr__(self, name: str):
        if name in ("inner", "limits", "guard_task", "guard_steps"):   # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)


class GuardedSpec:
    """An env spec whose envs are `GuardedEnv`s; tasks, the expert (given the inner env) and
    every other attribute are the inner spec's."""

    def __init__(self, inner, limits: Limits):
        self.inner, self.limits = inner, limits
        self.name = getattr(inner, "name", limits.env)

    def make(self) -> GuardedEnv:
        return GuardedEnv(self.inner.make(), self.limits)

    def tasks(self, split: str, n: int | None = None):
        return self.inner.tasks(split, n)

    def __getattr__(self, name: str):
        if name in ("inner", "limits"):
            raise AttributeError(name)
        value = getattr(self.inner, name)
        if name == "expert":                 # only where the inner spec has one (has_expert)
            return lambda env, rng, error_rate=0.0: value(
                env.inner if isinstance(env, GuardedEnv) else env, rng, error_rate)
        return value


def limits_of(spec, section) -> Limits:
    """The `Limits` of `spec` built from env section `section`."""
    return Limits(section.name, reward_range(spec), float(section.step_timeout_s),
                  int(section.max_observation_chars))


def guard_spec(spec, section) -> GuardedSpec:
    """`spec` with its envs checked on every step (module docstring), limits from `section`."""
    return GuardedSpec(spec, limits_of(spec, section))

"""The env boundary, checked on every step of every rollout (docs/your-env.md, "Checked on
every step").

`guard_spec(spec, section)` wraps an env spec so that each of its envs (`GuardedEnv`) checks
what crosses the boundary: `reset` returns text; `step` returns a `StepResult` of the right
types, a finite reward inside the spec's declared `reward_range` (`reward_range`), never both
`terminated` and `truncated`, an observation of at most `env.max_observation_chars`
characters; `reset`, `step`, `snapshot`, `restore` and the spec's `make` and `tasks` return
within `env.step_timeout_s` seconds. A violation raises `EnvContractError`, one line naming the env, the task and the
step, so a run stops instead of training on garbage. An exception raised inside `step` is not a violation: it passes through
unchanged (the rollout ends that episode as a failed one and counts it, `env/exceptions`). An
exception raised inside `reset`, `snapshot`, `restore` or the spec's `make` is one (an
episode cannot start or fork from it), and so is a `SystemExit` or `KeyboardInterrupt` from
any of them or from `tasks`: user code must not end the process. An observation holding a lone surrogate (text no tokenizer can
encode) has each one replaced by U+FFFD.

The same guard runs every other piece of a user's code the rollout calls (`call_user`: reward
functions, FOCUS allocators): within `env.step_timeout_s`, an exception, exit or timeout is a
one-line `UserCodeError` naming the function, its file and the task.

The timeout runs the call on a pooled worker thread and waits for it (`call_with_timeout`). A
thread cannot be killed: a worker whose call timed out is abandoned (a daemon thread, it does
not keep the process alive) and the run stops with the error.
"""
from __future__ import annotations

import math
import queue
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ConfigError
from .base import StepResult

DEFAULT_REWARD_RANGE = (-1e6, 1e6)   # a spec without `reward_range`: only garbage is refused
DEFAULT_TIMEOUT_S = 60.0             # env.step_timeout_s's default, for a call outside a run


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


class UserCodeError(ConfigError):
    """A user's function (a reward function, an allocator) raised, exited or hung: one line
    naming it, its file and where it ran."""


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


def defined_in(fn: Any) -> str:
    """Where `fn` is defined, `FILE:LINE` (a bound method's function's; a callable object's
    `__call__`; an adapter's `user_fn`, the user's function it calls), or '?' for a function
    without Python source."""
    fn = getattr(fn, "user_fn", fn)
    target = getattr(fn, "__func__", fn)
    code = getattr(target, "__code__", None)
    if code is None:
        code = getattr(getattr(type(target), "__call__", None), "__code__", None)
    return "?" if code is None else f"{code.co_filename}:{code.co_firstlineno}"


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return type(e).__name__ + (f": {text[:300]}" if text else "")


EXITS = (SystemExit, KeyboardInterrupt, GeneratorExit)   # what user code must never raise


def call_user(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any], timeout_s: float,
              what: str, passes: tuple[type[BaseException], ...] = (),
              timeout_key: str = "env.step_timeout_s") -> Any:
    """`fn(*args, **kwargs)`, the user's code (the module docstring), under `timeout_s` (0:
    none): an exception, an exit or a timeout is a `UserCodeError` "`what` (FILE:LINE) ...";
    `what` names the function and where it ran (the task). Exceptions of `passes` (a signal
    the caller expects, e.g. `StopTraining`) are raised unchanged; `timeout_key` is the key
    the timeout line names."""
    try:
        return call_with_timeout(lambda a: fn(*a[0], **a[1]), (args, kwargs), timeout_s)
    except StepTimeout as e:
        raise UserCodeError(f"{what} ({defined_in(fn)}) {e} ({timeout_key}; the run "
                            "stops: a hung call cannot be interrupted)") from None
    except passes:
        raise
    except EXITS as e:
        raise UserCodeError(f"{what} ({defined_in(fn)}) raised {_one_line(e)}: user code "
                            "must not end the process") from None
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001  (the user's code: one line, chained for debugging)
        raise UserCodeError(f"{what} ({defined_in(fn)}) raised {_one_line(e)}") from e


def _star(fn: Callable[..., Any]) -> Callable[[tuple], Any]:
    return lambda args: fn(*args)


_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """`text` with each lone surrogate (a code point no UTF-8 encoding exists for, which a
    tokenizer refuses) replaced by U+FFFD; the same object when it has none (the common case
    costs one encode)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)


@dataclass(frozen=True)
class Limits:
    """What a guarded env enforces (from the spec and the env section)."""

    env: str                                  # the env's name, for the error line
    rewards: tuple[float, float]              # the declared (or default) reward range
    step_timeout_s: float                     # 0: no timeout
    max_observation_chars: int


def env_call(fn, args: tuple, what: str, timeout_s: float,
             error: Callable[[str], EnvContractError], raising_stops: bool = True):
    """`fn(*args)`, an env's (or its spec's) code, under `timeout_s`; a timeout or an exit is
    `error(problem)`, and so is an exception when `raising_stops` (else it passes through: a
    failed episode, or a `ConfigError` the env declares)."""
    try:
        return call_with_timeout(_star(fn), args, timeout_s)
    except StepTimeout as e:
        raise error(f"{what} {e} (env.step_timeout_s; the run stops: a hung call cannot be "
                    f"interrupted; {defined_in(fn)})") from None
    except EXITS as e:
        raise error(f"{what} ({defined_in(fn)}) raised {_one_line(e)}: an env must not end the "
                    "process") from None
    except Exception as e:
        if not raising_stops or isinstance(e, ConfigError):
            raise
        raise error(f"{what} ({defined_in(fn)}) raised {_one_line(e)}") from e


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

    def _call(self, fn, args: tuple, what: str, raising_stops: bool = True, step: Any = None):
        return env_call(fn, args, what, self.limits.step_timeout_s,
                        lambda problem: self.error(problem, step), raising_stops)

    def error(self, problem: str, step: Any = None) -> EnvContractError:
        return EnvContractError(self.limits.env, problem, self.guard_task,
                                self.guard_steps if step is None else step)

    def reset(self, task) -> str:
        self.guard_task, self.guard_steps = getattr(task, "task_id", None), 0
        obs = self._call(self.inner.reset, (task,), "reset()", step="reset")
        if not isinstance(obs, str):
            raise self.error(f"reset returned {type(obs).__name__}, not str (the first user "
                             "message)", "reset")
        if len(obs) > self.limits.max_observation_chars:
            raise self.error(observation_too_long(len(obs), self.limits.max_observation_chars),
                             "reset")
        return clean_text(obs)

    def step(self, action: str):
        self.guard_steps += 1
        res = self._call(self.inner.step, (action,), "step()", raising_stops=False)
        bad = result_problem(res, self.limits.rewards, self.limits.max_observation_chars)
        if bad is not None:
            raise self.error(bad)
        clean = clean_text(res.observation)
        if clean is not res.observation:
            res = StepResult(clean, res.reward, res.terminated, res.truncated, res.info)
        return res

    def snapshot(self) -> Any:
        return self._call(self.inner.snapshot, (), "snapshot()")

    def restore(self, state: Any) -> None:
        self.guard_task = None
        self._call(self.inner.restore, (state,), "restore()", step="restore")

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
        """A guarded env; `make()` timed, its exception or exit one line."""
        inner = env_call(self.inner.make, (), "make()", self.limits.step_timeout_s, self._error)
        return GuardedEnv(inner, self.limits)

    def tasks(self, split: str, n: int | None = None):
        """The inner spec's tasks; timed, an exit one line (an exception passes: a
        `ConfigError` is how an evaluation-only env refuses its train split)."""
        return env_call(self.inner.tasks, (split, n), f"tasks({split!r})",
                        self.limits.step_timeout_s, self._error, raising_stops=False)

    def _error(self, problem: str) -> EnvContractError:
        return EnvContractError(self.limits.env, problem)

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


def user_timeout(spec) -> float:
    """`env.step_timeout_s` of a guarded spec (its `Limits`): the time every call of a user's
    code gets; `DEFAULT_TIMEOUT_S` for a spec built outside `context.make_spec`."""
    limits = getattr(spec, "limits", None)
    return float(getattr(limits, "step_timeout_s", DEFAULT_TIMEOUT_S))


def guard_spec(spec, section) -> GuardedSpec:
    """`spec` with its envs checked on every step (module docstring), limits from `section`."""
    return GuardedSpec(spec, limits_of(spec, section))

"""`check_env`: does an env meet the TextEnv protocol the trainer relies on? (As Gymnasium's
`check_env`, for text tool envs.)

`check_env(make_spec)` builds specs with `make_spec(seed)` and returns a list of problems, one
line each, `"<check>: <what is wrong>"` (empty: the env passes), plus facts for a summary
(`EnvReport`). `progress`, if given, hears one line as each check starts, so an env that hangs
shows where. Building the spec (the factory), listing a split's tasks, and every `reset` and
`step` run under `timeout_s` (`envs.guard.call_with_timeout`): one that does not return stops
the check with a one-line `EnvContractError` naming the check (and the task and step), and so
does any env call that tries to end the process (`SystemExit`, `KeyboardInterrupt`). The
checks, in the order they run:

  spec         the factory's result has `make()` and `tasks(split, n)`
  tasks        train and eval splits: non-empty lists of `Task`s (str task_id, prompt, answer),
               unique ids, `tasks(split, n)` is the first n
  answers      every task has a gold answer (pass@k and TRACE need it)
  env          `make()` gives an object with `system_prompt` (str), reset, step, snapshot, restore
  types        reset returns str; step returns a StepResult (str observation, finite float
               reward, bool terminated and truncated, dict info), never both ended flags, an
               observation of at most `max_chars` characters
  reward       rewards in the spec's declared `reward_range`, else in [0, 1] (the critic and
               FOCUS's gain assume an outcome in [0, 1]); 0 before the final step (the trainer
               reads only the final step's reward)
  fork         at every state of episodes driven by the scripted expert (its gold play, and
               with errors) and by random actions, up to the step limit deep: `snapshot()`
               pickles; a fresh env restored from it (as FOCUS and VinePPO restore into a new
               env) has the same `snapshot()` and gives the same observation, reward and flags
               as the original under the same next action (the original steps first, so a
               snapshot that shares the env's live state fails too)
  step limit   an episode of random (often malformed) actions ends within max_turns steps
  malformed    random strings, an empty string and a huge string never raise
  determinism  two specs from the same seed give the same tasks, and their envs the same
               observations and rewards under the same actions (the expert's, then random)
  expert       optional: when the spec has `expert`, it runs without raising

Random actions mix free text with calls of the tools the system prompt names (`name(...)`,
their arguments drawn from the words the episode has shown), so a tool env is exercised
beyond its error path. Everything is seeded: the same env gets the same verdict.
"""
from __future__ import annotations

import pickle
import random
import re
import string
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ConfigError
from .base import ENVS, make_env_spec
from .guard import (EXITS, EnvContractError, StepTimeout, call_with_timeout, defined_in,
                    result_problem, reward_range)

__all__ = ["EnvReport", "FORK", "check_env", "check_fork", "difference", "random_action",
           "require_determinism", "require_fork"]

FORK = "fork"
HUGE = 100_000                     # characters of the huge malformed action
TRIALS = 4                         # episodes per check
EXPERT_ERRORS = 0.3                # the error rate of the expert's imperfect play (fork check)
TOOL = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\(")


@dataclass
class EnvReport:
    problems: list[str] = field(default_factory=list)
    n_train: int = 0
    n_eval: int = 0
    max_steps: int = 0             # most steps a random episode took
    fork_states: int = 0           # states the fork check restored and compared
    has_expert: bool = False
    eval_only: bool = False        # tasks("train") refuses with a ConfigError (e.g. BFCL)
    tools: list[str] = field(default_factory=list)
    rewards: tuple[float, float] = (0.0, 1.0)   # the declared reward range, else [0, 1]
    declared: bool = False         # the spec declares its reward_range
    timeout_s: float = 0.0         # per reset or step (0: none)
    max_chars: int | None = None   # most characters in an observation
    check: str = "spec"            # the check running, the task and the step (for a timeout)
    task: str | None = None
    steps: int = 0

    def add(self, check: str, text: str) -> None:
        line = f"{check}: {' '.join(str(text).split())}"
        if line not in self.problems:
            self.problems.append(line)

    def summary(self, name: str) -> str:
        expert = ("scripted expert: yes" if self.has_expert else
                  "scripted expert: none (needed only for --model tiny and rollout --policy expert)")
        train = "no train split (evaluation only)" if self.eval_only else f"{self.n_train} train"
        return (f"ok: env '{name}': {train} / {self.n_eval} eval tasks with gold "
                f"answers; random episodes ended within {self.max_steps} steps; snapshot/restore "
                f"exact at {self.fork_states} states; deterministic per seed; malformed actions "
                f"handled; {expert}")


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"


def random_action(rng: random.Random, tools: list[str], words: list[str]) -> str:
    """A random assistant message: a call of a named tool with words seen so far, free text,
    or an empty, whitespace-only or unbalanced message."""
    r = rng.random()
    word = rng.choice(words) if words else "x"
    if tools and r < 0.6:
        args = " ".join(rng.choice(words) for _ in range(rng.randint(1, 2))) if words else word
        return f"{rng.choice(tools)}({args})"
    if r < 0.8:
        return "".join(rng.choice(string.printable) for _ in range(rng.randint(1, 40)))
    return rng.choice(["", " \n", f"{word}(", ")(", "answer(", word, "\x00"])


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z0-9_.]+", text or "")[:200]


def _timed(fn, arg, report: EnvReport, what: str):
    """`fn(arg)` under the report's timeout; a timeout is a one-line `EnvContractError`."""
    step = report.steps if what.startswith("step") else "reset"
    try:
        return call_with_timeout(fn, arg, report.timeout_s)
    except StepTimeout as e:
        raise EnvContractError("?", f"{what} {e} (env.step_timeout_s) during the "
                                    f"{report.check} check", report.task, step) from None
    except EXITS as e:
        raise _exited(e, f"{what} ({defined_in(fn)})", report, step) from None


def _bounded(fn, arg, report: EnvReport, what: str):
    """`fn(arg)` (building a spec, listing tasks) under the report's timeout: a factory or a
    task list that never returns is a one-line `EnvContractError`, as a hung step is."""
    try:
        return call_with_timeout(fn, arg, report.timeout_s)
    except StepTimeout as e:
        raise EnvContractError("?", f"{what} {e} (env.step_timeout_s) during the "
                                    f"{report.check} check") from None
    except EXITS as e:
        raise _exited(e, what, report) from None


def _exited(e: BaseException, what: str, report: EnvReport, step: Any = None) -> EnvContractError:
    """An env call that tried to end the process (`sys.exit()`, `SystemExit`,
    `KeyboardInterrupt`): the check stops in one line, as a rollout does on it."""
    return EnvContractError("?", f"{what} raised {_err(e)}: an env must not end the process "
                                 f"(during the {report.check} check)", report.task, step)


def _exits_stop(report: EnvReport, run: Callable[[], Any]) -> Any:
    """`run()`, where an exit from an env call made outside `_timed` (`make()`, `snapshot()`,
    `restore()`, the expert) stops the check in one line too."""
    try:
        return run()
    except EXITS as e:
        raise _exited(e, "the env", report) from None


def _step(env, action: str, report: EnvReport, check: str = "types", where: str = ""):
    """env.step(action), its result checked; None when it raised or returned the wrong thing
    (reported under `check`, the step described as `where`)."""
    report.steps += 1
    try:
        res = _timed(env.step, action, report, f"{where}step({_show(action)})")
    except EnvContractError:
        raise
    except Exception as e:  # noqa: BLE001
        report.add(check, f"{where}step({_show(action)}) raised {_err(e)}")
        return None
    bad = result_problem(res, max_chars=report.max_chars)
    if bad:
        report.add("types", f"step({_show(action)}): {bad}")
        return None
    lo, hi = report.rewards
    if not lo <= float(res.reward) <= hi:
        why = ("the declared reward_range" if report.declared else
               "(the critic and FOCUS's gain read outcomes in [0, 1]; or declare spec.reward_range)")
        report.add("reward", f"reward {res.reward} is outside [{lo:g}, {hi:g}] {why}")
    elif res.reward != 0 and not (res.terminated or res.truncated):
        report.add("reward", f"reward {res.reward} before the episode ended; the trainer reads "
                             "only the final step's reward")
    return res


def _show(action: str) -> str:
    return repr(action) if len(action) <= 30 else f"<{len(action)} characters>"


def _outcome(res) -> tuple:
    return (res.observation, float(res.reward), res.terminated, res.truncated)


def _trace(env, actions: list[str], report: EnvReport, check: str = "types",
           where: str = "") -> list[tuple] | None:
    """Step `env` with `actions` until it ends: [(observation, reward, terminated, truncated)]."""
    out = []
    for a in actions:
        res = _step(env, a, report, check, where)
        if res is None:
            return None
        out.append(_outcome(res))
        if res.terminated or res.truncated:
            break
    return out


def _check_tasks(spec, report: EnvReport) -> dict[str, list]:
    out = {}
    for split in ("train", "eval"):
        try:
            tasks = _bounded(spec.tasks, split, report, f"tasks({split!r})")
        except EnvContractError:
            raise
        except ConfigError as e:   # a declared refusal: an evaluation-only env has no train split
            if split != "train":
                report.add("tasks", f"tasks({split!r}) raised {_err(e)}")
            report.eval_only = True
            continue
        except Exception as e:  # noqa: BLE001
            report.add("tasks", f"tasks({split!r}) raised {_err(e)}")
            continue
        if not isinstance(tasks, list) or not tasks:
            report.add("tasks", f"tasks({split!r}) returned {type(tasks).__name__} "
                                f"{'(empty)' if not tasks else ''}; a non-empty list of Task")
            continue
        for t in tasks:
            bad = [a for a in ("task_id", "prompt", "answer") if not isinstance(getattr(t, a, None), str)]
            if bad:
                report.add("tasks", f"a {split} task has no str {bad[0]} (use envs.Task)")
                break
        else:
            ids = [t.task_id for t in tasks]
            if len(set(ids)) != len(ids):
                report.add("tasks", f"task ids repeat within the {split} split")
            empty = [t.task_id for t in tasks if not t.answer.strip()]
            if empty:
                report.add("answers", f"{len(empty)} {split} task(s) have no gold answer (first: "
                                      f"{empty[0]}); pass@k and TRACE need one")
            try:
                first = spec.tasks(split, 2)
            except Exception as e:  # noqa: BLE001
                report.add("tasks", f"tasks({split!r}, 2) raised {_err(e)}")
            else:
                if [t.task_id for t in first] != ids[:2]:
                    report.add("tasks", f"tasks({split!r}, 2) is not the first 2 of tasks({split!r})")
            out[split] = tasks
    report.n_train, report.n_eval = len(out.get("train", [])), len(out.get("eval", []))
    return out


def _check_env_object(env, report: EnvReport) -> bool:
    if not isinstance(getattr(env, "system_prompt", None), str):
        report.add("env", f"{type(env).__name__} has no str system_prompt")
    missing = [m for m in ("reset", "step", "snapshot", "restore") if not callable(getattr(env, m, None))]
    if missing:
        report.add("env", f"{type(env).__name__} lacks {', '.join(m + '()' for m in missing)}")
        return False
    return True


def _reset(env, task, report: EnvReport) -> str | None:
    report.task, report.steps = task.task_id, 0
    try:
        obs = _timed(env.reset, task, report, "reset()")
    except EnvContractError:
        raise
    except Exception as e:  # noqa: BLE001
        report.add("types", f"reset(task {task.task_id}) raised {_err(e)}")
        return None
    if not isinstance(obs, str):
        report.add("types", f"reset returned {type(obs).__name__}, not str (the first user message)")
        return None
    if report.max_chars is not None and len(obs) > report.max_chars:
        report.add("types", f"reset(task {task.task_id}) returned {len(obs):,} characters, above "
                            f"env.max_observation_chars={report.max_chars:,}")
    return obs


def _random_episodes(spec, tasks, max_turns: int, report: EnvReport, rng: random.Random) -> None:
    """Step limit and malformed actions."""
    limit = max_turns
    for i, task in enumerate(tasks[:TRIALS]):
        env = spec.make()
        obs = _reset(env, task, report)
        if obs is None:
            return
        limit = getattr(env, "max_turns", None) or max_turns
        words = _words(task.prompt) + _words(obs)
        malformed = ["", "x" * HUGE, "\x00\xff(((", "answer(" * 50] if i == 0 else []
        for n in range(1, limit + 1):
            action = malformed.pop(0) if malformed else random_action(rng, report.tools, words)
            res = _step(env, action, report, "malformed" if i == 0 and n <= 4 else "types")
            if res is None:
                return
            words += _words(res.observation)
            if res.terminated or res.truncated:
                report.max_steps = max(report.max_steps, n)
                break
        else:
            report.add("step limit", f"an episode of random actions on task {task.task_id} did not "
                                     f"end within {limit} steps (truncate at max_turns)")
            return
        try:
            _timed(env.step, "answer(x)", report, "step('answer(x)') after the end:")
        except EnvContractError:
            raise
        except Exception as e:  # noqa: BLE001  (a step after the end: an observation)
            report.add("malformed", f"step after the episode ended raised {_err(e)}")


def _drivers(spec, report: EnvReport, rng: random.Random) -> list[tuple[str, Callable]]:
    """Who picks the actions that reach the states checked: the scripted expert's gold play
    and its play with errors (when the spec has an expert), and random actions.
    Each driver: (label, fn(env, words) -> action)."""
    out = []
    if callable(getattr(spec, "expert", None)):
        for label, rate in (("the expert's", 0.0), ("the erring expert's", EXPERT_ERRORS)):
            out.append((label, lambda env, words, r=rate: spec.expert(env, rng, r)))
    out.append(("a random", lambda env, words: random_action(rng, report.tools, words)))
    return out


def check_fork(spec, tasks, report: EnvReport, rng: random.Random, max_turns: int = 12) -> None:
    """At every state of episodes driven by the expert and by random actions (`_drivers`), up
    to the step limit deep: snapshot, step on, restore into a fresh env, compare its snapshot
    and its next step with the original's (`_fork_state`)."""
    for task in tasks[:TRIALS]:
        for label, drive in _drivers(spec, report, rng):
            if not _fork_episode(spec, task, label, drive, report, max_turns):
                return


def _fork_episode(spec, task, label: str, drive: Callable, report: EnvReport,
                  max_turns: int) -> bool:
    """One driven episode on `task`, each state checked; False once a problem was found."""
    env = spec.make()
    obs = _reset(env, task, report)
    if obs is None:
        return False
    words = _words(task.prompt) + _words(obs)
    for depth in range(getattr(env, "max_turns", None) or max_turns):
        state = f"task {task.task_id}, {label} state at depth {depth}"
        try:
            snap = env.snapshot()
            frozen = pickle.dumps(snap)
        except Exception as e:  # noqa: BLE001
            report.add(FORK, f"snapshot() at {state} raised or is not picklable ({_err(e)}); "
                             "FOCUS keeps it, Ray workers receive it pickled")
            return False
        try:
            action = drive(env, words)
        except Exception as e:  # noqa: BLE001
            report.add("expert", f"spec.expert raised {_err(e)} at {state}")
            return False
        want = _step(env, action, report)
        if want is None or _aliased(snap, frozen, f"{state}: after step({_show(action)}) "
                                    "the snapshot taken before it changed", report) \
                or not _fork_state(spec, snap, frozen, action, want, state, report):
            return False
        words += _words(want.observation)
        if want.terminated or want.truncated:
            break
    return True


def _fork_state(spec, snap, frozen: bytes, action: str, want, state: str,
                report: EnvReport) -> bool:
    """A fresh env restored from `snap` (taken before the original stepped with `action` and
    got `want`) has the snapshot `frozen` held and steps to the same result."""
    report.fork_states += 1
    fresh = spec.make()
    steps = report.steps
    try:
        fresh.restore(snap)
        again = fresh.snapshot()
    except Exception as e:  # noqa: BLE001
        report.add(FORK, f"restore(snapshot()) into a fresh env at {state} raised {_err(e)}")
        return False
    diff = difference(again, pickle.loads(frozen))
    if diff is None:
        got = _step(fresh, action, report, FORK, "a fresh env restored from snapshot(): ")
        report.steps = steps
        if got is None or _aliased(snap, frozen, f"{state}: stepping a fresh env restored "
                                   "from a snapshot changed the snapshot", report):
            return False
        if _outcome(got) == _outcome(want):
            return True
        diff = (f"after {_show(action)} it gave {_short(_outcome(got))}, the original "
                f"{_short(_outcome(want))}")
    report.add(FORK, f"a fresh env restored from snapshot() diverged from the original at "
                     f"{state}: {diff}")
    return False


def _aliased(snap, frozen: bytes, what: str, report: EnvReport) -> bool:
    """True (reported) when `snap` no longer equals its pickle `frozen`: a snapshot or a
    restored env that shares mutable state with a live env (FOCUS would fork a state that a
    later step changed). The problem names the key that changed."""
    diff = difference(snap, pickle.loads(frozen), "snapshot()")
    if diff is None:
        return False
    diff = diff.replace(", the original's", ", was")
    report.add(FORK, f"{what} (it shares mutable state with the live env: copy it in "
                     f"snapshot() and restore()): {diff}")
    return True


def _short(step) -> str:
    obs, reward, term, trunc = step
    obs = obs if len(obs) <= 40 else obs[:37] + "..."
    return f"({obs!r}, reward {reward}, terminated {term}, truncated {trunc})"


def _brief(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def _parts(x: Any) -> dict | None:
    """A container's parts by their path suffix, or None for a leaf."""
    if isinstance(x, dict):
        return {f"[{k!r}]": v for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return {f"[{i}]": v for i, v in enumerate(x)}
    if hasattr(x, "__dict__") and not isinstance(x, type):
        return {f".{k}": v for k, v in vars(x).items()}
    return None


def difference(got: Any, want: Any, path: str = "its snapshot()", depth: int = 0) -> str | None:
    """Where two snapshots differ, in words (`its snapshot()['pos'] is (0, 0), the
    original's (2, 1)`), or None when they are equal: compared by `==`, else part by part
    (dicts, sequences, objects' attributes), a leaf without a working `==` by its pickle."""
    try:
        if got is want or bool(got == want):
            return None
    except Exception:  # noqa: BLE001  (e.g. an array's ambiguous truth value)
        pass
    mismatch = f"{path} is {_brief(got)}, the original's {_brief(want)}"
    a, b = _parts(got), _parts(want)
    short = isinstance(got, (list, tuple)) and len(repr(got)) + len(repr(want)) <= 80
    if short or type(got) is not type(want) or (a is None) != (b is None):
        return mismatch               # a short sequence (a position) is shown whole
    if a is None or depth > 20:
        try:
            return None if pickle.dumps(got) == pickle.dumps(want) else mismatch
        except Exception:  # noqa: BLE001  (cannot tell: the next step's comparison decides)
            return None
    for key in [*a, *(k for k in b if k not in a)]:
        if key not in a or key not in b:
            return f"{path}{key} is {'missing' if key not in a else 'extra'} in the restored env's"
        found = difference(a[key], b[key], path + key, depth + 1)
        if found:
            return found
    return None


def _check_determinism(make_spec, seed: int, first, tasks, report: EnvReport,
                       rng: random.Random) -> None:
    try:
        other = _bounded(make_spec, seed, report, "building a second spec (its factory)")
        again = {s: _bounded(other.tasks, s, report, f"tasks({s!r})") for s in tasks}
    except EnvContractError:
        raise
    except Exception as e:  # noqa: BLE001
        report.add("determinism", f"a second spec from seed {seed} raised {_err(e)}")
        return
    for split, ts in tasks.items():
        key = [(t.task_id, t.prompt, t.answer) for t in ts]
        if key != [(t.task_id, t.prompt, t.answer) for t in again[split]]:
            report.add("determinism", f"two specs from seed {seed} give different {split} tasks")
            return
    for task in (tasks.get("eval") or tasks.get("train") or [])[:2]:
        for label, drive in _drivers(first, report, rng):
            if not _same_episode(first, other, task, label, drive, seed, report):
                return


def _same_episode(first, other, task, label: str, drive: Callable, seed: int,
                  report: EnvReport) -> bool:
    """Envs of two specs from `seed`, reset on `task` and stepped with the same actions (picked
    by `drive` on the first), give the same observations, rewards and flags."""
    a, b = first.make(), other.make()
    oa, ob = _reset(a, task, report), _reset(b, task, report)
    if oa != ob:
        report.add("determinism", f"two specs from seed {seed}: reset(task {task.task_id}) "
                                  "gave different observations")
        return False
    words = _words(task.prompt) + _words(oa or "")
    for n in range(1, 7):
        try:
            action = drive(a, words)
        except Exception as e:  # noqa: BLE001
            report.add("expert", f"spec.expert raised {_err(e)}")
            return False
        ra, rb = _step(a, action, report), _step(b, action, report)
        if ra is None or rb is None:
            return False
        if _outcome(ra) != _outcome(rb):
            report.add("determinism", f"two specs from seed {seed}: the same actions ({label}) on "
                                      f"task {task.task_id} gave different results at step {n}: "
                                      f"{_short(_outcome(ra))} and {_short(_outcome(rb))}")
            return False
        words += _words(ra.observation)
        if ra.terminated or ra.truncated:
            break
    return True


def _check_expert(spec, tasks, report: EnvReport, max_turns: int) -> None:
    report.has_expert = callable(getattr(spec, "expert", None))
    if not report.has_expert:
        return
    rng = random.Random(0)
    for task in tasks[:2]:
        env = spec.make()
        if _reset(env, task, report) is None:
            return
        for _ in range(getattr(env, "max_turns", None) or max_turns):
            try:
                action = spec.expert(env, rng, 0.0)
            except Exception as e:  # noqa: BLE001
                report.add("expert", f"spec.expert raised {_err(e)}")
                return
            res = _step(env, action, report, "expert", "the expert's ")
            if res is None or res.terminated or res.truncated:
                break


def _open(make_spec, seed: int, report: EnvReport, progress: Callable[[str], None]):
    """The spec and its tasks, checked (spec, tasks, answers, env); None when the rest of the
    checks cannot run."""
    progress("spec: building it from the factory")
    try:
        spec = _bounded(make_spec, seed, report, "building the spec (its factory)")
    except EnvContractError:
        raise
    except Exception as e:  # noqa: BLE001
        report.add("spec", f"building the spec raised {_err(e)}")
        return None
    missing = [m for m in ("make", "tasks") if not callable(getattr(spec, m, None))]
    if missing:
        report.add("spec", f"a {type(spec).__name__} is not an env spec: it lacks "
                           f"{' and '.join(m + '()' for m in missing)}")
        return None
    try:
        declared = getattr(spec, "reward_range", None) is not None
        report.rewards, report.declared = (reward_range(spec) if declared else (0.0, 1.0)), declared
    except ConfigError as e:
        report.add("reward", str(e))
    progress("tasks: train and eval splits, unique ids, gold answers")
    tasks = _check_tasks(spec, report)
    progress("env: make(), system_prompt, reset, step, snapshot, restore")
    try:
        env = spec.make()
    except Exception as e:  # noqa: BLE001
        report.add("env", f"make() raised {_err(e)}")
        return None
    if not tasks or not _check_env_object(env, report):
        return None
    report.tools = sorted(set(TOOL.findall(getattr(env, "system_prompt", "") or "")))
    return spec, tasks


def check_env(make_spec: Callable[[int], Any], seed: int = 0, max_turns: int = 12,
              forks_only: bool = False, progress: Callable[[str], None] | None = None,
              timeout_s: float = 0.0, max_chars: int | None = None) -> EnvReport:
    """Check the env whose spec at a seed is `make_spec(seed)` (the checks in the module
    docstring; `forks_only`: the spec, task and fork checks, what FOCUS and VinePPO need).
    `max_turns` is the step limit of an env without its own `max_turns` attribute;
    `progress(line)` hears each check as it starts; `timeout_s` bounds every reset and step
    (0: none); `max_chars` bounds an observation."""
    report = EnvReport(timeout_s=timeout_s, max_chars=max_chars)
    return _exits_stop(report, lambda: _checks(make_spec, seed, max_turns, forks_only, report,
                                               _announcer(report, progress)))


def _checks(make_spec: Callable[[int], Any], seed: int, max_turns: int, forks_only: bool,
            report: EnvReport, say: Callable[[str], None]) -> EnvReport:
    """`check_env`'s checks, in order, into `report`."""
    rng = random.Random(seed * 1_000_003 + 17)
    opened = _open(make_spec, seed, report, say)
    if opened is None:
        return report
    spec, tasks = opened
    pool = tasks.get("eval") or tasks.get("train")
    say("fork: snapshot/restore at every state of expert and random episodes")
    check_fork(spec, pool, report, rng, max_turns)
    if forks_only:
        return report
    say("step limit and malformed actions: random, empty and huge messages")
    _random_episodes(spec, pool, max_turns, report, rng)
    say(f"determinism: two specs from seed {seed}, the same actions")
    _check_determinism(make_spec, seed, spec, tasks, report, rng)
    say("expert: the scripted expert's episodes")
    _check_expert(spec, pool, report, max_turns)
    return report


def _announcer(report: EnvReport, progress: Callable[[str], None] | None) -> Callable[[str], None]:
    """A progress callback that also records the running check (named by a timeout)."""
    def say(line: str) -> None:
        report.check = line.split(":", 1)[0]
        if progress is not None:
            progress(line)
    return say


def require_fork(section, what: str) -> None:
    """A user env that a forking controller (a `rollout.controllers.Controller` with `forks`:
    FOCUS, VinePPO) would snapshot and restore must pass the fork check: else a one-line
    `ConfigError`, before any model loads. Built-in envs pass it in the package's tests and are not re-checked."""
    if not ENVS.is_user(section.name):
        return
    make_env_spec(section)               # a spec that does not build: its own one-line error
    report = _checked(section, lambda: check_env(
        lambda s: make_env_spec(section, s), seed=section.seed, max_turns=section.max_turns,
        forks_only=True, timeout_s=section.step_timeout_s, max_chars=section.max_observation_chars))
    bad = [p for p in report.problems if p.startswith(FORK + ":")]
    if bad:
        raise ConfigError(f"{what} forks episodes (snapshot/restore), and env '{section.name}' "
                          f"fails the fork check: {bad[0]} (agentrl check-env shows every problem)")


def _checked(section, run: Callable[[], EnvReport]) -> EnvReport:
    """`run()`, a timeout's error naming the env as the section does."""
    try:
        return run()
    except EnvContractError as e:
        raise EnvContractError(section.name, e.problem, e.task, e.step) from None


def _splits(spec) -> dict[str, list]:
    """The spec's tasks by split; an evaluation-only env's refused train split left out."""
    tasks = {}
    for split in ("train", "eval"):
        try:
            tasks[split] = spec.tasks(split)
        except ConfigError:
            continue
    return tasks


def require_determinism(section, log: Callable[[str], None]) -> None:
    """A user env must be deterministic per seed (the determinism check: the same tasks, the
    same observations and rewards under the same actions), checked before any model loads: else
    a one-line `ConfigError` naming `env.deterministic=false`, the opt-out for a stochastic env,
    with which a failure is a warning. Built-in envs are checked in the package's tests."""
    if not ENVS.is_user(section.name):
        return
    make_spec = lambda s: make_env_spec(section, s)  # noqa: E731
    first = make_spec(section.seed)
    report = EnvReport(timeout_s=section.step_timeout_s, max_chars=section.max_observation_chars,
                       check="determinism")
    rng = random.Random(section.seed * 1_000_003 + 17)
    _checked(section, lambda: _exits_stop(report, lambda: _check_determinism(
        make_spec, section.seed, first, _splits(first), report, rng)) or report)
    bad = [p for p in report.problems if p.startswith("determinism:")]
    if not bad:
        return
    if section.deterministic:
        raise ConfigError(f"env '{section.name}' is not deterministic per seed: {bad[0]} (fix it, "
                          "or set env.deterministic=false to train a stochastic env; "
                          "agentrl check-env shows every problem)")
    log(f"warning: env '{section.name}' is not deterministic per seed ({bad[0]}); training it "
        "anyway (env.deterministic=false)")

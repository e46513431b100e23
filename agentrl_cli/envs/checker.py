"""`check_env`: does an env meet the TextEnv protocol the trainer relies on? (As Gymnasium's
`check_env`, for text tool envs.)

`check_env(make_spec)` builds specs with `make_spec(seed)` and returns a list of problems, one
line each, `"<check>: <what is wrong>"` (empty: the env passes), plus facts for a summary
(`EnvReport`). The checks, in the order they run:

  spec         the factory's result has `make()` and `tasks(split, n)`
  tasks        train and eval splits: non-empty lists of `Task`s (str task_id, prompt, answer),
               unique ids, `tasks(split, n)` is the first n
  answers      every task has a gold answer (pass@k and TRACE need it)
  env          `make()` gives an object with `system_prompt` (str), reset, step, snapshot, restore
  types        reset returns str; step returns a StepResult (str observation, finite float
               reward, bool terminated and truncated, dict info), never both ended flags
  reward       rewards in [0, 1] (the critic and FOCUS's gain assume an outcome in [0, 1]); 0
               before the final step (the trainer reads only the final step's reward)
  step limit   an episode of random (often malformed) actions ends within max_turns steps
  malformed    random strings, an empty string and a huge string never raise
  fork         `snapshot()` pickles, and a fresh env restored from it (as FOCUS and VinePPO
               restore into a new env) continues exactly as the original would under the same
               random actions; stepping the original after a snapshot does not change it
  determinism  two specs from the same seed give the same tasks, and their envs the same
               observations and rewards under the same actions
  expert       optional: when the spec has `expert`, it runs without raising

Random actions mix free text with calls of the tools the system prompt names (`name(...)`,
their arguments drawn from the words the episode has shown), so a tool env is exercised
beyond its error path. Everything is seeded: the same env gets the same verdict.
"""
from __future__ import annotations

import math
import pickle
import random
import re
import string
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ConfigError

__all__ = ["EnvReport", "FORK", "check_env", "check_fork", "random_action", "require_fork"]

FORK = "fork"
HUGE = 100_000                     # characters of the huge malformed action
TRIALS = 4                         # episodes per check
TOOL = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\(")


@dataclass
class EnvReport:
    problems: list[str] = field(default_factory=list)
    n_train: int = 0
    n_eval: int = 0
    max_steps: int = 0             # most steps a random episode took
    has_expert: bool = False
    eval_only: bool = False        # tasks("train") refuses with a ConfigError (e.g. BFCL)
    tools: list[str] = field(default_factory=list)

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
                f"exact; deterministic per seed; malformed actions handled; {expert}")


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


def _step(env, action: str, report: EnvReport, check: str = "types", where: str = ""):
    """env.step(action), its result checked; None when it raised or returned the wrong thing
    (reported under `check`, the step described as `where`)."""
    try:
        res = env.step(action)
    except Exception as e:  # noqa: BLE001
        report.add(check, f"{where}step({_show(action)}) raised {_err(e)}")
        return None
    bad = _result_problem(res)
    if bad:
        report.add("types", f"step({_show(action)}) returned {bad}")
        return None
    if not (0.0 <= float(res.reward) <= 1.0):
        report.add("reward", f"reward {res.reward} is outside [0, 1] (the critic and FOCUS's "
                             "gain read outcomes in [0, 1])")
    elif res.reward != 0 and not (res.terminated or res.truncated):
        report.add("reward", f"reward {res.reward} before the episode ended; the trainer reads "
                             "only the final step's reward")
    return res


def _show(action: str) -> str:
    return repr(action) if len(action) <= 30 else f"<{len(action)} characters>"


def _result_problem(res: Any) -> str | None:
    for attr, types in (("observation", (str,)), ("reward", (int, float)),
                        ("terminated", (bool,)), ("truncated", (bool,)), ("info", (dict,))):
        if not hasattr(res, attr):
            return f"a {type(res).__name__} without .{attr} (return envs.StepResult)"
        v = getattr(res, attr)
        if not isinstance(v, types) or (attr == "reward" and isinstance(v, bool)):
            return f".{attr} of type {type(v).__name__}, not {types[0].__name__}"
    if not math.isfinite(float(res.reward)):
        return f"a reward of {res.reward}"
    if res.terminated and res.truncated:
        return "terminated and truncated both True (an episode ends one way)"
    return None


def _trace(env, actions: list[str], report: EnvReport, check: str = "types",
           where: str = "") -> list[tuple] | None:
    """Step `env` with `actions` until it ends: [(observation, reward, terminated, truncated)]."""
    out = []
    for a in actions:
        res = _step(env, a, report, check, where)
        if res is None:
            return None
        out.append((res.observation, float(res.reward), res.terminated, res.truncated))
        if res.terminated or res.truncated:
            break
    return out


def _check_tasks(spec, report: EnvReport) -> dict[str, list]:
    out = {}
    for split in ("train", "eval"):
        try:
            tasks = spec.tasks(split)
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
    try:
        obs = env.reset(task)
    except Exception as e:  # noqa: BLE001
        report.add("types", f"reset(task {task.task_id}) raised {_err(e)}")
        return None
    if not isinstance(obs, str):
        report.add("types", f"reset returned {type(obs).__name__}, not str (the first user message)")
        return None
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
            env.step("answer(x)")       # a step after the end: an observation, not an exception
        except Exception as e:  # noqa: BLE001
            report.add("malformed", f"step after the episode ended raised {_err(e)}")


def check_fork(spec, tasks, report: EnvReport, rng: random.Random, max_turns: int = 12) -> None:
    """Snapshot after a few random steps; a fresh env restored from it, and the original,
    continue identically under the same actions; the snapshot pickles and is independent."""
    for task in tasks[:TRIALS]:
        env = spec.make()
        obs = _reset(env, task, report)
        if obs is None:
            return
        words = _words(task.prompt) + _words(obs)
        prefix, ended = [], False
        for _ in range(rng.randint(0, 2)):
            a = random_action(rng, report.tools, words)
            res = _step(env, a, report)
            if res is None:
                return
            prefix.append(a)
            words += _words(res.observation)
            if res.terminated or res.truncated:
                ended = True
                break
        if ended:
            continue
        try:
            snap = env.snapshot()
        except Exception as e:  # noqa: BLE001
            report.add(FORK, f"snapshot() raised {_err(e)}")
            return
        try:
            pickle.loads(pickle.dumps(snap))
        except Exception as e:  # noqa: BLE001
            report.add(FORK, f"snapshot() is not picklable ({_err(e)}); Ray workers receive it")
        actions = [random_action(rng, report.tools, words) for _ in range(max_turns + 1)]
        want = _trace(env, actions, report)       # the original goes on: the snapshot must not
        fresh = spec.make()
        try:
            fresh.restore(snap)
        except Exception as e:  # noqa: BLE001
            report.add(FORK, f"restore(snapshot()) into a fresh env raised {_err(e)}")
            return
        got = _trace(fresh, actions, report, FORK, "a fresh env restored from snapshot(): ")
        if want is None or got is None:
            return
        if got != want:
            k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            a = got[k] if k < len(got) else "(ended)"
            b = want[k] if k < len(want) else "(ended)"
            report.add(FORK, f"a fresh env restored from snapshot() diverged from the original at "
                             f"step {k + 1} after the snapshot (task {task.task_id}): got {_short(a)}, "
                             f"the original gave {_short(b)}")
            return


def _short(step) -> str:
    if isinstance(step, str):
        return step
    obs, reward, term, trunc = step
    obs = obs if len(obs) <= 40 else obs[:37] + "..."
    return f"({obs!r}, reward {reward}, terminated {term}, truncated {trunc})"


def _check_determinism(make_spec, seed: int, first, tasks, report: EnvReport,
                       rng: random.Random) -> None:
    try:
        other = make_spec(seed)
        again = {s: other.tasks(s) for s in tasks}
    except Exception as e:  # noqa: BLE001
        report.add("determinism", f"a second spec from seed {seed} raised {_err(e)}")
        return
    for split, ts in tasks.items():
        key = [(t.task_id, t.prompt, t.answer) for t in ts]
        if key != [(t.task_id, t.prompt, t.answer) for t in again[split]]:
            report.add("determinism", f"two specs from seed {seed} give different {split} tasks")
            return
    for task in (tasks.get("eval") or [])[:2]:
        a, b = first.make(), other.make()
        oa, ob = _reset(a, task, report), _reset(b, task, report)
        if oa != ob:
            report.add("determinism", f"two specs from seed {seed}: reset(task {task.task_id}) "
                                      "gave different observations")
            return
        words = _words(task.prompt) + _words(oa or "")
        actions = [random_action(rng, report.tools, words) for _ in range(6)]
        ta, tb = _trace(a, actions, report), _trace(b, actions, report)
        if ta != tb:
            report.add("determinism", f"two specs from seed {seed}: the same actions on task "
                                      f"{task.task_id} gave different results")
            return


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


def check_env(make_spec: Callable[[int], Any], seed: int = 0, max_turns: int = 12,
              forks_only: bool = False) -> EnvReport:
    """Check the env whose spec at a seed is `make_spec(seed)` (the checks in the module
    docstring; `forks_only`: the spec, task and fork checks, what FOCUS and VinePPO need).
    `max_turns` is the step limit of an env without its own `max_turns` attribute."""
    report = EnvReport()
    rng = random.Random(seed * 1_000_003 + 17)
    try:
        spec = make_spec(seed)
    except Exception as e:  # noqa: BLE001
        report.add("spec", f"building the spec raised {_err(e)}")
        return report
    missing = [m for m in ("make", "tasks") if not callable(getattr(spec, m, None))]
    if missing:
        report.add("spec", f"a {type(spec).__name__} is not an env spec: it lacks "
                           f"{' and '.join(m + '()' for m in missing)}")
        return report
    tasks = _check_tasks(spec, report)
    try:
        env = spec.make()
    except Exception as e:  # noqa: BLE001
        report.add("env", f"make() raised {_err(e)}")
        return report
    if not tasks or not _check_env_object(env, report):
        return report
    report.tools = sorted(set(TOOL.findall(getattr(env, "system_prompt", "") or "")))
    pool = tasks.get("eval") or tasks.get("train")
    check_fork(spec, pool, report, rng, max_turns)
    if forks_only:
        return report
    _random_episodes(spec, pool, max_turns, report, rng)
    _check_determinism(make_spec, seed, spec, tasks, report, rng)
    _check_expert(spec, pool, report, max_turns)
    return report


def require_fork(section, what: str) -> None:
    """A user env that a forking controller (`methods.FORKING_CONTROLLERS`: FOCUS, VinePPO)
    would snapshot and restore must pass the fork check: else a one-line `ConfigError`, before
    any model loads. Built-in envs pass it in the package's tests and are not re-checked."""
    from ..errors import ConfigError
    from .base import ENVS, make_env_spec

    if not ENVS.is_user(section.name):
        return
    make_env_spec(section)               # a spec that does not build: its own one-line error
    report = check_env(lambda s: make_env_spec(section, s), seed=section.seed,
                       max_turns=section.max_turns, forks_only=True)
    bad = [p for p in report.problems if p.startswith(FORK + ":")]
    if bad:
        raise ConfigError(f"{what} forks episodes (snapshot/restore), and env '{section.name}' "
                          f"fails the fork check: {bad[0]} (agentrl check-env shows every problem)")

"""Checks shared by the built-in env tests (search, locate, rules, math): registration and
options, determinism from the seed, the scripted expert, a random policy, malformed messages and
snapshot/restore. Plain functions that assert; each env's test file calls them with its spec and
adds its own checks."""
from __future__ import annotations

import pickle
import random
from collections import defaultdict
from typing import Any, Callable

import pytest

from agentrl_cli.errors import ConfigError
from agentrl_cli.envs import ENVS, StepResult, TextEnv


def spec_fixture(name: str, seed: int = 0, **options):
    """A module-scoped pytest fixture: the registered `name` env spec."""
    @pytest.fixture(scope="module")
    def spec():
        return ENVS.get(name)(seed=seed, **options)
    return spec


def start_episode(spec, index: int = 0):
    """A fresh env of `spec` reset on eval task `index`: (env, task)."""
    env = spec.make()
    task = spec.tasks("eval")[index]
    env.reset(task)
    return env, task


def run_expert(spec, env, task, rng, error_rate=0.0, check_action=None):
    """The expert's episode on `task` (from `env`'s current state when `task` is None) until it
    ends: (actions, results). `check_action(a)` is asserted on every action."""
    if task is not None:
        env.reset(task)
    actions, results = [], []
    while True:
        a = spec.expert(env, rng, error_rate)
        if check_action is not None:
            assert check_action(a), a
        r = env.step(a)
        actions.append(a)
        results.append(r)
        if r.terminated or r.truncated:
            return actions, results


def check_registered(name: str, spec, spec_class: type, options: dict, n_train: int,
                     n_eval: int, hops: set[int], bad: tuple[dict, ...] = (),
                     hops_subset: bool = False):
    """`spec` is the registered `name` and makes TextEnvs with a short system prompt; the spec
    made with `options` (seed 1, max_turns 9) has `n_train` / `n_eval` tasks with `hops`
    (a subset of them when `hops_subset`); an unknown option is a TypeError, an unknown split
    a ValueError and each option set in `bad` a ConfigError. Returns the second spec."""
    assert name in ENVS
    assert isinstance(spec, spec_class) and spec.name == name
    env = spec.make()
    assert isinstance(env, TextEnv)
    assert len(env.system_prompt.split()) <= 25
    s2 = ENVS.get(name)(seed=1, max_turns=9, **options)
    assert len(s2.tasks("train")) == n_train and len(s2.tasks("eval")) == n_eval
    assert s2.make().max_turns == 9
    got = {t.meta["hops"] for t in s2.tasks("train")}
    assert (got <= hops) if hops_subset else (got == hops), got
    with pytest.raises(TypeError):
        ENVS.get(name)(seed=0, bogus=1)
    with pytest.raises(ValueError):
        spec.tasks("test")
    for b in bad:
        with pytest.raises(ConfigError):   # a user error: one line and exit code 2 in the CLI
            ENVS.get(name)(seed=0, **b)
    return s2


def task_key(tasks) -> list:
    return [(t.task_id, t.prompt, t.answer, t.meta) for t in tasks]


def check_deterministic(build: Callable[[int], dict], touch: Callable[[], Any]):
    """`build(seed)` gives the same splits for the same seed and others for another seed;
    `touch()` (building more tasks) never uses the global RNG."""
    t1, t2, t3 = build(5), build(5), build(6)
    for split in ("train", "eval"):
        assert task_key(t1[split]) == task_key(t2[split])
        assert task_key(t1[split]) != task_key(t3[split])
    random.seed(0)
    x = random.random()
    random.seed(0)
    touch()
    assert random.random() == x        # the global RNG is never touched


def check_expert_solves(spec, tasks, rng, env=None, clean: bool = True):
    """The perfect expert solves every task: reward 1.0 and success on its last step only (no
    error observation before it when `clean`). Returns (task, actions, results) per task for
    env-specific checks."""
    env = env if env is not None else spec.make()
    episodes = []
    for task in tasks:
        actions, results = run_expert(spec, env, task, rng)
        assert results[-1].terminated and results[-1].reward == 1.0, (task, actions)
        assert results[-1].info["success"] is True
        assert all(r.reward == 0.0 for r in results[:-1])
        if clean:
            assert not any(r.info["error"] for r in results[:-1]), actions
        episodes.append((task, actions, results))
    return episodes


def expert_rewards_by_hops(spec, tasks, rng, error_rate=0.3, each=None) -> dict[int, list]:
    """Final rewards of the imperfect expert, by hops (every episode ends by an answer);
    `each(task, actions, results)` runs on every episode."""
    env = spec.make()
    by_hops = defaultdict(list)
    for task in tasks:
        actions, results = run_expert(spec, env, task, rng, error_rate=error_rate)
        assert results[-1].terminated
        by_hops[task.meta["hops"]].append(results[-1].reward)
        if each is not None:
            each(task, actions, results)
    return by_hops


def check_expert_rate(by_hops: dict[int, list], tol: float, error_rate=0.3):
    """The imperfect expert succeeds about (1 - error_rate)^hops of the time."""
    for h, rs in by_hops.items():
        rate = sum(rs) / len(rs)
        assert abs(rate - (1.0 - error_rate) ** h) < tol, (h, rate)


def random_policy_finals(spec, tasks, rng, action: Callable[[random.Random, Any], str],
                         steps: int = 30) -> list[StepResult]:
    """Up to `steps` random messages per task: every step returns a StepResult with a text
    observation. Returns each episode's last StepResult."""
    env = spec.make()
    finals = []
    for task in tasks:
        env.reset(task)
        for _ in range(steps):
            r = env.step(action(rng, task))
            assert isinstance(r, StepResult) and isinstance(r.observation, str)
            if r.terminated or r.truncated:
                break
        finals.append(r)
    return finals


def check_malformed(spec, action: str, malformed: str):
    """A message that is not exactly one call: the malformed observation, an error, no tool,
    no reward, the episode goes on."""
    env, _ = start_episode(spec)
    r = env.step(action)
    assert r.observation == malformed
    assert r.reward == 0.0 and not r.terminated and not r.truncated
    assert r.info["tool"] is None and r.info["error"] is True


def continue_expert(spec, env, seed, k=20, error_rate=0.3) -> list[tuple]:
    """Up to `k` imperfect-expert steps from `env`'s state: (action, observation, reward,
    terminated, truncated, info) each."""
    rng = random.Random(seed)
    out = []
    for _ in range(k):
        a = spec.expert(env, rng, error_rate)
        r = env.step(a)
        out.append((a, r.observation, r.reward, r.terminated, r.truncated, r.info))
        if r.terminated or r.truncated:
            break
    return out


def check_snapshot_restore(spec, prefix: int, losing: str):
    """After `prefix` expert steps on a 3-hop eval task: two branches from one snapshot in one
    env agree and end; the original and a restored copy in a fresh env (from the pickled
    snapshot) agree; stepping after `snapshot()` leaves the snapshot as it was; after a
    different continuation (`losing`), restore returns to the prefix. Returns (env, other,
    snapshot bytes) for env-specific checks."""
    env = spec.make()
    task = next(t for t in spec.tasks("eval") if t.meta["hops"] == 3)
    env.reset(task)
    rng = random.Random(3)
    for _ in range(prefix):
        env.step(spec.expert(env, rng))
    snap = env.snapshot()
    snap_bytes = pickle.dumps(snap)
    a = continue_expert(spec, env, seed=11)
    env.restore(snap)
    assert continue_expert(spec, env, seed=11) == a and a[-1][3]
    env.restore(snap)
    other = spec.make()
    other.restore(pickle.loads(snap_bytes))
    assert continue_expert(spec, env, seed=5) == continue_expert(spec, other, seed=5)
    assert pickle.dumps(snap) == snap_bytes
    # a different continuation does differ (the comparisons above can fail)
    env.restore(snap)
    r = env.step(losing)
    assert r.terminated and r.reward == 0.0
    env.restore(snap)
    assert env.steps == prefix and not env.terminated and len(env.history) == prefix
    return env, other, snap_bytes


def check_expert_recovers(spec, tasks, rng, prefix_action, may_end: bool = False,
                          check_action=None):
    """The expert picks up from any state: after 0-4 prefix steps (`prefix_action(env, task,
    rng)`, skipped when it returns None), a restored copy of the env is solved by the perfect
    expert. A prefix may end the episode only when `may_end` (such tasks are skipped)."""
    env = spec.make()
    for task in tasks:
        env.reset(task)
        for _ in range(rng.randint(0, 4)):
            a = prefix_action(env, task, rng)
            if a is not None:
                env.step(a)
        if env.done:
            assert may_end, task
            continue
        clone = spec.make()
        clone.restore(env.snapshot())
        _, results = run_expert(spec, clone, None, rng, check_action=check_action)
        assert results[-1].terminated and results[-1].reward == 1.0, task

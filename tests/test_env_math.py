"""The built-in "math" env: problems, calculator, math-verify checking, expert, snapshot/restore."""
from __future__ import annotations

import pickle
import random
import re
import threading
from collections import defaultdict
from fractions import Fraction

import pytest

from agentrl_cli.config import ConfigError

from agentrl_cli.envs import ENVS, StepResult, TextEnv
from agentrl_cli.envs import mathword as M


@pytest.fixture(scope="module")
def spec() -> M.MathSpec:
    return ENVS.get("math")(seed=0)


def run_expert(spec, env, task, rng, error_rate=0.0):
    env.reset(task)
    actions, results = [], []
    while True:
        a = spec.expert(env, rng, error_rate)
        r = env.step(a)
        actions.append(a)
        results.append(r)
        if r.terminated or r.truncated:
            return actions, results


def test_registered_and_protocol(spec):
    assert "math" in ENVS
    assert isinstance(spec, M.MathSpec) and spec.name == "math"
    env = spec.make()
    assert isinstance(env, TextEnv)
    assert len(env.system_prompt.split()) <= 25
    s2 = ENVS.get("math")(seed=1, min_hops=1, max_hops=5, n_train=50, n_eval=10, max_turns=9,
                          n_entities=100, relations="full")   # generic env-config options
    assert len(s2.tasks("train")) == 50 and len(s2.tasks("eval")) == 10
    assert s2.make().max_turns == 9
    assert {t.meta["hops"] for t in s2.tasks("train")} == {1, 2, 3, 4, 5}
    with pytest.raises(TypeError):
        ENVS.get("math")(seed=0, bogus=1)
    with pytest.raises(ValueError):
        spec.tasks("test")
    for bad in ({"max_hops": 6}, {"min_hops": 0}, {"n_train": -1}):
        with pytest.raises(ConfigError):   # a user error: one line and exit code 2 in the CLI
            ENVS.get("math")(seed=0, **bad)


def test_determinism_and_splits(spec):
    build = M._tasks.__wrapped__
    a, b, c = build(5, 2, 3, 100, 30), build(5, 2, 3, 100, 30), build(6, 2, 3, 100, 30)
    key = lambda ts: [(t.task_id, t.prompt, t.answer, t.meta) for t in ts]
    for split in ("train", "eval"):
        assert key(a[split]) == key(b[split]) and key(a[split]) != key(c[split])
    random.seed(0)
    x = random.random()
    random.seed(0)
    build(8, 1, 4, 50, 10)
    assert random.random() == x        # the global RNG is never touched
    train, ev = spec.tasks("train"), spec.tasks("eval")
    assert len(train) == 600 and len(ev) == 200 and spec.tasks("eval", 5) == ev[:5]
    assert not {t.prompt for t in train} & {t.prompt for t in ev}
    assert len({t.prompt for t in train}) == len(train)
    assert ev[7].task_id == "math-eval-00007"


def test_problems_well_formed(spec):
    hops, fractional = set(), 0
    for t in spec.tasks("train") + spec.tasks("eval"):
        m = t.meta
        hops.add(m["hops"])
        assert len(m["ops"]) == m["hops"] and t.prompt.startswith("Problem: ")
        v = None if m["start"] is None else Fraction(m["start"])
        for left, op, right in m["ops"]:
            assert right in t.prompt
            v = M._apply(Fraction(left) if left is not None else v, op, Fraction(right))
        assert Fraction(t.answer) == v and v > 0
        fractional += v.denominator != 1
        assert len(t.prompt.split()) <= 60
    assert hops == {2, 3}
    assert fractional > 0          # some answers are fractions (checked by equivalence)


def test_calculator_exact_and_safe():
    assert M.calculate("3*12-7") == 29
    assert M.calculate("(41/4)*2") == Fraction(41, 2)
    assert M.calculate("0.1+0.2") == Fraction(3, 10)       # exact, no float error
    assert M.calculate(" -2^3 ") == -8 and M.calculate("2**-2") == Fraction(1, 4)
    assert M.calculate("7 × 6 ÷ 3") == 14
    for bad in ("", "x+1", "__import__('os')", "open('f')", "(1).real", "[1]", "1;2", "1,2",
                "9**9**9", "2**100", "10**20", "1/0", "0**-1", "2**0.5", "1" * 81, "1 if 1 else 2",
                "((((((((1", "lambda: 1", "True+1"):
        with pytest.raises(M.CalcError):
            M.calculate(bad)
    assert M.split_binop("(41/4)*2") == (Fraction(41, 4), "*", 2)
    assert M.split_binop("3-2-1") == (1, "-", 1)
    assert M.split_binop("-3") is None and M.split_binop("2**3") is None and M.split_binop("x") is None
    assert [M.format_number(Fraction(*p)) for p in ((36, 1), (41, 4), (1, 3), (-1, 8), (1, 2**6),
                                                    (1, 2**8))] == \
        ["36", "10.25", "1/3", "-0.125", "0.015625", "1/256"]


def test_check_answer_uses_math_verify():
    ok = [("1/2", "0.5"), ("1/2", "1/2"), ("1/2", r"\frac{1}{2}"), ("1/2", r"$\frac{1}{2}$"),
          ("41/4", "10.25"), ("41/4", r"\boxed{41/4}"), ("36", "36.0"), ("36", " 36 "),
          ("1/3", "1/3"), ("220", "$220")]
    for gold, pred in ok:
        assert M.check_answer(pred, gold), (gold, pred)
    bad = [("1/2", "0.4"), ("1/3", "0.33"), ("36", "37"), ("36", "thirty-six"), ("36", ""),
           ("36", "36 pens"), ("36", "2^100"), ("36", "9**9**9"), ("36", "36+0" * 17),
           ("5", "-5")]
    for gold, pred in bad:
        assert not M.check_answer(pred, gold), (gold, pred)
    # math-verify's signal-based timeout would fail off the main thread; ours passes None
    out = []
    th = threading.Thread(target=lambda: out.append(M.check_answer("0.75", "3/4")))
    th.start()
    th.join()
    assert out == [True]


def test_expert_solves_both_splits(spec):
    rng = random.Random(0)
    env = spec.make()
    decimals = 0
    for task in spec.tasks("train") + spec.tasks("eval"):
        actions, results = run_expert(spec, env, task, rng)
        assert results[-1].terminated and results[-1].reward == 1.0, (task, actions)
        assert results[-1].info["success"] is True
        assert all(r.reward == 0.0 and not r.info["error"] for r in results[:-1])
        assert len(actions) == task.meta["hops"] + 1
        assert all(a.startswith("calc(") for a in actions[:-1]) and len(actions[-1]) <= 40
        decimals += "." in actions[-1]
    assert decimals > 0      # answers like 10.25 against a gold of 41/4


def test_imperfect_expert_rate(spec):
    rng = random.Random(1)
    env = spec.make()
    by_hops = defaultdict(list)
    for task in spec.tasks("train"):
        actions, results = run_expert(spec, env, task, rng, error_rate=0.3)
        assert results[-1].terminated
        by_hops[task.meta["hops"]].append(results[-1].reward)
        # slips are reasoning errors: every operand is copied exactly from the problem
        numbers = set(re.findall(r"\d+", task.prompt))
        for a in actions[:-1]:
            left, _, right = M.split_binop(a[len("calc("):-1])
            assert str(right) in numbers, (task.prompt, a)
    for h, rs in by_hops.items():
        assert abs(sum(rs) / len(rs) - 0.7 ** h) < 0.1, (h, sum(rs) / len(rs))


def random_action(rng: random.Random) -> str:
    words = ["calc(", "answer(", ")", "(", "1", "7", "+", "*", "/", "x", " ", "\n", "yes"]
    if rng.random() < 0.5:
        return "".join(rng.choice(words) for _ in range(rng.randint(0, 6)))
    tool = rng.choice(["calc", "answer"])
    expr = "".join(rng.choice("0123456789+-*/().") for _ in range(rng.randint(1, 8)))
    return f"{tool}({expr})"


def test_random_policy_never_crashes(spec):
    rng = random.Random(2)
    env = spec.make()
    total = 0.0
    tasks = spec.tasks("train", 300)
    for task in tasks:
        env.reset(task)
        for _ in range(30):
            r = env.step(random_action(rng))
            assert isinstance(r, StepResult) and isinstance(r.observation, str)
            if r.terminated or r.truncated:
                break
        total += r.reward
    assert total / len(tasks) < 0.05


@pytest.mark.parametrize("action", [
    "", "hello", "calc", "calc(1", "Calc(1)", "look(1)", "calc(1) calc(2)", "answer(5) answer(6)",
    "calc(1)\nanswer(1)", "answer(1) and more", "calc(1))",
])
def test_malformed_actions(spec, action):
    env = spec.make()
    env.reset(spec.tasks("eval")[0])
    r = env.step(action)
    assert r.observation == M.MALFORMED
    assert r.reward == 0.0 and not r.terminated and not r.truncated
    assert r.info["tool"] is None and r.info["error"] is True


def test_tools_and_truncation():
    spec = ENVS.get("math")(seed=0, max_turns=3)
    env = spec.make()
    task = spec.tasks("eval")[0]
    env.reset(task)
    r = env.step("calc((2+3)*4)")
    assert r.observation == "20" and r.info == {"tool": "calc", "error": False, "steps": 1}
    r = env.step("calc(1/0)")
    assert r.observation == "error: division by zero" and r.info["error"] and not r.truncated
    r = env.step("calc(1)")
    assert r.truncated and not r.terminated and r.info["success"] is False
    assert env.step("calc(1)").info["error"]              # after the end: no crash, no reward
    env.reset(task)
    r = env.step(f"answer({task.answer})")
    assert r.terminated and r.reward == 1.0 and r.observation == ""
    env.reset(task)
    r = env.step(f"answer({Fraction(task.answer) + 1})")
    assert r.terminated and r.reward == 0.0 and r.info["success"] is False


def _continue(spec, env, seed, k=20, error_rate=0.3):
    rng = random.Random(seed)
    out = []
    for _ in range(k):
        a = spec.expert(env, rng, error_rate)
        r = env.step(a)
        out.append((a, r.observation, r.reward, r.terminated, r.truncated))
        if r.terminated or r.truncated:
            break
    return out


def test_snapshot_restore(spec):
    env = spec.make()
    task = next(t for t in spec.tasks("eval") if t.meta["hops"] == 3)
    env.reset(task)
    rng = random.Random(3)
    for _ in range(2):
        env.step(spec.expert(env, rng))
    snap = env.snapshot()
    snap_bytes = pickle.dumps(snap)
    a = _continue(spec, env, seed=11)
    env.restore(snap)
    assert _continue(spec, env, seed=11) == a and a[-1][3]
    env.restore(snap)
    other = spec.make()
    other.restore(pickle.loads(snap_bytes))
    assert _continue(spec, env, seed=5) == _continue(spec, other, seed=5)
    assert pickle.dumps(snap) == snap_bytes
    env.restore(snap)
    env.step("answer(-1)")
    env.restore(snap)
    assert env.steps == 2 and not env.terminated and len(env.history) == 2


def test_expert_valid_after_policy_steps(spec):
    rng = random.Random(4)
    spec20 = ENVS.get("math")(seed=0, max_turns=20)
    env = spec20.make()
    for task in spec20.tasks("eval", 100):
        env.reset(task)
        for _ in range(rng.randint(0, 4)):
            env.step(random_action(rng) if rng.random() < 0.5 else spec20.expert(env, rng, 0.5))
        if env.done:
            continue
        clone = spec20.make()
        clone.restore(env.snapshot())
        _, results = _finish(spec20, clone, rng)
        assert results[-1].terminated and results[-1].reward == 1.0, task


def _finish(spec, env, rng):
    actions, results = [], []
    while True:
        a = spec.expert(env, rng, 0.0)
        r = env.step(a)
        actions.append(a)
        results.append(r)
        if r.terminated or r.truncated:
            return actions, results

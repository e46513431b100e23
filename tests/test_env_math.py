"""The built-in "math" env: problems, calculator, math-verify checking, expert, snapshot/restore."""
from __future__ import annotations

import random
import re
import threading
from fractions import Fraction

import pytest

from agentrl_cli.envs import ENVS
from agentrl_cli.envs import mathword as M

from env_checks import (check_deterministic, check_expert_rate, check_expert_recovers,
                        check_expert_solves, check_malformed, check_registered,
                        check_snapshot_restore, expert_rewards_by_hops, random_policy_finals,
                        spec_fixture, start_episode)

spec = spec_fixture("math")


def test_registered_and_protocol(spec):
    check_registered("math", spec, M.MathSpec,
                     {"min_hops": 1, "max_hops": 5, "n_train": 50, "n_eval": 10,
                      "n_entities": 100, "relations": "full"},   # generic env-config options
                     n_train=50, n_eval=10, hops={1, 2, 3, 4, 5},
                     bad=({"max_hops": 6}, {"min_hops": 0}, {"n_train": -1}))


def test_determinism_and_splits(spec):
    build = M._tasks.__wrapped__
    check_deterministic(lambda seed: build(seed, 2, 3, 100, 30), lambda: build(8, 1, 4, 50, 10))
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
    decimals = 0
    tasks = spec.tasks("train") + spec.tasks("eval")
    for task, actions, _ in check_expert_solves(spec, tasks, random.Random(0)):
        assert len(actions) == task.meta["hops"] + 1
        assert all(a.startswith("calc(") for a in actions[:-1]) and len(actions[-1]) <= 40
        decimals += "." in actions[-1]
    assert decimals > 0      # answers like 10.25 against a gold of 41/4


def test_imperfect_expert_rate(spec):
    def copied_exactly(task, actions, results):
        # slips are reasoning errors: every operand is copied exactly from the problem
        numbers = set(re.findall(r"\d+", task.prompt))
        for a in actions[:-1]:
            left, _, right = M.split_binop(a[len("calc("):-1])
            assert str(right) in numbers, (task.prompt, a)

    by_hops = expert_rewards_by_hops(spec, spec.tasks("train"), random.Random(1),
                                     each=copied_exactly)
    check_expert_rate(by_hops, tol=0.1)


def random_action(rng: random.Random, task=None) -> str:
    words = ["calc(", "answer(", ")", "(", "1", "7", "+", "*", "/", "x", " ", "\n", "yes"]
    if rng.random() < 0.5:
        return "".join(rng.choice(words) for _ in range(rng.randint(0, 6)))
    tool = rng.choice(["calc", "answer"])
    expr = "".join(rng.choice("0123456789+-*/().") for _ in range(rng.randint(1, 8)))
    return f"{tool}({expr})"


def test_random_policy_never_crashes(spec):
    finals = random_policy_finals(spec, spec.tasks("train", 300), random.Random(2), random_action)
    assert sum(r.reward for r in finals) / len(finals) < 0.05


@pytest.mark.parametrize("action", [
    "", "hello", "calc", "calc(1", "Calc(1)", "look(1)", "calc(1) calc(2)", "answer(5) answer(6)",
    "calc(1)\nanswer(1)", "answer(1) and more", "calc(1))",
])
def test_malformed_actions(spec, action):
    check_malformed(spec, action, M.MALFORMED)


def test_tools_and_truncation():
    spec = ENVS.get("math")(seed=0, max_turns=3)
    env, task = start_episode(spec)
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


def test_snapshot_restore(spec):
    check_snapshot_restore(spec, prefix=2, losing="answer(-1)")


def test_expert_valid_after_policy_steps():
    def prefix(env, task, rng):
        return random_action(rng) if rng.random() < 0.5 else spec20.expert(env, rng, 0.5)

    spec20 = ENVS.get("math")(seed=0, max_turns=20)
    check_expert_recovers(spec20, spec20.tasks("eval", 100), random.Random(4), prefix,
                          may_end=True)

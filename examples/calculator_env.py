"""A complete multi-turn tool env in one file: arithmetic with a calculator tool.

Each task is a short chain of operations, e.g. `Compute ((14 * 3) + 9) - 5.` The agent calls
the calculator, one operation per message, reads the result, and answers:

    calc(14 * 3)   -> 42
    calc(42 + 9)   -> 51
    calc(51 - 5)   -> 46
    answer(46)     -> the episode ends; reward 1.0 if 46 is the gold answer, else 0.0

A malformed message gets an error observation (never an exception); `max_turns` messages
without an answer truncate the episode with reward 0.

Use it with any command that takes an env, and check it:

    agentrl check-env examples/calculator_env.py:make
    agentrl rollout --env examples/calculator_env.py:make --model PATH --n 4
    agentrl train --method grpo --env examples/calculator_env.py:make --model PATH \\
        --set env.max_operand=9 --set env.n_ops=1

It has no scripted expert, so `--model tiny` (whose warm-up imitates one) is refused: give a
model folder with `--model PATH`. See docs/your-env.md for the protocol.
"""
from __future__ import annotations

import random
import re

from agentrl_cli.envs import StepResult, Task

SYSTEM_PROMPT = ("Compute the expression with the calculator, one call per message: "
                 "calc(A op B) with op one of + - *, then answer(NUMBER).")
CALL = re.compile(r"^\s*(calc|answer)\((.*)\)\s*\.?\s*$", re.S)
OPERATION = re.compile(r"^\s*(-?\d{1,12})\s*([-+*])\s*(-?\d{1,12})\s*$")


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


class CalculatorEnv:
    """One episode at a time. The TextEnv protocol: system_prompt, reset, step, snapshot,
    restore; its whole state is four plain values, so a snapshot is a tuple."""

    system_prompt = SYSTEM_PROMPT

    def __init__(self, max_turns: int = 6):
        self.max_turns = max_turns
        self.task: Task | None = None
        self.turns, self.done, self.calls = 0, False, 0

    def reset(self, task: Task) -> str:
        self.task, self.turns, self.done, self.calls = task, 0, False, 0
        return task.prompt

    def step(self, action: str) -> StepResult:
        if self.task is None or self.done:
            return StepResult("error: the episode is over", 0.0, False, False,
                              {"tool": None, "error": True})
        self.turns += 1
        m = CALL.match(action if isinstance(action, str) else "")
        if m and m.group(1) == "answer":
            guess = m.group(2).strip()
            ok = guess == self.task.answer
            self.done = True
            return StepResult("", 1.0 if ok else 0.0, True, False,
                              {"tool": "answer", "error": False, "success": ok, "answer": guess})
        if m and OPERATION.match(m.group(2)):
            a, op, b = OPERATION.match(m.group(2)).groups()
            obs, info = str(_apply(int(a), op, int(b))), {"tool": "calc", "error": False}
            self.calls += 1
        else:
            obs, info = "error: use calc(A op B) or answer(NUMBER)", {"tool": None, "error": True}
        if self.turns >= self.max_turns:   # the step limit: truncated, reward 0
            self.done = True
            return StepResult("", 0.0, False, True, {**info, "success": False})
        return StepResult(obs, 0.0, False, False, info)

    def snapshot(self):
        return (self.task, self.turns, self.done, self.calls)

    def restore(self, state) -> None:
        self.task, self.turns, self.done, self.calls = state


class CalculatorSpec:
    """Tasks from the seed alone (`random.Random(seed)`, never the global RNG): the same seed
    gives the same tasks on every machine. Train and eval tasks are disjoint expressions."""

    name = "calculator"

    def __init__(self, seed: int = 0, n_train: int = 200, n_eval: int = 50, n_ops: int = 2,
                 max_operand: int = 20, max_turns: int = 6):
        if n_ops < 1 or max_operand < 1:
            raise ValueError("n_ops and max_operand must be at least 1")
        self.max_turns = max_turns
        rng, seen = random.Random(seed), set()
        tasks: list[Task] = []
        while len(tasks) < n_train + n_eval:
            value = rng.randint(1, max_operand)
            expr = str(value)
            for _ in range(n_ops):
                op, b = rng.choice("+-*"), rng.randint(1, max_operand)
                expr, value = f"({expr} {op} {b})", _apply(value, op, b)
            expr = expr[1:-1]                     # no parentheses around the whole
            if expr in seen:
                if len(seen) > 50 * (n_train + n_eval):
                    raise ValueError("too few distinct expressions: raise max_operand or n_ops")
                continue
            seen.add(expr)
            split = "train" if len(tasks) < n_train else "eval"
            tasks.append(Task(f"{split}-{len(tasks):05d}", f"Compute {expr}.", str(value),
                              {"ops": n_ops}))
        self._tasks = {"train": tasks[:n_train], "eval": tasks[n_train:]}

    def make(self) -> CalculatorEnv:
        return CalculatorEnv(self.max_turns)

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        if split not in self._tasks:
            raise ValueError(f"unknown split '{split}'; valid: train, eval")
        out = self._tasks[split]
        return list(out if n is None else out[:n])


def make(seed: int = 0, n_train: int = 200, n_eval: int = 50, n_ops: int = 2,
         max_operand: int = 20, max_turns: int = 6) -> CalculatorSpec:
    """The factory agentrl calls: `--env examples/calculator_env.py:make`. Its keyword
    parameters are the env's options (`--set env.n_ops=1`); only those the user sets are
    passed, so these defaults hold otherwise."""
    return CalculatorSpec(seed, n_train, n_eval, n_ops, max_operand, max_turns)

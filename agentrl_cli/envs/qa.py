"""The `qa` adapter: a benchmark of questions with short verifiable answers, read from data files.

Used by benchmarks.yaml entries with `adapter: qa` (MATH levels 4-5, DeonticBench). The episode
is the question; the policy may think over several messages and ends the episode with a final
answer, written as `answer(TEXT)` at the end of a message or as the last `\\boxed{TEXT}` in it.
A message without one gets a reminder observation; `max_turns` messages without an answer
truncate the episode. The reward is 1.0 when the benchmark's verifier accepts the answer:
  math    math-verify equivalence (`\\frac{1}{2}`, `0.5`, `1/2` agree)
  number  numeric equality after removing `$`, `,` and `%` (relative tolerance 1e-6)
  exact   case-, space- and end-punctuation-insensitive string equality
"""
from __future__ import annotations

import random
import string
from typing import Any

from ..errors import ConfigError
from .base import StepResult, Task
from .mathword import _math_verify

__all__ = ["QAEnv", "QASpec", "VERIFIERS", "extract_answer", "extract_boxed", "verify"]

SYSTEM_PROMPT = ("Solve the problem. You may reason over several messages. End your final "
                 "message with answer(YOUR FINAL ANSWER) or \\boxed{YOUR FINAL ANSWER}.")
REMINDER = "No final answer yet: end a message with answer(...) or \\boxed{...}."
VERIFIERS = ("math", "number", "exact")
MAX_MATH_ANSWER_CHARS = 200


def extract_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (nested braces allowed), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None


def extract_answer(message: str) -> str | None:
    """The final answer of a message: an `answer(...)` call closing it (a final "." allowed),
    else its last `\\boxed{}`; None when it has neither."""
    if not isinstance(message, str):
        return None
    s = message.strip().rstrip(".").rstrip()
    k = s.rfind("answer(")
    if s.endswith(")") and k >= 0 and (k == 0 or not (s[k - 1].isalnum() or s[k - 1] == "_")):
        arg = s[k + len("answer("):-1].strip()
        if len(arg) >= 2 and arg[0] == arg[-1] and arg[0] in "\"'":
            arg = arg[1:-1].strip()
        return arg
    return extract_boxed(message)


def _norm(text: str) -> str:
    return " ".join(text.lower().split()).strip(string.punctuation + string.whitespace)


def _number(text: str) -> float | None:
    t = text.strip().replace(",", "").replace("$", "").replace("%", "").strip()
    try:
        return float(t)
    except ValueError:
        return None


def verify(pred: str, gold: str, kind: str) -> bool:
    """True when `pred` is the gold answer under verifier `kind` (see the module docstring)."""
    if kind == "exact":
        return _norm(pred) == _norm(gold) and _norm(gold) != ""
    if kind == "number":
        a, b = _number(pred), _number(gold)
        return a is not None and b is not None and abs(a - b) <= 1e-6 * max(1.0, abs(b))
    if kind == "math":
        if len(pred) > MAX_MATH_ANSWER_CHARS:   # math-verify runs without a timeout here
            return False
        mv = _math_verify()
        try:
            g = mv.parse(f"${gold}$", parsing_timeout=None)
            p = mv.parse(f"${pred}$", parsing_timeout=None)
            return bool(g) and bool(mv.verify(g, p, timeout_seconds=None))
        except Exception:  # noqa: BLE001  (an unparsable answer is a wrong answer)
            return False
    raise ValueError(f"unknown verifier '{kind}'; valid: {', '.join(VERIFIERS)}")


class QAEnv:
    """One question per episode. Implements the TextEnv protocol."""

    system_prompt = SYSTEM_PROMPT

    def __init__(self, verifier: str, max_turns: int = 8):
        if verifier not in VERIFIERS:
            raise ValueError(f"unknown verifier '{verifier}'; valid: {', '.join(VERIFIERS)}")
        self.verifier, self.max_turns = verifier, max_turns
        self.task: Task | None = None
        self.steps, self.terminated, self.truncated = 0, False, False

    def reset(self, task: Task) -> str:
        self.task, self.steps, self.terminated, self.truncated = task, 0, False, False
        return task.prompt

    def step(self, action: str) -> StepResult:
        if self.task is None or self.terminated or self.truncated:
            return StepResult("error: the episode is over", 0.0, self.terminated, self.truncated,
                              {"tool": None, "error": True, "success": False})
        self.steps += 1
        pred = extract_answer(action)
        if pred is not None:
            ok = verify(pred, self.task.answer, self.verifier)
            self.terminated = True
            return StepResult("", 1.0 if ok else 0.0, True, False,
                              {"tool": "answer", "error": False, "success": ok, "answer": pred})
        self.truncated = self.steps >= self.max_turns
        info: dict[str, Any] = {"tool": None, "error": False}
        if self.truncated:
            info["success"] = False
        return StepResult(REMINDER, 0.0, False, self.truncated, info)

    def snapshot(self) -> Any:
        return (self.task, self.steps, self.terminated, self.truncated)   # a frozen task, scalars

    def restore(self, state: Any) -> None:
        self.task, self.steps, self.terminated, self.truncated = state


class QASpec:
    """Tasks per split (already loaded) and an expert that answers with the gold answer."""

    def __init__(self, name: str, tasks: dict[str, list[Task]], verifier: str, max_turns: int = 8):
        self.name, self._tasks, self.verifier, self.max_turns = name, tasks, verifier, max_turns

    def make(self) -> QAEnv:
        return QAEnv(self.verifier, self.max_turns)

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        if split not in self._tasks:
            raise ConfigError(f"unknown split '{split}'; valid: {', '.join(self._tasks)}")
        out = self._tasks[split]
        return list(out if n is None else out[:n])

    def expert(self, env: QAEnv, rng: random.Random, error_rate: float = 0.0) -> str:
        """`answer(<gold>)`; with probability `error_rate` a message without an answer first."""
        if error_rate > 0 and rng.random() < error_rate and env.steps + 1 < env.max_turns:
            return "Let me check the question again."
        return f"answer({env.task.answer})"

"""Tool-call syntax of the `locate`, `rules` and `math` envs: one call per assistant message.

A message is `tool(argument)`, nothing before or after it. The argument may hold balanced
parentheses (`calc((3+4)*2)`) but no newline; a closing parenthesis without its opening one
(`calc(1) calc(2)`, `answer(5) answer(6)`) makes the message malformed, which is how two calls
in one message are caught. One pair of surrounding quotes is removed from the argument.
"""
from __future__ import annotations

import copy
import re
from typing import Any

from .base import StepResult, Task

__all__ = ["CallEnv", "parse_call"]

_CALL = re.compile(r"^([a-z_]+)\((.*)\)$", re.DOTALL)


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def parse_call(action: str, tools: tuple[str, ...]) -> tuple[str, str] | None:
    """`(tool, argument)` when `action` is exactly one call of one of `tools`, else None."""
    if not isinstance(action, str):
        return None
    m = _CALL.match(action.strip())
    if m is None or m.group(1) not in tools:
        return None
    arg = m.group(2).strip()
    if "\n" in arg or not _balanced(arg):
        return None
    if len(arg) >= 2 and arg[0] == arg[-1] and arg[0] in "\"'":
        arg = arg[1:-1].strip()
    return m.group(1), arg


class CallEnv:
    """The episode bookkeeping shared by the one-call-per-message envs (`rules`, `math`):
    turn counting, truncation at `max_turns`, the step envelope (`info` with tool, error,
    steps, success), the history and snapshot/restore. Implements the TextEnv protocol.

    A subclass sets `system_prompt`, `tools` (the last one is `answer`), `malformed` (the
    observation for a message that is not one call) and implements `_tool(tool, arg) ->
    (observation, error)` for the other tools and `_check(arg) -> bool` for the answer.
    State derived from the task (e.g. a parsed rulebook) is rebuilt in `_load()`.
    """

    system_prompt: str
    tools: tuple[str, ...]
    malformed: str

    def __init__(self, max_turns: int = 12):
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.max_turns = max_turns
        self.task: Task | None = None
        self.history: list[dict] = []   # {"action","tool","arg","observation","error"} per step
        self.steps = 0
        self.terminated = False
        self.truncated = False
        self._load()

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    def _load(self) -> None:
        """Rebuild task-derived state after `reset` / `restore` (none by default)."""

    def _tool(self, tool: str, arg: str) -> tuple[str, bool]:
        raise NotImplementedError

    def _check(self, arg: str) -> bool:
        raise NotImplementedError

    def reset(self, task: Task) -> str:
        self.task = task
        self._load()
        self.history = []
        self.steps = 0
        self.terminated = False
        self.truncated = False
        return task.prompt

    def step(self, action: str) -> StepResult:
        if self.task is None or self.done:
            why = "call reset() first" if self.task is None else "the episode is over"
            return StepResult(f"error: {why}", 0.0, self.terminated, self.truncated,
                              {"tool": None, "error": True, "success": False})
        self.steps += 1
        parsed = parse_call(action, self.tools)
        tool, arg = parsed if parsed is not None else (None, "")
        reward, terminated, error = 0.0, False, False
        info: dict[str, Any] = {"tool": tool}
        if tool is None:
            obs, error = self.malformed, True
        elif tool == "answer":
            success = self._check(arg)
            obs, reward, terminated = "", (1.0 if success else 0.0), True
            info["success"] = success
        else:
            obs, error = self._tool(tool, arg)
        truncated = not terminated and self.steps >= self.max_turns
        if truncated:
            info["success"] = False
        info["error"] = error
        info["steps"] = self.steps
        self.terminated, self.truncated = terminated, truncated
        self.history.append({"action": action, "tool": tool, "arg": arg,
                             "observation": obs, "error": error})
        return StepResult(obs, reward, terminated, truncated, info)

    def snapshot(self) -> Any:
        return copy.deepcopy({"task": self.task, "history": self.history, "steps": self.steps,
                              "terminated": self.terminated, "truncated": self.truncated,
                              "max_turns": self.max_turns})

    def restore(self, state: Any) -> None:
        s = copy.deepcopy(state)
        self.task, self.history, self.steps = s["task"], s["history"], s["steps"]
        self.terminated, self.truncated = s["terminated"], s["truncated"]
        self.max_turns = s["max_turns"]
        self._load()

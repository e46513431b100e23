"""Tool-call syntax of the `locate`, `rules` and `math` envs: one call per assistant message.

A message is `tool(argument)`, nothing before or after it. The argument may hold balanced
parentheses (`calc((3+4)*2)`) but no newline; a closing parenthesis without its opening one
(`calc(1) calc(2)`, `answer(5) answer(6)`) makes the message malformed, which is how two calls
in one message are caught. One pair of surrounding quotes is removed from the argument.

Also the bases the built-in envs share: `CallEnv` (episode bookkeeping of `search`, `locate`,
`rules` and `math`; `search` keeps its own stricter syntax, `parse_action`) and `CallSpec`
(options and tasks of `rules` and `math`).
"""
from __future__ import annotations

import re
from typing import Any, Callable

from ..errors import ConfigError
from .base import StepResult, Task

__all__ = ["CallEnv", "CallSpec", "check_call_cost", "parse_call"]

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


def check_call_cost(call_cost: float) -> float:
    """`env.call_cost` as a float in [0, 1); anything else is a ConfigError."""
    cost = float(call_cost)
    if not 0.0 <= cost < 1.0:
        raise ConfigError(f"env.call_cost must be in [0, 1), got {call_cost}")
    return cost


class CallEnv:
    """The episode bookkeeping shared by the one-call-per-message envs (`search`, `locate`,
    `rules`, `math`): turn counting, truncation at `max_turns`, the step envelope (`info` with
    tool, error, steps, success), the history and snapshot/restore. Implements the TextEnv
    protocol.

    A subclass sets `system_prompt`, `tools` (the last one is `answer`), `malformed` (the
    observation for a message that is not one call) and implements `_tool(tool, arg) ->
    (observation, error)` for the other tools and `_check(arg) -> bool` for the answer.
    State derived from the task (e.g. a parsed rulebook) is rebuilt in `_load()`. Optional
    hooks: `_parse` (another call syntax than `parse_call`), `_answer` (more `info` keys for
    an answer than `success`; the reward is 1.0 on success, else 0.0), `failed_info` (what a
    truncated episode's `info` gets) and `_record` (more keys in a history entry).

    `call_cost` (the env option `env.call_cost`, default 0) lowers a correct answer's reward by
    that much per message before it (tool calls and malformed messages), floored at 0: a reason
    to answer early. A wrong answer earns 0 either way; success is unchanged.
    """

    system_prompt: str
    tools: tuple[str, ...]
    malformed: str
    failed_info: dict[str, Any] = {"success": False}

    def __init__(self, max_turns: int = 12, call_cost: float = 0.0):
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.max_turns = max_turns
        self.call_cost = check_call_cost(call_cost)
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

    def _parse(self, action: str) -> tuple[str, str] | None:
        return parse_call(action, self.tools)

    def _tool(self, tool: str, arg: str) -> tuple[str, bool]:
        raise NotImplementedError

    def _check(self, arg: str) -> bool:
        raise NotImplementedError

    def _answer(self, arg: str) -> dict[str, Any]:
        """The `info` keys of an answer; `success` decides the reward."""
        return {"success": self._check(arg)}

    def _reward(self, success: bool) -> float:
        """1 for a correct answer less `call_cost` per message before it (at least 0), else 0."""
        if not success:
            return 0.0
        return max(0.0, 1.0 - self.call_cost * (self.steps - 1))

    def _record(self, action: str, tool: str | None, arg: str, obs: str,
                error: bool) -> dict[str, Any]:
        """The history entry of one step."""
        return {"action": action, "tool": tool, "arg": arg, "observation": obs, "error": error}

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
        parsed = self._parse(action)
        tool, arg = parsed if parsed is not None else (None, "")
        reward, terminated, error = 0.0, False, False
        info: dict[str, Any] = {"tool": tool}
        if tool is None:
            obs, error = self.malformed, True
        elif tool == "answer":
            info.update(self._answer(arg))
            info.setdefault("answer", arg)          # the model's answer, as the env read it
            obs, reward, terminated = "", self._reward(info["success"]), True
        else:
            obs, error = self._tool(tool, arg)
        truncated = not terminated and self.steps >= self.max_turns
        if truncated:
            info.update(self.failed_info)
        info["error"] = error
        info["steps"] = self.steps
        self.terminated, self.truncated = terminated, truncated
        self.history.append(self._record(action, tool, arg, obs, error))
        return StepResult(obs, reward, terminated, truncated, info)

    def snapshot(self) -> Any:
        """The state as an independent copy: each history entry copied (its values are strings,
        numbers and None), the task shared (a frozen `Task` the env never changes). A FOCUS
        rollout snapshots every segment-boundary state, and `copy.deepcopy` of the history
        cost it a tenth of its CPU time."""
        return {"task": self.task, "history": [dict(h) for h in self.history],
                "steps": self.steps, "terminated": self.terminated, "truncated": self.truncated,
                "max_turns": self.max_turns}

    def restore(self, state: Any) -> None:
        s = state
        self.task, self.history, self.steps = s["task"], [dict(h) for h in s["history"]], s["steps"]
        self.terminated, self.truncated = s["terminated"], s["truncated"]
        self.max_turns = s["max_turns"]
        self._load()


class CallSpec:
    """The spec shared by the generated-task envs `rules` and `math`: option checks (bad ones
    are ConfigErrors), `make` and deterministic `tasks`. A subclass sets `name`, `env_class`,
    `hops_limit` (the largest max_hops) and `build` (`(seed, min_hops, max_hops, n_train,
    n_eval) -> {"train": tasks, "eval": tasks}`), and implements `expert`."""

    name: str
    env_class: type[CallEnv]
    hops_limit: int
    build: Callable[[int, int, int, int, int], dict[str, tuple[Task, ...]]]

    def __init__(self, seed: int = 0, min_hops: int = 2, max_hops: int = 3, n_train: int = 600,
                 n_eval: int = 200, max_turns: int = 12, call_cost: float = 0.0):
        if not 1 <= min_hops <= max_hops:
            raise ConfigError(f"{self.name}: need 1 <= env.min_hops <= env.max_hops, "
                              f"got {min_hops}..{max_hops}")
        if max_hops > self.hops_limit:
            raise ConfigError(f"{self.name}: env.max_hops must be at most {self.hops_limit}, "
                              f"got {max_hops}")
        if n_train < 0 or n_eval < 0:
            raise ConfigError(f"{self.name}: env.n_train and env.n_eval must be non-negative")
        self.seed, self.min_hops, self.max_hops = int(seed), int(min_hops), int(max_hops)
        self.n_train, self.n_eval, self.max_turns = int(n_train), int(n_eval), int(max_turns)
        self.call_cost = check_call_cost(call_cost)

    def make(self) -> CallEnv:
        return self.env_class(self.max_turns, self.call_cost)

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        if split not in ("train", "eval"):
            raise ConfigError(f"unknown split '{split}'; valid: train, eval")
        all_tasks = self.build(self.seed, self.min_hops, self.max_hops, self.n_train,
                               self.n_eval)[split]
        return list(all_tasks if n is None else all_tasks[:n])

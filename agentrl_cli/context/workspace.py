"""The workspace: `put`/`get`/`scan`/`delete` tools over an in-memory store, added to any env.

Syntax, the inner env's `tool(argument)` (one call per message, nothing around it):
  put(KEY, VALUE)   -> `stored KEY` (overwrites; KEY up to the first comma)
  get(KEY)          -> the value, or `error: no entry KEY`
  scan(PREFIX)      -> `KEY1, KEY2, ...` of the keys starting with PREFIX (`scan()`: all), or
                       `no entries`
  delete(KEY)       -> `deleted KEY`, or `error: no entry KEY`
Keys are stripped (one pair of surrounding quotes removed) and non-empty, without newlines;
values are stripped and at most `MAX_VALUE` characters; at most `MAX_KEYS` keys. Every other
message goes to the inner env. A workspace call is a tool call and a turn: it counts towards
the inner env's `max_turns` (the wrapper truncates when workspace and inner turns together
reach it). `snapshot`/`restore` include the store.
"""
from __future__ import annotations

import copy
import re
from typing import Any

from ..envs.base import StepResult
from .envs import ContextEnv

TOOLS = ("put", "get", "scan", "delete")
MAX_KEYS = 64
MAX_VALUE = 400
SYNTAX = ("Workspace (kept when old turns are removed from your context): put(key, value), "
          "get(key), scan(prefix), delete(key).")
_CALL = re.compile(r"^(put|get|scan|delete)\((.*)\)$", re.DOTALL)


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return text


def parse_workspace_call(action: str) -> tuple[str, str, str] | None:
    """`(tool, key_or_prefix, value)` for a workspace call, else None (not one: the inner env's)."""
    if not isinstance(action, str):
        return None
    m = _CALL.match(action.strip())
    if m is None:
        return None
    tool, arg = m.group(1), m.group(2)
    if tool == "put":
        key, sep, value = arg.partition(",")
        return tool, _unquote(key), _unquote(value) if sep else ""
    return tool, _unquote(arg), ""


class WorkspaceEnv(ContextEnv):
    """The inner env plus the workspace tools (module docstring)."""

    def __init__(self, inner, operator):
        super().__init__(inner, operator)
        self.store: dict[str, str] = {}
        self.steps = 0            # all turns: workspace calls and the inner env's
        self.max_turns = getattr(inner, "max_turns", None)

    @property
    def system_prompt(self) -> str:
        return f"{self.inner.system_prompt} {SYNTAX}"

    def reset(self, task) -> str:
        self.store, self.steps = {}, 0
        return self.inner.reset(task)

    def _limit(self, res: StepResult) -> StepResult:
        if not (res.terminated or res.truncated) and self.max_turns and self.steps >= self.max_turns:
            res.truncated = True
            res.info["success"] = False
        return res

    def step(self, action: str) -> StepResult:
        self.steps += 1
        call = parse_workspace_call(action)
        if call is None:
            return self._limit(self.inner.step(action))
        tool, key, value = call
        obs, error = self._apply(tool, key, value)
        return self._limit(StepResult(obs, 0.0, False, False,
                                      {"tool": tool, "error": error, "steps": self.steps}))

    def _apply(self, tool: str, key: str, value: str) -> tuple[str, bool]:
        if tool == "scan":
            keys = sorted(k for k in self.store if k.startswith(key))
            return (", ".join(keys) if keys else "no entries"), False
        if not key or "\n" in key:
            return f"error: {tool} needs a key", True
        if tool == "put":
            if not value:
                return "error: put(key, value) needs a value", True
            if len(value) > MAX_VALUE:
                return f"error: value longer than {MAX_VALUE} characters", True
            if key not in self.store and len(self.store) >= MAX_KEYS:
                return f"error: the workspace holds at most {MAX_KEYS} keys", True
            self.store[key] = value
            return f"stored {key}", False
        if key not in self.store:
            return f"error: no entry {key}", True
        if tool == "get":
            return self.store[key], False
        del self.store[key]
        return f"deleted {key}", False

    def snapshot(self) -> Any:
        return {"inner": self.inner.snapshot(), "store": copy.deepcopy(self.store),
                "steps": self.steps}

    def restore(self, state: Any) -> None:
        self.inner.restore(state["inner"])
        self.store, self.steps = copy.deepcopy(state["store"]), state["steps"]

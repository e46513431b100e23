"""Tool-call syntax of the `locate`, `rules` and `math` envs: one call per assistant message.

A message is `tool(argument)`, nothing before or after it. The argument may hold balanced
parentheses (`calc((3+4)*2)`) but no newline; a closing parenthesis without its opening one
(`calc(1) calc(2)`, `answer(5) answer(6)`) makes the message malformed, which is how two calls
in one message are caught. One pair of surrounding quotes is removed from the argument.
"""
from __future__ import annotations

import re

__all__ = ["parse_call"]

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

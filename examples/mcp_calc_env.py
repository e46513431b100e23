"""An env whose tools come from an MCP server (examples/mcp_calc_server.py, over stdio): the
tasks and the reward are this file's; the tools are whatever the server lists.

    agentrl check-env examples/mcp_calc_env.py:make
    agentrl train --env examples/mcp_calc_env.py:make --model PATH --steps 2
    agentrl train --env examples/mcp_calc_env.py:make --model PATH --set model.tool_format=hermes

An episode: `multiply({"a": 6, "b": 7})` -> 42, `add({"a": 42, "b": 5})` -> 47, `answer(47)`
-> reward 1. The server's tools are pure functions, so the spec says `stateless=True` and
FOCUS may fork its episodes.
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

from agentrl_cli.envs import Task
from agentrl_cli.envs.mcp_env import MCPSpec

SERVER = [sys.executable, str(Path(__file__).with_name("mcp_calc_server.py"))]


def _tasks(seed: int, split: str, n: int, max_operand: int) -> list[Task]:
    rng = random.Random(f"{seed}-{split}")
    out = []
    for i in range(n):
        a, b, c = (rng.randint(2, max_operand) for _ in range(3))
        out.append(Task(f"{split}-{i:04d}", f"Compute {a} * {b} + {c}.", str(a * b + c)))
    return out


def reward(task: Task, answer: str) -> float:
    try:
        return float(float(answer.strip()) == float(task.answer))
    except ValueError:
        return 0.0


def make(seed: int = 0, n_train: int = 100, n_eval: int = 20, max_operand: int = 12,
         max_turns: int = 6):
    return MCPSpec(SERVER, tasks={"train": _tasks(seed, "train", n_train, max_operand),
                                  "eval": _tasks(seed, "eval", n_eval, max_operand)},
                   reward=reward, name="mcp-calc", max_turns=max_turns, stateless=True)

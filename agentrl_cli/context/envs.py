"""Env and spec wrappers that carry a context operator to wherever episodes are run.

`ContextSpec` wraps any `EnvSpec`: its envs are the inner env wrapped by the operator
(`operator.make_env`), each exposing `context_operator`, which the rollout runner reads after
every turn. Tasks, the expert and every other attribute come from the inner spec, so
evaluation, `agentrl rollout`, the trainer and every controller use the operator without
knowing about it.
"""
from __future__ import annotations

from typing import Any


class ContextEnv:
    """The inner env unchanged, plus `context_operator` (compaction needs nothing else)."""

    def __init__(self, inner, operator):
        self.inner = inner
        self.context_operator = operator

    @property
    def system_prompt(self) -> str:
        return self.inner.system_prompt

    def reset(self, task) -> str:
        return self.inner.reset(task)

    def step(self, action: str):
        return self.inner.step(action)

    def snapshot(self) -> Any:
        return self.inner.snapshot()

    def restore(self, state: Any) -> None:
        self.inner.restore(state)

    def __getattr__(self, name: str):
        if name == "inner":       # not set yet (e.g. during unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


class ContextSpec:
    """An env spec whose envs run under `operator` (see the module docstring)."""

    def __init__(self, inner, operator):
        self.inner = inner
        self.operator = operator
        self.name = inner.name

    def make(self):
        return self.operator.make_env(self.inner.make())

    def tasks(self, split: str, n: int | None = None):
        return self.inner.tasks(split, n)

    def expert(self, env, rng, error_rate: float = 0.0) -> str:
        return self.inner.expert(getattr(env, "inner", env), rng, error_rate)

    def __getattr__(self, name: str):
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

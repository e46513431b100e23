"""Rollout controllers: how a step's generation budget becomes episodes (and trees).

`controller(ctx, tasks) -> RolloutResult`; `ctx` carries the engine, chat format, env spec,
sampling parameters and the step's generator. The trainer never branches on the name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..engines.hf import SamplingParams
from ..envs.base import EnvSpec, Task
from ..models.chat import ChatFormat
from ..registry import Registry
from ..types import Episode
from .runner import run_episodes


@dataclass
class RolloutContext:
    engine: object
    fmt: ChatFormat
    spec: EnvSpec
    params: SamplingParams
    group_size: int
    max_tokens: int
    batch_size: int
    budget_tokens: int            # 0 = no cap
    generator: torch.Generator


@dataclass
class RolloutResult:
    episodes: list[Episode]               # trainable episodes
    extra_tokens: int = 0                 # generated tokens spent on value estimation only
    extras: dict = field(default_factory=dict)  # controller-specific (trees, segment values)

    @property
    def tokens(self) -> int:
        return sum(e.generated_tokens for e in self.episodes) + self.extra_tokens


CONTROLLERS: Registry[Callable[[RolloutContext, list[Task]], RolloutResult]] = Registry("controller")


@CONTROLLERS.register("linear")
def linear(ctx: RolloutContext, tasks: list[Task]) -> RolloutResult:
    """G independent episodes per task (GRPO-style groups)."""
    pairs = [(t, g) for g, t in enumerate(tasks) for _ in range(ctx.group_size)]
    eps = run_episodes(ctx.engine, ctx.fmt, ctx.spec, pairs, ctx.params, ctx.max_tokens,
                       ctx.batch_size, ctx.generator)
    return RolloutResult(eps)

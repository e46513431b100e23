"""The training tasks a run draws, step by step: a seeded order, reshuffled every epoch. The
trainer's sampler, and the step-1 tasks the matched budget is measured on
(`rollout.matched_budget`)."""
from __future__ import annotations

import random

from ..errors import ConfigError


class TaskSampler:
    """Training tasks in a seeded order, reshuffled every epoch; the cursor is the step."""

    def __init__(self, tasks, seed: int, per_step: int, env: str = "env"):
        self.tasks, self.seed, self.per_step = list(tasks), seed, per_step
        if not self.tasks:
            raise ConfigError(f"env '{env}' has no training tasks (its tasks('train') is empty); "
                              "agentrl check-env shows what the env gives")

    def for_step(self, step: int):
        n = len(self.tasks)
        out = []
        for j in range((step - 1) * self.per_step, step * self.per_step):
            epoch, i = divmod(j, n)
            order = list(range(n))
            random.Random(self.seed * 7_777 + epoch).shuffle(order)
            out.append(self.tasks[order[i]])
        return out

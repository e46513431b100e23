"""The recipes. A method = rollout controller + advantage estimator + loss + what it needs
(critic, reference model, extra rollouts) + its paper's defaults. The trainer never branches on
a method's name: it reads these fields. Every default can be overridden with `--set`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .registry import Registry


@dataclass(frozen=True)
class Recipe:
    name: str
    summary: str                  # one line for the README / --help
    defaults: dict = field(default_factory=dict)  # dotted config overrides (algo.*, rollout.*)
    critic: bool = False          # trains a value function
    reference: bool = False       # needs a frozen copy of the initial policy
    extra_rollouts: str = ""      # what extra generation it spends (for the README table)


METHODS: Registry[Recipe] = Registry("method")


def _add(r: Recipe) -> None:
    METHODS.register(r.name, r)


_add(Recipe(
    "grpo", "group-normalised outcome advantage, token-mean PPO-clip",
    {"algo.estimator": "grpo", "algo.loss": "ppo_clip", "algo.controller": "linear"},
))

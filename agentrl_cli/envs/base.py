"""The TextEnv protocol: a Gymnasium-style, text-in/text-out tool environment that can be forked.

The env never sees tokens. The rollout runner renders the env's text with the model's chat
template and stores the exact token ids (token-in, token-out); see `rollout/`.
"""
from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from ..config import EnvConfig
from ..errors import ConfigError
from ..registry import Registry


@dataclass(frozen=True)
class Task:
    """One task. `answer` is the gold answer (TRACE teacher-forces it; verifiers check it)."""

    task_id: str                  # unique within its env and split
    prompt: str                   # the user message that opens the episode
    answer: str                   # gold final answer, as text
    meta: dict = field(default_factory=dict, compare=False)  # env-specific (hops, entities, ...)


@dataclass
class StepResult:
    observation: str              # text shown to the policy next ("" when terminated)
    reward: float                 # terminal reward on the final step, 0 before
    terminated: bool              # the episode ended on its own (final answer)
    truncated: bool               # the env's step limit was hit
    info: dict = field(default_factory=dict)  # tool, success, error, ...


@runtime_checkable
class TextEnv(Protocol):
    """A multi-turn tool environment. Malformed actions become error observations, never raise."""

    system_prompt: str            # fixed instructions (tools and their syntax)

    def reset(self, task: Task) -> str:
        """Start an episode on `task`; return the first user message."""

    def step(self, action: str) -> StepResult:
        """Apply one complete assistant message (a tool call or a final answer)."""

    def snapshot(self) -> Any:
        """A picklable, independent copy of the episode state (for forking)."""

    def restore(self, state: Any) -> None:
        """Return to a state from `snapshot()`; later steps behave exactly as after the snapshot."""


class EnvSpec(Protocol):
    """What the registry holds for each env: a factory of envs, tasks and a scripted expert."""

    name: str

    def make(self) -> TextEnv:
        """A fresh env instance (one per concurrent episode)."""

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        """Deterministic tasks of `split` ("train" | "eval"), the first `n` if given."""

    def expert(self, env: TextEnv, rng: random.Random, error_rate: float = 0.0) -> str:
        """The scripted expert's next action for `env`'s current state (`error_rate` > 0 makes
        an imperfect demonstrator)."""


# name -> callable(seed: int, **options) -> EnvSpec, made by `env_factory`
ENVS: Registry[Callable[..., EnvSpec]] = Registry("env")

# the env section's options (`EnvConfig` but name and seed): `make_env_spec` hands a factory the
# whole section, and each env takes the ones it declares (`env_factory`)
SECTION_OPTIONS = tuple(f.name for f in fields(EnvConfig) if f.name not in ("name", "seed"))


class EnvOptionError(ConfigError, TypeError):
    """An option an env does not take: one line for the user (ConfigError), and the TypeError
    Python raises for an unexpected keyword."""


def env_factory(env: str, options: Sequence[str]):
    """Declare the options (besides `seed`) of env `env`'s registry factory. The decorated
    factory receives only those; the env section's other fields (`SECTION_OPTIONS`, options of
    other envs) are dropped; any other keyword is a one-line `EnvOptionError` naming `env`'s
    options. The declared options are the factory's `options` attribute."""
    options = tuple(options)

    def deco(fn: Callable[..., EnvSpec]) -> Callable[..., EnvSpec]:
        @functools.wraps(fn)
        def factory(seed: int = 0, **kw: Any) -> EnvSpec:
            unknown = sorted(k for k in kw if k not in options and k not in SECTION_OPTIONS)
            if unknown:
                raise EnvOptionError(f"env '{env}' has no option '{unknown[0]}'; its options: "
                                     f"{', '.join(options) or 'none'}")
            return fn(seed, **{k: v for k, v in kw.items() if k in options})

        factory.options = options
        return factory

    return deco


def make_env_spec(section: EnvConfig, seed: int | None = None) -> EnvSpec:
    """The spec of an env section (its world at `seed`, default the section's own): the one
    place a spec is built from configuration (`context.make_spec`, the tiny build)."""
    factory = ENVS.get(section.name)
    return factory(seed=section.seed if seed is None else seed,
                   **{k: getattr(section, k) for k in SECTION_OPTIONS})

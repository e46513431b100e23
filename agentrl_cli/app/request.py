"""What a command that builds a run's config was asked: the options `agentrl train`, `eval` and
`rollout` share (`RunRequest`, declared once for the command line in `cli/options.py`:
`run_options`); each command's request adds its own."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(kw_only=True)
class RunRequest:
    """The config a command was asked for (None: not given): a recipe, env, benchmark, model
    and engine, a YAML preset, overrides and the run seed."""

    method: str | None = None             # `agentrl eval` takes none: the run's, or the default
    env: str | None = None
    benchmark: str | None = None
    model: str | None = None
    engine: str | None = None
    config: Path | None = None
    sets: list[str] = field(default_factory=list)   # --set (and a command's shortcuts)
    seed: int | None = None

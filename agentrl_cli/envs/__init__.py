"""Environments. Importing this package registers the built-ins."""
from .base import ENVS, EnvSpec, StepResult, Task, TextEnv
from . import search  # noqa: F401  (registers "search")

__all__ = ["ENVS", "EnvSpec", "StepResult", "Task", "TextEnv"]

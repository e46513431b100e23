"""The errors a user's mistake raises; a leaf module that every layer may import."""
from __future__ import annotations


class ConfigError(ValueError):
    """A user mistake in the configuration; the message is one line."""


class StopTraining(Exception):
    """Raised by a step callback (`agentrl_cli.api.train(..., on_step=...)`) to end a run
    after the current step, with a checkpoint of it; returning False does the same."""

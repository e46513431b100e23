"""The errors a user's mistake raises; a leaf module that every layer may import."""
from __future__ import annotations


class ConfigError(ValueError):
    """A user mistake in the configuration; the message is one line."""

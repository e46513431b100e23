"""Rollouts: the batched runner and the controllers (linear, vine, focus)."""
from .runner import run_episodes, run_expert
# the controllers register themselves in CONTROLLERS on import: linear (controllers), vine, focus
from . import controllers, focus, vine  # noqa: E402,F401

__all__ = ["run_episodes", "run_expert"]

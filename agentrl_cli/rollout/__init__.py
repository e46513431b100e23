"""Rollouts: the batched runner and the controllers (linear, vine, focus)."""
from .runner import run_episodes, run_expert

__all__ = ["run_episodes", "run_expert"]

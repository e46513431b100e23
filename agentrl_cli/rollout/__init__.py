"""Rollouts: the batched runner and the controllers (linear, vine, focus)."""
# the controllers register themselves in CONTROLLERS on import: linear (controllers), vine, focus
from . import controllers, focus, vine  # noqa: F401

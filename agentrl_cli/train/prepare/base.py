"""The preparer registry; each preparer module registers itself (imported by the package)."""
from __future__ import annotations

from typing import Callable

from ...registry import Registry

PREPARERS: Registry[Callable] = Registry("preparer")

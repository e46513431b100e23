"""Batch preparers: model-dependent inputs an estimator needs beyond rewards and values.

`PREPARERS` maps an estimator name to `prepare(learner, batch, episodes, fmt, cfg) -> None`,
which fills `batch.extras` (e.g. TRACE's reference-model log-probs of the gold answer after
every tool-call boundary). Estimators without an entry need nothing extra.
"""
from __future__ import annotations

from typing import Callable

from ..registry import Registry

PREPARERS: Registry[Callable] = Registry("preparer")

from . import trace_reference as _trace_reference  # noqa: E402,F401  (registers "trace")

"""Batch preparers: model-dependent inputs an estimator needs beyond rewards and values.

`PREPARERS` maps an estimator name to `prepare(learner, batch, episodes, fmt, cfg) -> None`,
which adds what it computes to the batch's payload as an object of a type the estimator reads
(`batch.payload.add(...)`, `types.Payload`; e.g. TRACE's `TraceReference`, the reference
model's log-probs of the gold answer after every tool-call boundary). Estimators without an
entry need nothing extra.
"""
from __future__ import annotations

from .base import PREPARERS
from . import trace_reference  # noqa: F401  (registers "trace")

__all__ = ["PREPARERS"]

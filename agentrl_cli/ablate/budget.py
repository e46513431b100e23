"""The matched budget of a sweep: every cell runs with the same `rollout.budget_tokens`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from ..config import RunConfig
from ..errors import ConfigError
from ..app.train import initial_runtime
from ..rollout.matched_budget import linear_step_tokens, resolve_budget


def measure_budget(cfg: RunConfig) -> int:
    """Tokens one linear rollout step of `cfg` generates (step 1's tasks, the initial policy):
    `rollout.matched_budget.linear_step_tokens`, what `rollout.budget_match` gives a run of
    `cfg`."""
    return linear_step_tokens(initial_runtime(cfg, log=lambda s: None))


def sweep_budget(out: Path, base: RunConfig, budget: int | None, log: Callable[[str], None]) -> int:
    """The sweep's budget: --budget, else the one recorded by an earlier run of this sweep, else
    the base config's rollout.budget_tokens, else measured (see the module docstring)."""
    rec = out / "ablation.json"
    old = json.loads(rec.read_text()).get("budget_tokens") if rec.is_file() else None
    if budget is not None:
        if old is not None and old != budget and any((out / "cells").glob("*/seed-*/summary.json")):
            raise ConfigError(f"{out} holds cells finished at budget {old} tokens; rerun with "
                              f"--budget {old} or use a new --out")
        return budget

    def measure() -> int:   # the base config's own budget, else a linear step of it, measured
        if base.rollout.budget_tokens > 0:
            return base.rollout.budget_tokens
        log("measuring the matched budget: one linear rollout step of the base config ...")
        return measure_budget(base)

    return resolve_budget(0, True, old, measure)

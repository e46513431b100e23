"""What a command checks before any work: every plugin a config names exists.

`config` knows values, not plugins; the registries live with the plugins (envs, engines,
estimators, losses, controllers, context operators), so the names are checked here, above all
of them, by the CLI and by `ablate` right after a config is loaded (a typo fails in under a
second, before a model is loaded or a run folder written).
"""
from __future__ import annotations

from ..config import RunConfig, load


def check_names(cfg: RunConfig) -> RunConfig:
    """Unknown env / engine / estimator / loss / controller / context operator -> one
    `RegistryError` line listing the valid ones. Returns `cfg`."""
    from ..context import OPERATORS
    from ..credit.estimators import ESTIMATORS
    from ..engines import ENGINES
    from ..envs import ENVS
    from ..rollout.controllers import CONTROLLERS
    from .update import POLICY_LOSSES

    for reg, name in ((ENVS, cfg.env.name), (ENGINES, cfg.rollout.engine),
                      (ESTIMATORS, cfg.algo.estimator), (POLICY_LOSSES, cfg.algo.loss),
                      (CONTROLLERS, cfg.algo.controller), (OPERATORS, cfg.context.operator)):
        if name not in reg:
            reg.get(name)  # raises the one-line RegistryError
    return cfg


def load_checked(*args, **kwargs) -> RunConfig:
    """`config.load(...)` followed by `check_names`: the config a command runs with."""
    return check_names(load(*args, **kwargs))

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


def check_eval_tasks(cfg: RunConfig, n: int | None = None, what: str = "train.eval_tasks") -> None:
    """`n` held-out tasks (default `train.eval_tasks`) exist in the env's eval split; more is a
    one-line error, not a silent cut to the split's size. Builds the env spec (cheap: no
    model), so it runs before any work."""
    from ..context import make_spec
    from ..errors import ConfigError

    n = cfg.train.eval_tasks if n is None else n
    size = len(make_spec(cfg).tasks("eval"))
    if n > size:
        hint = " (or raise env.n_eval)" if "n_eval" in _env_options(cfg.env.name) else ""
        raise ConfigError(f"{what}={n} is above the {cfg.env.name} eval split's {size} tasks: "
                          f"give at most {size}{hint}")


def _env_options(name: str) -> tuple[str, ...]:
    from ..envs import ENVS

    return tuple(getattr(ENVS.get(name), "options", ()) or ())


def load_checked(*args, **kwargs) -> RunConfig:
    """`config.load(...)` followed by `check_names`: the config a command runs with."""
    return check_names(load(*args, **kwargs))

"""Which config keys a method reads, among those only some methods read: a sweep over a key the
method ignores would give identical cells, so it is a one-line error before any run
(`check_sweep`), and a sweep that names no method runs the one that reads its keys
(`default_methods`).

A method's parts declare what they read where they register (`Registry.register(name,
reads=(...))`: the estimator and its preparer, the controller, the loss); the trainer's own
`algo.*` keys, the critic's keys for a recipe with a critic, and the keys a recipe sets
complete it (`method_reads`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..credit.estimators import ESTIMATORS
from ..errors import ConfigError
from ..methods import METHODS
from ..rollout.controllers import CONTROLLERS
from ..train.policy_losses import POLICY_LOSSES
from ..train.prepare import PREPARERS

if TYPE_CHECKING:
    from .plan import Axis

# Keys only a method with a critic reads (the trainer skips them otherwise).
CRITIC_KEYS = frozenset({"algo.vf_coef", "algo.value_clip", "train.critic_warmup",
                         "train.critic_lr", "model.critic", "model.critic_path"})
# The trainer's own `algo.*` keys (train/loop.py, train/learner.py): every method reads them.
TRAINER_KEYS = frozenset({"algo.estimator", "algo.controller", "algo.loss", "algo.agg",
                          "algo.kl_coef", "algo.kl_estimator", "algo.entropy_coef",
                          "algo.rewards", "algo.reward_mode"})
PARTS = ("algo.estimator", "algo.controller", "algo.loss")   # the keys that pick a method's parts


def _registries() -> dict:
    """The registries whose entries make a method, by the config key that picks the entry."""
    return {"algo.estimator": (ESTIMATORS, PREPARERS), "algo.controller": (CONTROLLERS,),
            "algo.loss": (POLICY_LOSSES,)}


def method_reads(method: str, overrides: dict | None = None) -> frozenset[str]:
    """The config keys a method's run reads among those that only some methods read: what its
    estimator (and the estimator's preparer), its controller and its loss declare they read;
    the trainer's own `algo.*` keys; the critic's keys when the recipe has a critic; and the
    keys its recipe sets. `overrides` (dotted key -> value) replace the recipe's parts, e.g.
    `{"algo.controller": "vine"}`."""
    recipe = METHODS.get(method)
    parts = {**recipe.defaults, **(overrides or {})}
    keys = set(TRAINER_KEYS)
    for key, registries in _registries().items():
        for reg in registries:
            keys |= reg.reads(str(parts.get(key, "")))
    keys |= {k for k in recipe.defaults if k.startswith("algo.") or k in CRITIC_KEYS}
    if recipe.critic:
        keys |= CRITIC_KEYS
    return frozenset(keys)


def method_specific(key: str) -> bool:
    """Keys some methods ignore: `algo.*` and the critic's. Every other key (train.lr,
    rollout.*, env.*, model.name, ...) is read by every method."""
    return key.startswith("algo.") or key in CRITIC_KEYS


def readers(key: str) -> list[str]:
    """The methods whose recipe reads `key`."""
    return [m for m in METHODS.names() if key in method_reads(m)]


def check_sweep(methods: list[str], axes: list[Axis], fixed: dict | None = None) -> None:
    """Every swept method-specific key must be read by every method of the sweep (else the
    cells would be identical runs): ConfigError naming the methods that do read it. `fixed`:
    the base config's dotted overrides (`--config`, `--set`), which may swap a method's parts."""
    parts = {k: v for k, v in (fixed or {}).items() if k in PARTS}
    for m in methods:
        for axis in axes:
            for label, sets in axis.values:
                over = {**parts, **dict(s.split("=", 1) for s in sets if s.split("=", 1)[0] in PARTS)}
                reads = method_reads(m, over)
                for s in sets:
                    key = s.split("=", 1)[0]
                    if method_specific(key) and key not in reads:
                        who = readers(key)
                        raise ConfigError(
                            f"{m} does not read {key}, so sweeping it gives identical cells; "
                            + (f"methods that read it: {', '.join(who)} (--method {who[0]})"
                               if who else "no method reads it"))


def default_methods(axes: list[Axis], default: str) -> tuple[list[str], str | None]:
    """No method chosen: the default method if it reads every swept key, else the one method
    that does (with a line saying so); several or none: ConfigError."""
    keys = [s.split("=", 1)[0] for a in axes for _, sets in a.values for s in sets]
    keys = [k for k in dict.fromkeys(keys) if method_specific(k)]
    if all(k in method_reads(default) for k in keys):
        return [default], None

    fit = [m for m in METHODS.names() if all(k in method_reads(m) for k in keys)]
    swept = ", ".join(keys)
    if len(fit) == 1:
        return fit, (f"{swept}: read only by {fit[0]}, so this sweep runs {fit[0]} "
                     f"(the default method, {default}, ignores it)")
    if not fit:
        raise ConfigError(f"no method reads all of {swept}; sweep them in separate ablations")
    raise ConfigError(f"{default} (the default method) does not read {swept}; methods that do: "
                      f"{', '.join(fit)}; choose with --method")

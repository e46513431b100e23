"""`agentrl diagnose audit-tree`'s library function: the audit spec and world a request gives,
then the audit (`diagnostics.audit.run_audit`).

Without a checkpoint the world is synthetic (`audit.SyntheticWorld`: known values by
construction); with one it is the checkpoint's policy on its env (`audit_env.EnvWorld`: values
from many continuations per state), and the checkpoint's own critic joins the critics unless
`--critics` names them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import RunConfig
from ..errors import ConfigError
from .audit import AuditSpec, SyntheticWorld, run_audit
from .audit_env import EnvWorld
from .mc import load_checkpoint_policy


@dataclass
class AuditRequest:
    """What `agentrl diagnose audit-tree` was asked (its options; None: not given)."""

    checkpoint: Path | None = None
    critics: tuple[str, ...] | None = None
    allocators: tuple[str, ...] | None = None     # None: every registered allocator
    budget: int = 256
    seeds: int = 10
    tasks: int = 4
    roots: int = 2
    depth: int = 6
    branching: int = 3
    informative: float = 0.15
    grow: bool = False
    constant: str = "mean"
    samples: int = 16
    capacity: int = 1
    estimate: str = "refined"
    kappa: float | None = None


def audit_spec(req: AuditRequest, cfg: RunConfig) -> AuditSpec:
    """The audit's settings: the request's, and the run's FOCUS settings (kappa, gamma, gain,
    continuations in flight per node) where the request leaves them."""
    try:
        const = None if req.constant == "mean" else float(req.constant)
    except ValueError:
        raise ConfigError(f"--constant must be a number or 'mean', got '{req.constant}'") from None
    if req.estimate not in ("refined", "calibrated"):
        raise ConfigError(f"--estimate must be refined or calibrated, got '{req.estimate}'")
    return AuditSpec(critics=req.critics or ("constant", "random"),
                     allocators=req.allocators or AuditSpec().allocators,
                     max_budget=req.budget, roots=req.roots, seeds=req.seeds,
                     kappa=cfg.algo.kappa if req.kappa is None else req.kappa,
                     gamma=cfg.algo.gamma, gain_kind=cfg.algo.focus_gain,
                     max_inflight=cfg.algo.focus_max_inflight,
                     min_depth=cfg.algo.focus_min_depth, capacity=req.capacity,
                     constant=const, estimate=req.estimate)


def synthetic_world(req: AuditRequest, cfg: RunConfig, spec: AuditSpec):
    """-> (world factory, title) of the synthetic audit tree."""
    if "trained" in spec.critics:
        raise ConfigError("the 'trained' critic needs --checkpoint")
    shape = dict(depth=req.depth, branching=req.branching, informative=req.informative)

    def make_world(s):
        return SyntheticWorld.make(cfg.seed * 100_003 + s, tasks=req.tasks, grow=req.grow, **shape)
    return make_world, (f"synthetic audit tree (depth {req.depth}, branching {req.branching}, "
                        f"{req.tasks} tasks x {req.roots} roots)")


def checkpoint_world(req: AuditRequest, cfg: RunConfig, ckpt: Path, spec: AuditSpec,
                     log: Callable[[str], None]):
    """The audit tree of a checkpoint's policy on the env -> (the audit spec, with the
    checkpoint's own critic added when --critics was not given and it has one; the world
    factory; the title)."""
    pol = load_checkpoint_policy(cfg, ckpt)
    if req.critics is None and pol.critic is not None:
        spec = dataclasses.replace(spec, critics=spec.critics + ("trained",))
    if "trained" in spec.critics and pol.critic is None:
        raise ConfigError(f"{ckpt} has no value head: drop 'trained' from --critics")
    log(f"building the audit tree: {req.tasks} tasks x {req.roots} root episodes, {req.samples} "
        f"continuations per state ...")
    world = EnvWorld(pol, req.tasks, req.roots, req.samples, seed=cfg.seed)
    log(f"{world.n_states} audit states, {world.n_continuations} continuations")
    return spec, (lambda s: world), f"{cfg.env.name} audit tree ({ckpt.name}, {world.n_states} states)"


def audit_tree(req: AuditRequest, cfg: RunConfig, ckpt: Path | None,
               log: Callable[[str], None] = print) -> tuple[dict, str]:
    """Run the audit a request gives on `cfg` (the run's config for a checkpoint) -> (the
    results of `run_audit`, the figure's title)."""
    spec = audit_spec(req, cfg)
    if ckpt is None:
        make_world, title = synthetic_world(req, cfg, spec)
    else:
        spec, make_world, title = checkpoint_world(req, cfg, ckpt, spec, log)
    return run_audit(make_world, spec), title

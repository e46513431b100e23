"""What a sweep is: its axes and cells (`plan`), the papers' named ablations (`PRESETS`), the
run folders and configs of its cells (`Sweep`), and what is printed and recorded before it runs
(`plan_lines`, `warmup_warnings`, `record`)."""
from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..config import RunConfig
from ..errors import ConfigError
from ..registry import Registry
from ..app.preflight import load_checked
from ..methods import METHODS
from ..train.run_folder import atomic_write_text


@dataclass(frozen=True)
class Axis:
    name: str                                          # shown in cell names and tables
    values: tuple[tuple[str, tuple[str, ...]], ...]    # (label, --set overrides) per value

    @classmethod
    def key(cls, key: str, values: list[str]) -> "Axis":
        """A plain config key swept over values, `key=v` for each."""
        return cls(key, tuple((v, (f"{key}={v}",)) for v in values))


@dataclass(frozen=True)
class Cell:
    name: str
    method: str
    params: dict = field(default_factory=dict, hash=False)   # axis name -> label
    sets: tuple[str, ...] = ()
    # the method's tuned values (key -> value) its sets start with (`ablate.tune`); {}: untuned
    tuned: dict = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Arm:
    """One compared variant of a preset: a label (its cell's name), a method and its sets."""

    label: str
    method: str
    sets: tuple[str, ...] = ()


@dataclass(frozen=True)
class Preset:
    summary: str
    methods: tuple[str, ...]
    axes: Callable[[RunConfig], list[Axis]]               # from the base config
    # a preset of named variants (each a method with its own sets) instead of methods crossed
    # with axes; `methods` then lists their methods
    arms: tuple[Arm, ...] = ()


PRESETS: Registry[Preset] = Registry("ablation preset")
PRESETS.register("refinement", Preset(
    "FOCUS with and without refinement rollouts (continuations); without them the budget goes "
    "to group_size independent root episodes per task",
    ("focus",),
    lambda cfg: [Axis("refinement", (
        ("on", ()),
        ("off", ("algo.focus_max_inflight=0", f"algo.focus_roots={cfg.rollout.group_size}"))))]))
PRESETS.register("turn-ratio", Preset(
    "MPO's importance ratio: turn-level (turn_ratio) vs token-level (ppo_clip)",
    ("mpo",),
    lambda cfg: [Axis("loss", (("turn_ratio", ("algo.loss=turn_ratio",)),
                               ("ppo_clip", ("algo.loss=ppo_clip",))))]))
PRESETS.register("trace-k", Preset(
    "TRACE look-ahead K = 3 vs K = 0 (K = 0: an empty look-ahead, so no turn credit: "
    "expressed as algo.alpha_turn=0, since algo.trace_k must be >= 1)",
    ("trace",),
    lambda cfg: [Axis("trace_k", (("3", ("algo.trace_k=3",)), ("0", ("algo.alpha_turn=0",))))]))
PRESETS.register("workspace", Preset(
    "FOCUS with a compaction operator vs an in-memory workspace (put/get/scan/delete tools)",
    ("focus",),
    lambda cfg: [Axis("context", (("compaction", ("context.operator=compaction",)),
                                  ("workspace", ("context.operator=workspace",))))]))
PRESETS.register("compaction-style", Preset(
    "FOCUS with compaction: free-form vs structured (four sections) summary prompt",
    ("focus",),
    lambda cfg: [Axis("style", (("free", ("context.operator=compaction", "context.style=free")),
                                ("structured", ("context.operator=compaction",
                                                "context.style=structured"))))]))


# where FOCUS's allocation pays (docs/methods.md, "Tree methods beside FOCUS"): the tree
# methods and FOCUS's critic ladder at one matched budget, each paired with GRPO
ALLOCATION_ARMS = (
    Arm("grpo", "grpo"),
    Arm("focus", "focus"),
    Arm("focus-oracle", "focus", ("algo.focus_critic=oracle",)),
    Arm("focus-kappa0", "focus", ("algo.kappa=0",)),
    Arm("focus-entropy", "focus", ("algo.focus_allocator=entropy",)),
    Arm("focus-contrast", "focus", ("algo.focus_norm=contrast",)),
    Arm("tree_grpo", "tree_grpo"),
)
PRESETS.register("allocation", Preset(
    "the tree methods and FOCUS's critic ladder at one matched budget: grpo, focus (learned "
    "critic), focus-oracle (env.oracle_value()), focus-kappa0 (evidence only), focus-entropy "
    "(entropy branching), focus-contrast (no credit from a tree without outcome contrast), "
    "tree_grpo; run it on an allocation-* benchmark",
    tuple(dict.fromkeys(a.method for a in ALLOCATION_ARMS)), lambda cfg: [], ALLOCATION_ARMS))


def values(text: str, what: str) -> list[str]:
    """`0,0.5,1` -> ['0', '0.5', '1']; no values, or an empty item (`1,,2`, `1,2,`), is a
    one-line error (a value silently dropped would leave a cell out of the sweep)."""
    vals = [v.strip() for v in text.split(",")]
    if not any(vals):
        raise ConfigError(f"{what} needs comma-separated values, got '{text}'")
    if not all(vals):
        raise ConfigError(f"{what} '{text}' has an empty item (value {vals.index('') + 1}): "
                          "give comma-separated values, e.g. 0,0.5,1")
    return vals


def short(key: str, keys: list[str]) -> str:
    """`algo.beta` -> `beta` unless another swept key ends the same way."""
    tail = key.rsplit(".", 1)[-1]
    return tail if sum(k.rsplit(".", 1)[-1] == tail for k in keys) == 1 else key


def plan(methods: list[str], axes: list[Axis], arms: tuple[Arm, ...] = ()) -> list[Cell]:
    """Every combination of method and axis values, methods outermost; with `arms` (a preset's
    named variants), every combination of arm and axis values instead."""
    names = [a.name for a in axes]
    for a in axes:
        if not a.values:
            raise ConfigError(f"axis '{a.name}' has no values")
    cells = []
    for arm in arms or tuple(Arm(m, m) for m in methods):
        for combo in itertools.product(*[a.values for a in axes]):
            params = {a.name: label for a, (label, _) in zip(axes, combo)}
            sets = arm.sets + tuple(s for _, ss in combo for s in ss)
            name = "_".join([arm.label] + [f"{short(k, names)}={v}" for k, v in params.items()])
            cells.append(Cell(name.replace("/", "-"), arm.method, params, sets))
    if len({c.name for c in cells}) != len(cells):
        raise ConfigError("two cells of the sweep have the same name (a value repeated?)")
    return cells


@dataclass
class Sweep:
    out: Path
    cells: list[Cell]
    seeds: list[int]
    config_file: str | None = None
    base_sets: list[str] = field(default_factory=list)
    budget: int = 0                                     # rollout.budget_tokens of every cell

    def run_dir(self, cell: Cell, seed: int) -> Path:
        return self.out / "cells" / cell.name / f"seed-{seed}"

    def cell_sets(self, cell: Cell) -> list[str]:
        return [*self.base_sets, *cell.sets, f"rollout.budget_tokens={self.budget}"]

    def cell_config(self, cell: Cell, seed: int) -> RunConfig:
        """The cell's config, its plugin names checked (a typo fails before any run)."""
        return load_checked(self.config_file, self.cell_sets(cell), method=cell.method, seed=seed,
                    out=str(self.run_dir(cell, seed)))


def record(sweep: Sweep, axes: list[Axis], preset: str | None) -> None:
    """`<out>/ablation.json`: what was swept and at which budget (read back on rerun)."""
    sweep.out.mkdir(parents=True, exist_ok=True)
    data = {"budget_tokens": sweep.budget, "seeds": sweep.seeds, "preset": preset,
            "methods": sorted({c.method for c in sweep.cells}),
            "axes": {a.name: [{"label": l, "sets": list(s)} for l, s in a.values] for a in axes},
            "config": sweep.config_file, "sets": sweep.base_sets,
            "cells": [dataclasses.asdict(c) for c in sweep.cells]}
    atomic_write_text(sweep.out / "ablation.json", json.dumps(data, indent=2))


def warmup_warnings(configs: list[RunConfig]) -> list[str]:
    """A cell whose recipe trains only its critic for `train.critic_warmup` steps never moves
    its policy when train.steps does not exceed them: every such cell ends where it started."""
    out = []
    for cfg in configs:
        w, s = cfg.train.critic_warmup, cfg.train.steps
        if METHODS.get(cfg.method).critic and w > 0 and s <= w:
            out.append(f"{cfg.method}: train.steps {s} does not exceed its critic warm-up "
                       f"(train.critic_warmup {w}): the policy is never updated, so these "
                       f"cells measure the base model; use --steps {w + 10} or more, or "
                       f"--set train.critic_warmup=0")
    return list(dict.fromkeys(out))


def plan_lines(sweep: Sweep, configs: list[RunConfig], jobs: int = 1) -> list[str]:
    """What the sweep will do, before it starts: cells, seeds, steps, budget, and when the time
    estimate comes. The estimate is measured, not guessed: from finished runs of this sweep if
    there are any, else printed once the first run has made its first steps
    (`SweepEstimate`)."""
    runs = len(sweep.cells) * len(sweep.seeds)
    steps = sorted({c.train.steps for c in configs})
    warm = {c.method: c.train.critic_warmup for c in configs if c.train.critic_warmup}
    lines = [f"[bold]agentrl ablate[/] {len(sweep.cells)} cells x {len(sweep.seeds)} seed(s) = "
             f"{runs} runs of {'/'.join(map(str, steps))} steps, budget "
             f"{sweep.budget or 'uncapped'} tokens/step -> {sweep.out}",
             "  cells: " + ", ".join(c.name for c in sweep.cells)
             + f"; seeds {','.join(map(str, sweep.seeds))}"]
    for m, w in warm.items():
        lines.append(f"  {m}: the first {w} steps train only the critic (train.critic_warmup)")
    done = [json.loads(p.read_text()) for p in sweep.out.glob("cells/*/seed-*/summary.json")]
    walls = [d["wall_seconds"] for d in done if isinstance(d.get("wall_seconds"), (int, float))]
    if walls:
        est = sum(walls) / len(walls) * runs / max(1, min(jobs, runs))
        lines.append(f"  time: about {est / 60:.0f} min in all, from {len(walls)} finished "
                     "run(s) of this sweep (finished runs are skipped)")
    else:
        lines.append(f"  time: estimated after the first run's first {ESTIMATE_AFTER_STEPS} "
                     "steps (measured, printed then)")
    return lines


ESTIMATE_AFTER_STEPS = 3     # steps of the first run the sweep's time estimate is measured on


@dataclass(frozen=True)
class SweepEstimate:
    """The sweep's wall time, measured on its first run: `setup_s` from the run's start to its
    first step (loading, the base held-out check), `step_s` and `rollout_s` the seconds of its
    first steps and of their rollouts (the first step dropped when there are more: it warms
    caches up). A run costs setup + mean step x steps + each held-out check
    (`train.eval_every`, and the last step), a check costing the step's rollout scaled by its
    episodes (`train.eval_tasks` x `train.eval_samples`) over a step's; runs share `jobs`
    slots. Rough: later steps (longer or shorter episodes as the policy learns) can move it."""
    setup_s: float
    step_s: tuple[float, ...]
    rollout_s: tuple[float, ...] = ()

    def run_seconds(self, cfg: RunConfig) -> float:
        t, r = _warm(self.step_s), _warm(self.rollout_s)
        checks = cfg.train.steps // cfg.train.eval_every if cfg.train.eval_every else 0
        if not cfg.train.eval_every or cfg.train.steps % cfg.train.eval_every:
            checks += 1                       # the last step is always checked
        ro = cfg.rollout
        check_s = (sum(r) / len(r) * cfg.train.eval_tasks * cfg.train.eval_samples
                   / max(1, ro.tasks_per_step * ro.group_size)) if r else self.setup_s
        return self.setup_s + checks * check_s + sum(t) / len(t) * cfg.train.steps

    def line(self, configs: list[RunConfig], runs: int, jobs: int) -> str:
        per_run = sum(self.run_seconds(c) for c in configs) / len(configs)
        total = per_run * runs / max(1, min(jobs, runs))
        t = _warm(self.step_s)
        return (f"  sweep time: about {total / 60:.1f} min for {runs} run(s) (measured on the "
                f"first run: {self.setup_s:.0f}s to its first step, "
                f"{sum(t) / len(t):.1f}s per step)")


def _warm(seconds: tuple[float, ...]) -> tuple[float, ...]:
    """The first steps' seconds without the first one, when there are more."""
    return seconds[1:] or seconds

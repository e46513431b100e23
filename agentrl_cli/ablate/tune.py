"""The tuning stage of a sweep (`agentrl ablate --tune`): every method of the sweep tuned alike
before its cells run (docs/ablate.md, "Tuning").

Each method gets a small grid: the product of the `--tune` keys it reads (`--tune KEY=v1,v2`
for every method of the sweep that reads KEY, `--tune METHOD:KEY=v1,v2` for one method), and
every method's grid has the same number of points, so each method gets the same number of
tuning runs. Every point runs once per exploration seed (`TUNE_SEED` and up, never a verdict
seed) at the sweep's matched budget, as an ordinary `agentrl train` run in
`<out>/tune/cells/<method>_<point>/seed-<S>/`. One written rule (`RULE`) picks each method's
point; the sweep's cells then run with their method's pick ahead of their own sets. The grids,
the tuning runs' numbers and the picks are written to `<out>/tuning.json` and the sweep's
summary. Resumable as the sweep is: a finished tuning run is reused, a cut one resumes.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import _check_key
from ..errors import ConfigError
from ..reporting.metrics import read_metrics
from ..train.run_folder import atomic_write_text
from .plan import Axis, Cell, Sweep, plan, values
from .reads import check_sweep
from .run import check_rerun, status

TUNE_SEED = 100        # the first exploration seed; verdict seeds must stay below the tuning seeds
RULE = ("mean of checks: a tuning run's score is the mean of its held-out checks after step 0 "
        "(eval/success); a point's score is the mean over the tuning seeds; each method takes "
        "its highest-scoring point, a tie going to the point listed first")


@dataclass(frozen=True)
class Tuning:
    """What `--tune` asked: each method's grid (its axes) and the exploration seeds."""

    grids: dict[str, list[Axis]]
    seeds: list[int]

    def points(self) -> int:
        """Points in each method's grid (the same for every method)."""
        return next(iter(_sizes(self.grids).values()))


def _sizes(grids: dict[str, list[Axis]]) -> dict[str, int]:
    return {m: math.prod(len(a.values) for a in axes) for m, axes in grids.items()}


def parse_tune(specs: list[str], methods: list[str], fixed: dict, seeds: int) -> Tuning | None:
    """`--tune` options -> each method's grid, checked: an unknown key or method, a key no method
    of the sweep reads (or a method-scoped key its method ignores), a key tuned twice for a
    method, or grids of different sizes are one-line errors. None without `--tune`."""
    if not specs:
        return None
    grids: dict[str, list[Axis]] = {m: [] for m in methods}
    for spec in specs:
        head, sep, text = spec.partition("=")
        scope, _, key = head.rpartition(":")
        key, scope = key.strip(), scope.strip()
        if not sep or not key:
            raise ConfigError(f"--tune expects [METHOD:]key=v1,v2, got '{spec}'")
        _check_key(key)
        axis = Axis.key(key, values(text, f"--tune {head}"))
        if scope and scope not in methods:
            raise ConfigError(f"--tune {head}: {scope} is not a method of this sweep "
                              f"({', '.join(methods)})")
        if scope:
            check_sweep([scope], [axis], fixed)
        targets = [scope] if scope else [m for m in methods if _reads(m, axis, fixed)]
        if not targets:
            raise ConfigError(f"--tune {key}: no method of this sweep reads it")
        for m in targets:
            if any(a.name == key for a in grids[m]):
                raise ConfigError(f"--tune: {key} is tuned twice for {m}")
            grids[m].append(axis)
    sizes = _sizes(grids)
    if len(set(sizes.values())) > 1:
        raise ConfigError("every method needs the same number of tuning runs, got "
                          + ", ".join(f"{m} {n}" for m, n in sizes.items())
                          + " points; give a smaller method more values or its own key "
                          "(--tune METHOD:key=v1,v2)")
    return Tuning(grids, [TUNE_SEED + i for i in range(seeds)])


def _reads(method: str, axis: Axis, fixed: dict) -> bool:
    try:
        check_sweep([method], [axis], fixed)
    except ConfigError:
        return False
    return True


def check_tuning(tuning: Tuning, axes: list[Axis], verdict_seeds: list[int]) -> None:
    """The verdict seeds must not be tuning seeds, and a key is either tuned or swept."""
    shared = sorted(set(verdict_seeds) & set(tuning.seeds))
    if shared:
        raise ConfigError(f"seed {shared[0]} would be both a verdict seed and a tuning seed "
                          f"(tuning runs on seeds {tuning.seeds[0]}-{tuning.seeds[-1]}): give "
                          f"--seed below {TUNE_SEED - len(verdict_seeds) + 1}")
    swept = {a.name for a in axes}
    both = sorted(swept & {a.name for g in tuning.grids.values() for a in g})
    if both:
        raise ConfigError(f"{both[0]} is both swept and tuned: tune it (--tune) or sweep it")


def tuning_sweep(sweep: Sweep, tuning: Tuning) -> Sweep:
    """The tuning runs as a sweep of their own in `<out>/tune`: one cell per (method, point),
    the sweep's base config and budget, the exploration seeds."""
    cells = [c for m, axes in tuning.grids.items() for c in plan([m], axes)]
    return Sweep(sweep.out / "tune", cells, list(tuning.seeds), sweep.config_file,
                 list(sweep.base_sets), sweep.budget)


def mean_of_checks(run: Path) -> float | None:
    """A finished run's mean held-out success over its checks after step 0 (None: no check)."""
    rows = read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").is_file() else []
    checks = [float(r["eval/success"]) for r in rows
              if r.get("step", 0) >= 1 and isinstance(r.get("eval/success"), (int, float))]
    return sum(checks) / len(checks) if checks else None


def record(ts: Sweep, tuning: Tuning) -> dict:
    """The tuning stage's record: the rule, the seeds, each method's grid, every tuning run's
    mean of checks, each point's score and each method's pick (None while a run of its grid is
    unfinished)."""
    methods: dict[str, dict] = {}
    for m, axes in tuning.grids.items():
        names = [a.name for a in axes]
        points = []
        for cell in (c for c in ts.cells if c.method == m):
            runs = {s: mean_of_checks(ts.run_dir(cell, s)) for s in ts.seeds
                    if status(ts.run_dir(cell, s)) == "finished"}
            scores = [v for v in runs.values() if v is not None]
            done = len(scores) == len(ts.seeds)
            points.append({"cell": cell.name, "values": _values(cell, names),
                           "sets": list(cell.sets), "mean_of_checks": runs,
                           "score": sum(scores) / len(scores) if done else None})
        ready = all(p["score"] is not None for p in points)
        pick = max(points, key=lambda p: p["score"]) if ready else None  # ties: the first
        methods[m] = {"keys": names, "points": points, "pick": pick and
                      {"values": pick["values"], "sets": pick["sets"], "score": pick["score"]}}
    return {"rule": RULE, "seeds": ts.seeds, "runs_per_method": tuning.points() * len(ts.seeds),
            "budget_tokens": ts.budget, "methods": methods}


def _values(cell: Cell, names: list[str]) -> dict[str, str]:
    """The point's value of each tuned key (full key names), from the cell's labels."""
    return {n: cell.params[n] for n in names}


def picks(rec: dict) -> dict[str, dict] | None:
    """Each method's pick, or None while any method's tuning is unfinished."""
    out = {m: d["pick"] for m, d in rec["methods"].items()}
    return None if any(p is None for p in out.values()) else out


def tuned_cells(cells: list[Cell], chosen: dict[str, dict]) -> list[Cell]:
    """The sweep's cells with their method's pick: its sets ahead of the cell's own, its
    values in `Cell.tuned` (shown in the results table)."""
    return [dataclasses.replace(c, sets=tuple(chosen[c.method]["sets"]) + c.sets,
                                tuned=dict(chosen[c.method]["values"]))
            if c.method in chosen else c for c in cells]


def run_tuning(sweep: Sweep, tuning: Tuning, jobs: int, log: Callable[[str], None],
               run: Callable[..., dict]) -> tuple[dict, list]:
    """Run (or reuse) every tuning run, write `<out>/tuning.json`, log each method's pick.
    `run` is the sweep runner (`ablate.run.run_sweep`). -> (record, failed runs)."""
    ts = tuning_sweep(sweep, tuning)
    check_rerun(ts)
    log(f"tuning: {len(tuning.grids)} method(s) x {tuning.points()} point(s) x "
        f"{len(tuning.seeds)} seed(s) ({','.join(map(str, tuning.seeds))}) -> {ts.out}")
    res = run(ts, jobs=jobs, log=log)
    rec = record(ts, tuning)
    atomic_write_text(sweep.out / "tuning.json", json.dumps(rec, indent=2))
    for m, d in rec["methods"].items():
        if d["pick"] is not None:
            chosen = " ".join(f"{k}={v}" for k, v in d["pick"]["values"].items()) or "(its defaults)"
            log(f"  {m}: picked {chosen} (mean of checks {d['pick']['score']:.3f} over "
                f"{len(tuning.seeds)} seed(s))")
    return rec, res["failed"]

"""The trainer's rollouts: `open_rollouts` gives a step's controller and keeps the generators'
weights current, in process or on Ray rollout workers.

What it composes lives beside it:
- `rollout.executors`: path jobs, the events they report, and the executors that run them on
  one engine (`rollout.vllm_paths` for vLLM);
- `rollout.pools`: one executor in this process, or Ray actors (`RolloutWorker`) each with its
  own engine and envs; `make_executor` (an engine's executor);
- `rollout.scheduler`: the path scheduler (FOCUS over a pool, on a virtual clock) and the path
  controllers (a `Controller` with `run_paths`: focus, linear);
- `rollout.values`: critic values at token positions (`CriticValues`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..envs.base import Task
from .controllers import CONTROLLERS, RolloutContext, RolloutResult
from .pools import RAY_TICKS, LocalPool, RayPool, make_executor, open_ray
from .scheduler import PathRunner
from .runtime import Runtime
from .values import CriticValues


@dataclass
class Rollouts:
    """How the trainer gets a step's episodes and keeps the generators' weights current.

    `run(ctx, tasks)` is the step's controller; `sync(model)` pushes new weights to wherever
    generation happens (a no-op for the in-process `hf` engine, which shares the model);
    `close()` releases workers."""

    run: Callable[[RolloutContext, list[Task]], RolloutResult]
    sync: Callable[[torch.nn.Module], None] = lambda model: None
    close: Callable[[], None] = lambda: None
    info: str = "in-process"


def open_rollouts(rt: Runtime, critic, out: Path,
                  log: Callable[[str], None] = print) -> Rollouts:
    """The trainer's rollouts of `rt.cfg`. In process: the registry controller on `rt.engine`
    (`hf`: token level), or, for a turn-level engine (`vllm`) and a controller in
    a `run_paths`, the path controller on a local executor of that engine (DAPO dynamic
    sampling, `vine` and evaluation use the engine's lock-step `new_batch`). With
    `rollout.workers > 0`: the path controller on Ray workers (each builds its own runtime).
    `rt.model`/`critic` give FOCUS its critic values."""
    cfg, engine, name = rt.cfg, rt.engine, rt.cfg.algo.controller
    sync = getattr(engine, "load_weights", None) or (lambda m: None)
    release = getattr(engine, "release", None) or (lambda: None)
    spec = CONTROLLERS.get(name)
    if cfg.rollout.workers == 0 and (getattr(engine, "token_level", True)
                                     or spec.run_paths is None or cfg.algo.dynamic_sampling):
        controller = spec.run

        def run(ctx, tasks):
            res = controller(ctx, tasks)
            release()  # a colocated engine frees its GPU memory for the update
            return res

        return Rollouts(run, sync, info=f"in process, {cfg.rollout.engine} engine")
    controller = spec.run_paths   # placement checked first (`app.preflight`)
    values = CriticValues(rt.model, critic)
    if cfg.rollout.workers == 0:
        executor = make_executor(engine, rt.fmt, rt.spec, rt.params, cfg.rollout.max_tokens)
        runner = PathRunner(LocalPool(executor), values, ticks=1)

        def run_local(ctx, tasks):
            res = controller(ctx, tasks, runner)
            release()
            return res

        return Rollouts(run_local, sync, info=f"in process, {cfg.rollout.engine} engine, path scheduler")
    started = open_ray(cfg, out, log)
    pool = RayPool(cfg, cfg.rollout.workers, log)
    runner = PathRunner(pool, values, ticks=RAY_TICKS)

    def close():
        pool.close()
        if started:
            import ray  # deferred: optional extra (ray)

            ray.shutdown()

    return Rollouts(lambda ctx, tasks: controller(ctx, tasks, runner),
                    lambda m: pool.sync(m.state_dict()), close,
                    info=f"{cfg.rollout.workers} Ray rollout workers ({cfg.rollout.engine} engine)")

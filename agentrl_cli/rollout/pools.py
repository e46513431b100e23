"""Pools of path executors for the path scheduler (`rollout.scheduler`): one in this process
(`LocalPool`), or Ray actors, each a `RolloutWorker` with its own engine and envs (`RayPool`);
`make_executor` builds the executor for an engine.

A pool starts an executor call (`start`: jobs to add, `ticks` tokens per path), and `wait`s for
finished calls: each gives the executor's `Report`, or the exception of an executor that died.
Faults: a dead Ray actor is `replace`d (same construction, latest weights; `ready` is False
until it is built), and the scheduler re-issues its in-flight paths.
"""
from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from ..config import RunConfig
from ..errors import ConfigError
from .executors import HFPathExecutor, PathExecutor, PathJob, Report

RAY_TICKS = 8  # tokens per path per Ray call: fewer round trips vs later slot refills


def make_executor(engine, fmt, spec, params, max_tokens, share: int = 64) -> PathExecutor:
    """The engine's path executor: one request per turn for a turn-level engine (vLLM: it
    declares `token_level = False`), else the hf one on a shared KV batch."""
    if not getattr(engine, "token_level", True):
        # deferred: optional extra (vllm)
        from .vllm_paths import VLLMPathExecutor

        return VLLMPathExecutor(engine, fmt, spec, params, max_tokens)
    return HFPathExecutor(engine, fmt, spec, params, max_tokens, share)


class LocalPool:
    """One executor in this process (a turn-level engine such as vLLM, or tests)."""

    def __init__(self, executor: PathExecutor):
        self.executors = [executor]
        self.size = 1
        self._out: list = []
        self._fresh = True

    def new_step(self) -> None:
        self._fresh = True

    def busy(self, w: int) -> bool:
        return bool(self._out)

    def ready(self, w: int) -> bool:
        return True

    def start(self, w: int, jobs: list[PathJob], ticks: int) -> None:
        self._out.append((w, self.executors[w].step(jobs, ticks, fresh=self._fresh)))
        self._fresh = False

    def wait(self) -> list[tuple[int, Report | Exception]]:
        out, self._out = self._out, []
        return out

    def replace(self, w: int) -> None:  # an in-process executor does not die on its own
        raise RuntimeError("local executor failed")


class RayPool:
    """`n` Ray actors, each a `RolloutWorker` (engine + envs). Weights arrive as one object ref
    per update (`sync`); a replaced actor gets the latest one before its first job."""

    def __init__(self, cfg: RunConfig, n: int, log: Callable[[str], None] = print):
        import ray  # deferred: optional extra (ray)

        self.ray = ray
        self.cfg, self.size, self.log = cfg, n, log
        opts = {"num_cpus": 1, "num_gpus": cfg.rollout.worker_gpus, "max_restarts": 0}
        self.actor_cls = ray.remote(**opts)(RolloutWorker)
        self.weights = None
        self.booting: dict[int, Any] = {}   # replaced actor -> its `ready` call
        self.actors = [self._new_actor() for _ in range(n)]
        self.ray.get([a.ready.remote() for a in self.actors])
        self.futures: dict[int, Any] = {}
        self.fresh = [True] * n
        self.replaced = 0

    def _new_actor(self):
        # the trainer's import path goes along, so a worker imports a user env's module
        # (`--env module:factory`) as the trainer did; a file env's path is absolute in the config
        a = self.actor_cls.remote(self.cfg, max(1, self.cfg.rollout.batch_size // self.size),
                                  list(sys.path))
        if self.weights is not None:
            a.load_weights.remote(self.weights)
        return a

    def ready(self, w: int) -> bool:
        """False while a replacement actor is still being built."""
        ref = self.booting.get(w)
        if ref is None:
            return True
        done, _ = self.ray.wait([ref], timeout=0)
        if done:
            del self.booting[w]
        return bool(done)

    def sync(self, state: dict) -> None:
        """New weights to every worker (a worker that died meanwhile is replaced with them)."""
        self.weights = self.ray.put({k: v.detach().to("cpu") for k, v in state.items()})
        calls = [a.load_weights.remote(self.weights) for a in self.actors]
        for w, ref in enumerate(calls):
            try:
                self.ray.get(ref)
            except self.ray.exceptions.RayActorError:
                self.replace(w)

    def new_step(self) -> None:
        self.fresh = [True] * self.size

    def busy(self, w: int) -> bool:
        return w in self.futures

    def start(self, w: int, jobs: list[PathJob], ticks: int) -> None:
        self.futures[w] = self.actors[w].step.remote(jobs, ticks, self.fresh[w])
        self.fresh[w] = False

    def wait(self) -> list[tuple[int, Report | Exception]]:
        by_ref = {ref: w for w, ref in self.futures.items()}
        done, _ = self.ray.wait(list(by_ref), num_returns=1)
        out = []
        for ref in done:
            w = by_ref[ref]
            del self.futures[w]
            try:
                out.append((w, self.ray.get(ref)))
            except self.ray.exceptions.RayActorError as e:
                out.append((w, e))
        return out

    def replace(self, w: int) -> None:
        self.log(f"rollout worker {w} died; replacing it and re-issuing its paths")
        try:
            self.ray.kill(self.actors[w])
        except Exception:
            pass
        self.actors[w] = self._new_actor()
        self.booting[w] = self.actors[w].ready.remote()
        self.fresh[w] = True
        self.replaced += 1

    def close(self) -> None:
        for a in self.actors:
            try:
                self.ray.kill(a)
            except Exception:
                pass


class RolloutWorker:
    """What runs inside one Ray actor: the policy's engine, the env spec and a path executor,
    built from the run's config (the model folder must be readable at the same path)."""

    def __init__(self, cfg: RunConfig, share: int, import_path: list[str] | None = None):
        sys.path.extend(p for p in import_path or [] if p not in sys.path)
        # deferred: inside the Ray actor, once the driver's import path is on sys.path
        from .runtime import build_runtime

        torch.set_num_threads(1)  # one CPU per actor (its Ray resource)
        rt = build_runtime(cfg, log=lambda s: None)
        self.engine = rt.engine
        self.executor = make_executor(rt.engine, rt.fmt, rt.spec, rt.params,
                                      cfg.rollout.max_tokens, share)

    def ready(self) -> bool:
        return True

    def load_weights(self, state: dict) -> None:
        load = getattr(self.engine, "load_weights", None)
        if load is not None:
            load(state)
        else:
            self.engine.model.load_state_dict(state, strict=False)

    def step(self, jobs: list[PathJob], ticks: int, fresh: bool) -> Report:
        return self.executor.step(jobs, ticks, fresh)


def ray_temp_dir(out: Path, log: Callable[[str], None] = print) -> str:
    """`<out>/ray`, or a short folder under the system temp dir when that path would make Ray's
    unix sockets (`<dir>/session_<date>_<time>_<pid>/sockets/plasma_store`) longer than the
    107-byte limit."""
    want = str((Path(out) / "ray").resolve())
    if len(want) + len("/session_2026-01-01_00-00-00_000000_0000000/sockets/plasma_store") <= 107:
        return want
    tag = hashlib.sha1(want.encode()).hexdigest()[:8]
    short = str(Path(tempfile.gettempdir()) / f"agentrl-ray-{tag}")
    log(f"Ray temp dir {want} is too long for unix sockets; using {short}")
    return short


def open_ray(cfg: RunConfig, out: Path, log: Callable[[str], None] = print) -> bool:
    """Join `rollout.ray_address`, or start a local Ray with one CPU per worker. Returns
    whether this call started Ray (and should shut it down)."""
    try:
        import ray  # deferred: optional extra (ray)
    except ImportError:
        raise ConfigError("rollout.workers > 0 needs Ray: pip install 'agentrl[ray]'") from None
    if ray.is_initialized():
        return False
    if cfg.rollout.ray_address:
        ray.init(address=cfg.rollout.ray_address, log_to_driver=False)
    else:
        ray.init(num_cpus=cfg.rollout.workers, _temp_dir=ray_temp_dir(out, log),
                 include_dashboard=False, log_to_driver=False)
    return True

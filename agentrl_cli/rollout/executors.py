"""Path jobs, the events they report, and the executors that run them on one engine.

The unit of work is a *path*: one episode generated from a start state (a task's prompt, or a
FOCUS node's context and env snapshot) until it ends. An executor runs many paths at once on its
own engine and environments and reports events on the virtual clock (see `rollout.scheduler`
for the clock and the scheduler that consumes them). `HFPathExecutor` runs on the hf engine's
KV batch through the per-token loop the in-process FOCUS runner uses (`rollout.token_loop`, with
its context operators); a turn-level engine (vLLM) gets `rollout.vllm_paths`
(`pools.make_executor` picks).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch

from ..engines.base import SamplingParams
from ..envs.base import EnvSpec, Task
from ..models.chat import ChatFormat
from ..types import Episode
from .planner import path_generator
from ..context.episode import LiveEpisode, append_turn, apply_step
from .token_loop import LoopPath, TokenLoop

INF = math.inf


# ----------------------------------------------------------------------------- jobs and events


@dataclass
class PathJob:
    """Start (or resume) one path on an executor."""

    pid: int                      # path id (its place in the step; seeds its generator)
    start_tick: int               # virtual tick of the path's next sampled token
    episode: Episode              # the path's context so far (token ids fed as they are)
    task: Task | None = None      # a root: reset a fresh env with this task
    snapshot: Any = None          # otherwise: restore a fresh env to this state
    seed: tuple[int, int] = (0, 0)            # (step base, seed index): a fresh path generator
    gen_state: torch.Tensor | None = None     # or resume this generator state
    fork_from: tuple[int, ...] = ()           # paths whose cache rows may hold the context


@dataclass
class PathEvent:
    pid: int
    tick: int                     # virtual tick of the token that ended the turn
    kind: str                     # "node" (a new segment-boundary state) | "finish"
    episode: Episode              # the path's episode (a copy; the whole episode on finish)
    depth: int = 0                # node: turns taken before the state
    position: int = 0             # node: tokens of context
    snapshot: Any = None          # node: env snapshot (None: the env cannot be forked/resumed)
    tool_calls: int = 0           # node: tool calls so far
    gen_state: torch.Tensor | None = None  # node: the path generator's state (for resuming)


@dataclass
class Report:
    events: list[PathEvent]
    through: dict[int, int]       # pid -> virtual tick of its latest sampled token
    tokens: int = 0               # tokens sampled during this call


# ----------------------------------------------------------------------------- executors


@dataclass
class _Run(LoopPath):
    """A path on an executor."""

    pid: int = -1
    tick: int = 0                 # virtual tick of its latest sampled token
    request: str | None = None    # in-flight engine request (vllm)
    turn_base: int = 0            # tick before the current turn's first token (vllm)


class PathExecutor:
    """Runs paths from jobs and reports their events (engine-independent part)."""

    def __init__(self, fmt: ChatFormat, spec: EnvSpec, params: SamplingParams, max_tokens: int):
        self.fmt, self.spec, self.params, self.max_tokens = fmt, spec, params, max_tokens
        self.active: list[_Run] = []

    def step(self, jobs: list[PathJob], ticks: int, fresh: bool = False) -> Report:
        """Start `jobs`, then run every path for up to `ticks` tokens. `fresh` drops all state
        of the previous step first (new weights make old cache rows stale)."""
        if fresh:
            self.reset()
        for job in jobs:
            self.active.append(self._start(job, self._make_run(job)))
        return self.advance(ticks)

    def reset(self) -> None:
        self.active = []

    def _make_run(self, job: PathJob) -> _Run:
        env = self.spec.make()
        if job.task is not None:
            env.reset(job.task)
        else:
            env.restore(job.snapshot)
        gen = torch.Generator()
        if job.gen_state is not None:
            gen.set_state(job.gen_state)
        else:
            gen = path_generator(*job.seed)
        return _Run(LiveEpisode(copy.deepcopy(job.episode), env), gen, pid=job.pid,
                    tick=job.start_tick - 1)

    def _start(self, job: PathJob, run: _Run) -> _Run:
        raise NotImplementedError

    def advance(self, ticks: int) -> Report:
        raise NotImplementedError

    def end_turn(self, run: _Run, ids: list[int], lps: list[float]) -> PathEvent:
        """A turn-level engine's finished turn: append it, step the env; a node event (the path
        goes on with `run.feed` = the observation) or a finish event."""
        fmt = self.fmt
        turn = append_turn(run.live.ep, ids, lps, fmt.decode_action(ids))
        run.feed = apply_step(run.live, fmt, turn, self.max_tokens, self.params.max_new_tokens)
        return self.event(run, run.feed is None)

    def event(self, run: _Run, finished: bool) -> PathEvent:
        """The event of a path that finished, or whose context reached a new segment-boundary
        state (with its env snapshot and generator state, to resume it there)."""
        ep = run.live.ep
        if finished:
            return PathEvent(run.pid, run.tick, "finish", ep)
        try:
            snap = run.live.env.snapshot()
        except Exception:  # an env without snapshots still rolls out, without branching
            snap = None
        return PathEvent(run.pid, run.tick, "node", copy.deepcopy(ep), depth=ep.num_turns,
                         position=len(ep.token_ids), snapshot=snap, tool_calls=ep.num_tool_calls,
                         gen_state=run.gen.get_state())


class HFPathExecutor(PathExecutor):
    """Paths on the `hf` engine: the per-token loop of `rollout.token_loop` (continuous batching
    over one growing `KVBatch`, one token of every running path per tick, context operators),
    as the in-process FOCUS runner runs it; finished rows stay parked as fork sources until the
    batch holds more than twice `share` rows."""

    def __init__(self, engine, fmt, spec, params, max_tokens, share: int = 64):
        super().__init__(fmt, spec, params, max_tokens)
        self.engine, self.share = engine, max(1, share)
        self.reset()

    def reset(self) -> None:
        super().reset()
        self.loop = TokenLoop(self.engine, self.fmt, self.params, self.max_tokens, self.share)

    kv = property(lambda self: self.loop.kv)
    parked = property(lambda self: self.loop.parked)

    def _start(self, job: PathJob, run: _Run) -> _Run:
        holders = {r.pid: r for r in self.active + self.loop.parked if r.row is not None}
        self.loop.start(run, [holders[q] for q in job.fork_from if q in holders])
        return run

    def advance(self, ticks: int) -> Report:
        events: list[PathEvent] = []
        touched: dict[int, _Run] = {}
        sampled = 0
        for _ in range(ticks):
            if not self.active:
                break
            running = list(self.active)
            ends = self.loop.tick(running)
            for r in running:
                r.tick += 1
                touched[r.pid] = r
            sampled += len(running)
            for end in ends:
                if end.finished or end.boundary:
                    events.append(self.event(end.path, end.finished))
                if end.finished:
                    self.active.remove(end.path)
                    self.loop.park(end.path)
            self.loop.compact(self.active)
        return Report(events, {pid: r.tick for pid, r in touched.items()}, sampled)

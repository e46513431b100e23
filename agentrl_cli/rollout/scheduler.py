"""The path scheduler: FOCUS (and GRPO-style groups) over a pool of path executors
(`rollout.executors`; pools in `rollout.pools`), on a virtual clock.

The unit of work is a *path*: one episode generated from a start state (a task's prompt, or a
FOCUS node's context and env snapshot) until it ends. An executor runs many paths at once on its
own engine and environments, and reports *events*: a path reached a new segment-boundary state
(a node: its position, env snapshot, and what is needed to resume the path there), or a path
finished (its episode). The allocator stays central: `PathScheduler` drives the FOCUS planner
(`planner.FocusPlanner`, which the in-process `FocusRunner` drives on its own engine): it keeps
the trees, processes events, and launches roots and continuations as jobs that go to whichever
executor has the fewest paths (preferring one that still holds the prefix's cache rows, where a
continuation is a KV fork instead of a prefill).

[our choice] Virtual clock, so that the result does not depend on where or how fast paths ran.
The in-process FOCUS runner samples one token of every running path per tick; a path launched
after tick j samples its k-th token at tick j + k. Executors label every event with that
virtual tick (they are free to run ahead), and the scheduler processes events in (tick, path id)
order, only up to the smallest tick every in-flight path has reported through; allocation happens
exactly where the in-process runner would do it (after a tick in which a path finished), with
the same token spend. Every path samples from its own generator (`planner.path_generator`), so
with the same seeds the scheduler builds the same trees and episodes as the in-process runner,
whatever the number of workers (tested with 1 executor and with 2 Ray workers, one killed
mid-step). The price is latency, not work: a freed slot is refilled once the slowest in-flight
path has reported past the tick it was freed at (at most one report, `ticks` tokens, late).

[our choice] Critic values of FOCUS nodes are computed by the trainer process, with the
trainer's model and value head (`rollout.values.CriticValues`), when the path through the node
finishes (one forward over the finished episode gives every node's last-context hidden state); a
node's value is only read once a leaf below it is complete, so this is exactly when the
in-process runner would first use it. Executors therefore need no value head, and vLLM (which
returns no hidden states) works.

Faults: a Ray worker that dies is replaced (`rollout.pools`); each of its in-flight paths is
re-issued from its last reported node (context, env snapshot and generator state travel with
every node event), or from its start when it had reported none. Events already processed are
kept, the lost worker's unreported tokens are generated again by the new owner: never lost,
never double counted (tested with `ray.kill` mid-step).

Controllers here (each a `controllers.Controller`'s `run_paths`): `focus` (the FOCUS step) and `linear` (GRPO-style
groups: roots only, in waves of whole groups under a token budget like the in-process `linear`;
per-episode generators `path_generator(base, i)`, so the episodes equal the in-process runner's
given the same per-episode generators, not its one-generator batches). DAPO dynamic sampling
and `vine` run in process only.
"""
from __future__ import annotations

import copy
import heapq
from dataclasses import dataclass
from typing import Any, Callable

from ..envs.base import Task
from ..errors import ConfigError
from ..types import Episode, EpisodeMeta
from .controllers import RolloutContext, RolloutResult, budget_waves, record_spend, spend_limit
from .executors import INF, PathEvent, PathJob, Report
from .planner import FocusPlanner, PlanPath, seed_base, timed_tree_step
from .tree import Node
from .values import CriticValues


class PathScheduler:
    """FOCUS (or, with `branching=False`, plain groups) over a pool of path executors, on the
    virtual clock of the module docstring: a driver of `planner.FocusPlanner`, which keeps the
    trees, gains, allocation, budget and results (as for the in-process runner); this class
    turns its launches into jobs and executor events back into planner calls."""

    def __init__(self, ctx: RolloutContext, tasks: list[Task], pool, values: CriticValues,
                 ticks: int = 1, branching: bool = True, base: int | None = None,
                 seed_offset: int = 0, after_report: Callable[["PathScheduler"], None] | None = None):
        base = seed_base(ctx.generator) if base is None else base
        self.ctx, self.tasks = ctx, tasks
        self.plan = FocusPlanner(ctx, tasks, base, branching=branching, generated=self._generated)
        self.capacity = self.plan.capacity
        self.pool, self.values, self.ticks, self.branching = pool, values, ticks, branching
        self.seed_offset, self.after_report = seed_offset, after_report
        self.now = -1
        self.jobs: list[PathJob] = []           # launched, not yet sent
        self.launch: dict[int, int] = {}        # pid -> tick of its first token
        self.finish_tick: dict[int, int] = {}   # pid -> tick of its last token (once reported)
        self.through: dict[int, int] = {}       # pid -> latest tick reported (in-flight paths)
        self.owner: dict[int, int] = {}         # pid -> executor running it
        self.queued: dict[int, list[PathJob]] = {}  # executor -> jobs for its next call
        self.ran_on: dict[int, int] = {}        # pid -> executor that ran it (fork hint)
        self.origin_job: dict[int, PathJob] = {}
        self.resume: dict[int, PathEvent] = {}  # pid -> its latest node event
        self.heap: list[tuple[int, int, int, PathEvent]] = []
        self.seq = 0
        self.reports = 0

    trees = property(lambda self: self.plan.trees)
    paths = property(lambda self: self.plan.paths)
    t_book = property(lambda self: self.plan.t_book)

    # -- launching (the planner's decisions become jobs) -----------------------------------

    def _generated(self, p: PlanPath) -> int:
        """On the virtual clock a running path has generated one token per tick since launch."""
        start = self.launch.get(p.pid)
        if start is None:
            return 0
        return max(0, min(self.now, self.finish_tick.get(p.pid, INF)) - start + 1)

    def _queue(self, p: PlanPath, job: PathJob) -> None:
        self.launch[p.pid] = self.now + 1
        self.through[p.pid] = self.now
        self.origin_job[p.pid] = job
        self.jobs.append(job)

    def _launch_root(self, g: int) -> None:
        p, _ = self.plan.open_root(g)        # the executor resets its own env to the task
        self._queue(p, PathJob(p.pid, self.now + 1, copy.deepcopy(p.ep), task=self.tasks[g],
                               seed=(self.plan.base, self.seed_offset + p.pid)))

    def _launch_from(self, p: PlanPath, node: Node) -> None:
        through = tuple(q for q in p.tree.through[node.id] if q != p.pid)
        self._queue(p, PathJob(p.pid, self.now + 1, copy.deepcopy(p.ep), snapshot=node.snapshot,
                               seed=(self.plan.base, self.seed_offset + p.pid), fork_from=through))

    def _fill(self) -> None:
        self.plan.fill(lambda: self.capacity - len(self.plan.active), self._launch_root,
                       self._launch_from)

    # -- the loop --------------------------------------------------------------------------

    def _assign(self, job: PathJob) -> int:
        """The least loaded ready executor, or one holding the context's cache rows if it has
        room; a replacement still starting up gets work only when no other executor is ready."""
        ready = [w for w in range(self.pool.size) if self.pool.ready(w)] or list(range(self.pool.size))
        load = [0] * self.pool.size
        for w in self.owner.values():
            load[w] += 1
        share = -(-self.capacity // len(ready))
        near = [self.ran_on[q] for q in job.fork_from if q in self.ran_on]
        near = [w for w in near if w in ready and load[w] < share]
        if near:
            return min(near, key=lambda w: load[w])
        return min(ready, key=lambda w: load[w])

    def _dispatch(self) -> None:
        """Assign new jobs to executors; start a call on every idle executor with work."""
        for job in self.jobs:
            w = self._assign(job)
            self.owner[job.pid] = self.ran_on[job.pid] = w
            self.queued.setdefault(w, []).append(job)
        self.jobs = []
        for w in range(self.pool.size):
            if self.pool.busy(w):
                continue
            mine = self.queued.pop(w, [])
            if mine or any(o == w for o in self.owner.values()):
                self.pool.start(w, mine, self.ticks)

    def _absorb(self, w: int, rep: Report) -> None:
        for ev in rep.events:
            if ev.pid not in self.through or self.owner.get(ev.pid) != w:
                continue  # a path re-issued elsewhere meanwhile (its old owner's late word)
            if ev.tick <= self.through[ev.pid]:  # it had reported no event up to there
                raise RuntimeError(f"path {ev.pid}: a re-issued path diverged from its first run")
            heapq.heappush(self.heap, (ev.tick, ev.pid, self.seq, ev))
            self.seq += 1
            if ev.kind == "node":
                self.resume[ev.pid] = ev
            else:
                self.finish_tick[ev.pid] = ev.tick
                del self.through[ev.pid]
                del self.owner[ev.pid]
        for pid, t in rep.through.items():
            if pid in self.through and self.owner.get(pid) == w:
                self.through[pid] = max(self.through[pid], t)

    def _recover(self, w: int) -> None:
        """Replace a dead executor; re-issue its paths from their last reported state."""
        self.pool.replace(w)
        unsent = self.queued.pop(w, [])
        sent = {j.pid for j in unsent}
        for job in unsent:
            del self.owner[job.pid]
            self.jobs.append(job)
        for pid in [q for q, o in self.owner.items() if o == w and q not in sent]:
            del self.owner[pid]
            ev = self.resume.get(pid)
            if ev is None:
                self.jobs.append(self.origin_job[pid])
            else:
                self.jobs.append(PathJob(pid, ev.tick + 1, ev.episode, snapshot=ev.snapshot,
                                         gen_state=ev.gen_state))

    def _gvt(self) -> float:
        return min(self.through.values(), default=INF)

    def _spent_at(self, tick: int) -> int:
        return sum(max(0, min(tick, self.finish_tick.get(pid, INF)) - start + 1)
                   for pid, start in self.launch.items())

    def _finishing(self, events: list[PathEvent]) -> None:
        """Critic values of the finishing paths' states that have none yet."""
        todo = []
        for ev in events:
            p = self.plan.paths[ev.pid]
            nodes = [p.tree.nodes[i] for i in p.nodes if p.tree.nodes[i].v is None]
            todo.append((ev.episode, nodes))
        vals = self.values([e for e, _ in todo], [[nd.position for nd in nds] for _, nds in todo])
        for (_, nds), vs in zip(todo, vals):
            for nd, v in zip(nds, vs):
                nd.v = v

    def _clock(self) -> None:
        """Process every event up to the virtual time all in-flight paths have passed."""
        while self.heap and self.heap[0][0] <= self._gvt():
            tick = self.heap[0][0]
            batch = []
            while self.heap and self.heap[0][0] == tick:
                batch.append(heapq.heappop(self.heap)[3])
            finishing = [ev for ev in batch if ev.kind == "finish"]
            self._finishing(finishing)
            for ev in batch:           # (tick, pid) order: the in-process runner's order
                p = self.plan.paths[ev.pid]
                if ev.kind == "node":
                    self.plan.grow(p, ev.depth, ev.position, ev.snapshot, ev.tool_calls)
                else:
                    self.plan.finish(p, ev.episode)
            if finishing:
                self.now = tick
                self.plan.spent = self._spent_at(tick)
                self._fill()

    def run(self) -> None:
        self.pool.new_step()
        self._fill()
        idle = 0                              # reports in a row without a token or an event
        while True:
            self._dispatch()
            if not any(self.pool.busy(w) for w in range(self.pool.size)):
                if self.jobs or self.through or self.heap:
                    raise RuntimeError("path scheduler stalled with work left")
                break
            for w, rep in self.pool.wait():
                if isinstance(rep, Exception):
                    self._recover(w)
                    continue
                self._absorb(w, rep)
                self.reports += 1
                idle = 0 if rep.tokens or rep.events else idle + 1
                if idle > 10_000:
                    raise RuntimeError("path scheduler: executors report no progress")
                if self.after_report is not None:
                    self.after_report(self)
            self._clock()

    def result(self) -> RolloutResult:
        return self.plan.result()


# ----------------------------------------------------------------------------- controllers


@dataclass
class PathRunner:
    """What the path controllers need besides the context: the pool, the critic values, the
    scheduler's tokens per executor call and an optional hook after each report (tests)."""

    pool: Any
    values: CriticValues
    ticks: int = 1
    after_report: Callable[[PathScheduler], None] | None = None


def focus_paths(ctx: RolloutContext, tasks: list[Task], runner: PathRunner) -> RolloutResult:
    """The FOCUS step (same trees as `rollout.focus.focus` given the same seeds)."""
    sched = PathScheduler(ctx, list(tasks), runner.pool, runner.values, runner.ticks,
                          after_report=runner.after_report)
    res = timed_tree_step(sched)
    res.metrics["rollout/worker_restarts"] = getattr(runner.pool, "replaced", 0)
    return res


def linear_paths(ctx: RolloutContext, tasks: list[Task], runner: PathRunner) -> RolloutResult:
    """`group_size` episodes per task; episode i (task-major) samples from
    `path_generator(base, i)`. With a token budget, groups go in the waves of
    `controllers.budget_waves`, as many as the step's limit (`controllers.spend_limit`) affords,
    drawing fresh training tasks once the step's own are spent and the limit still affords a
    group."""
    if ctx.algo.dynamic_sampling:
        raise ConfigError("algo.dynamic_sampling runs in process only (set rollout.workers=0)")
    base = seed_base(ctx.generator)
    tasks = list(tasks)
    asked = len(tasks)

    def launch(wave: list[Task], start: int) -> list[Episode]:
        sched = PathScheduler(ctx, list(wave), runner.pool, runner.values, runner.ticks,
                              branching=False, base=base, seed_offset=start * ctx.group_size,
                              after_report=runner.after_report)
        sched.run()
        out = []
        for p in sched.paths:
            ep = p.ep
            ep.group += start
            ep.meta = ep.meta.cleared(EpisodeMeta.PATH)
            out.append(ep)
        return out

    if ctx.budget_tokens > 0:
        eps = budget_waves(ctx, tasks, launch, spend_limit(ctx, "linear_spend"), extend=True)
        if eps:
            record_spend(ctx, "linear_spend", sum(e.generated_tokens for e in eps))
    else:
        eps = launch(tasks, 0)
    return RolloutResult(eps, metrics={"rollout/worker_restarts": getattr(runner.pool, "replaced", 0),
                                       "rollout/drawn_groups": len(tasks) - asked})

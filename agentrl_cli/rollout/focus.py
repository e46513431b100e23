"""The FOCUS controller, in process: an asynchronous tree rollout that spends the step's
generation budget where the critic is most wrong (docs/methods.md, focus).

The trees, the allocator, the budget and every bookkeeping rule are `planner.FocusPlanner`'s
(shared with the path scheduler, `rollout.scheduler`); this module is its in-process driver: it
moves tokens through one engine and tells the planner what happened.

Engine: the per-token loop of `rollout.token_loop` (shared with the path executors of the
Ray path scheduler): continuous batching over one growing `KVBatch`, every running row fed its
next input (a decode token, an observation, the prompt of a new root) in at most two forwards,
one token sampled per running row; no row ever waits for another row's turn (no lock-step
rounds). A continuation forks the cache of a row that holds the node's prefix (`KVBatch.fork`:
the K/V are copied, one token is refed); finished rows stay parked as fork sources until the
batch holds more than 2 x `batch_size` rows, then the oldest parked rows are dropped
(`planner.compact_rows`; a later fork from a state whose rows are all gone re-prefills the
prefix).

Every path samples from its own generator (`planner.path_generator`), so a path's tokens depend
only on its own context, never on which rows share the batch or when it was scheduled: with
branching disabled (`focus_roots = group_size` and no token budget) the step's episodes are
exactly those of the lock-step runner given the same per-episode generators (tested).

The critic value v of a node is the trainer's value head (`ctx.critic`) on the last hidden
state of the state's context (a separate critic: on its own model's, one forward over the
visible context), clamped to [0, 1] for the gains (raw in credit: `credit.focus_credit`); without a value
head v = 0.5 (what the untrained head outputs).

Context operators (`context/`): segment-boundary states are the context resets, so nodes sit
at window starts. A continuation stores the source's tokens up to the node (all windows) but
resumes from the node's *visible* context (prompt + current window): it forks a row that has
not reset since the node, or prefills the visible context. The allocator and the tree never
look at the operator.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..context.windows import visible_ids
from ..models.critic import is_separate
from .controllers import RolloutContext, RolloutResult
from ..context.episode import LiveEpisode
from .planner import FocusPlanner, PlanPath, env_snapshot, path_generator, seed_base, timed_tree_step
from .token_loop import LoopPath, TokenLoop
from .tree import Node
from .values import critic_values, head_values


@dataclass
class _Path(LoopPath):
    """A path's engine state in the in-process runner (its tree state is `plan`'s)."""

    plan: PlanPath | None = None

    # the planner's view, for readers of the runner's paths (tests, diagnostics)
    pid = property(lambda self: self.plan.pid)
    tree = property(lambda self: self.plan.tree)
    nodes = property(lambda self: self.plan.nodes)
    origin = property(lambda self: self.plan.origin)
    continuation = property(lambda self: self.plan.continuation)


class FocusRunner:
    """One step of FOCUS tree rollouts over `tasks` on the in-process engine: a driver of
    `planner.FocusPlanner` (see the module docstring)."""

    def __init__(self, ctx: RolloutContext, tasks: list):
        self.ctx, self.algo, self.tasks = ctx, ctx.algo, tasks
        self.plan = FocusPlanner(ctx, tasks, seed_base(ctx.generator), generated=self._generated)
        self.capacity = self.plan.capacity
        self.runs: dict[int, _Path] = {}     # pid -> engine state
        self.critic = getattr(ctx, "critic", None)
        self.loop = TokenLoop(ctx.engine, ctx.fmt, ctx.params, ctx.max_tokens, self.capacity,
                              keep_hidden=self.critic is not None and not is_separate(self.critic))
        self.kv = self.loop.kv
        self.value_wait: list[tuple[_Path, Node]] = []  # nodes whose v comes after the next extend

    # the planner's state, for readers of the runner (tests, diagnostics)
    trees = property(lambda self: self.plan.trees)
    paths = property(lambda self: [self.runs[p.pid] for p in self.plan.paths])
    active = property(lambda self: [self.runs[p.pid] for p in self.plan.active])

    def _generated(self, p: PlanPath) -> int:
        """Tokens path `p` has generated so far."""
        run = self.runs.get(p.pid)
        return p.ep.generated_tokens + (len(run.turn_ids) if run is not None else 0)

    # -- launching (the engine side of the planner's decisions) ------------------------------

    def _launch_root(self, g: int) -> None:
        plan, env = self.plan.open_root(g)
        p = self._track(plan, LiveEpisode(plan.ep, env))
        self.loop.start(p)
        root = plan.tree.nodes[0]
        if root.path == plan.pid:            # this root made the node: its value comes next
            self.value_wait.append((p, root))

    def _launch_from(self, plan: PlanPath, node: Node) -> None:
        env = self.ctx.spec.make()
        env.restore(node.snapshot)
        p = self._track(plan, LiveEpisode(plan.ep, env))
        self.loop.start(p, [self.runs[q] for q in plan.tree.through[node.id] if q != p.pid])

    def _track(self, plan: PlanPath, live: LiveEpisode) -> _Path:
        p = _Path(live, path_generator(self.plan.base, plan.pid), plan=plan)
        self.runs[plan.pid] = p
        return p

    def _fill(self) -> None:
        """Launch roots, then continuations, while slots and budget remain (the planner decides)."""
        self.plan.fill(lambda: self.capacity - len(self.plan.active), self._launch_root,
                       self._launch_from)

    # -- absorbing ---------------------------------------------------------------------------

    def _new_state(self, p: _Path) -> None:
        """The path's context now ends at a new segment-boundary state (after an observation)."""
        ep = p.live.ep
        node = self.plan.grow(p.plan, ep.num_turns, len(ep.token_ids), env_snapshot(p.live.env),
                              ep.num_tool_calls)
        self.value_wait.append((p, node))

    def _finish(self, p: _Path) -> None:
        self.plan.finish(p.plan, p.live.ep)
        self.loop.park(p)

    def _values(self) -> None:
        """Critic values of the states whose context was just fed (`rollout.values`): a value
        head reads the rows' last hidden states in the KV batch; a separate critic runs its own
        forward over each state's visible context."""
        if not self.value_wait or self.plan.algo.focus_critic == "oracle":
            self.value_wait = []          # an oracle's values came with the states (planner)
            return
        if self.kv.keep_hidden:
            rows = torch.tensor([p.row for p, _ in self.value_wait], dtype=torch.long)
            vals = head_values(self.critic, self.kv.last_hidden[rows])
        else:
            ctxs = [visible_ids(p.live.ep) for p, _ in self.value_wait]
            vals = [v for [v] in critic_values(None, self.critic, ctxs, [[len(c)] for c in ctxs])]
        for (_, nd), v in zip(self.value_wait, vals):
            nd.v = float(v)
        self.value_wait = []

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> None:
        self._fill()
        while self.plan.active:
            running = self.active
            ends = self.loop.tick(running, after_feed=self._values)
            self.plan.spent += len(running)
            for end in ends:
                if end.finished:
                    self._finish(end.path)
                elif end.boundary:
                    self._new_state(end.path)
            self.loop.compact(self.active)
            self._fill()

    def result(self) -> RolloutResult:
        return self.plan.result()


def focus(ctx: RolloutContext, tasks) -> RolloutResult:
    """FOCUS tree rollouts with gain-based continuation allocation (module docstring)."""
    runner = FocusRunner(ctx, list(tasks))
    res = timed_tree_step(runner)
    m = res.metrics
    # how continuations got their prefix: a fork of a row holding it, or a prefill (no row held
    # it any more: its sources were dropped from the batch, or reset their context since)
    loop = runner.loop
    m["focus/fork_starts"], m["focus/prefill_starts"] = loop.forked, loop.refilled
    m["focus/prefill_start_tokens"] = loop.refill_tokens
    return res

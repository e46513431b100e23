"""The FOCUS planner: the trees, the allocator and the launch/absorb rules of one step, with no
engine (docs/methods.md, focus). Two drivers compose it and only move tokens:
`rollout.focus.FocusRunner` (one in-process KV batch) and `rollout.scheduler.PathScheduler`
(path executors, local or on Ray workers, on a virtual clock). Whatever a rule decides (which
node gets the next continuation, when the budget is spent, what a continuation's episode
inherits, how a path's outcome counts as evidence, what the step reports) is written here once,
so both drivers build the same trees from the same seeds (tested).

A driver calls:
- `fill(free, start_root, start_branch)` whenever slots may have freed: the planner opens roots
  (`open_root` builds the root's env and episode), then continuations while the budget lasts,
  and hands each new path to the driver's callback;
- `grow(path, depth, position, snapshot, tool_calls)` when a running path reaches a new
  segment-boundary state (after an observation), and `finish(path, episode)` when it ends;
- `result()` after the last path finished.
Node critic values (`Node.v`) are the driver's: it knows where the hidden states are.

[our choice] Reproducibility: every path samples from its own generator, seeded from the step
generator and the path's id (`path_generator`). Root paths get ids 0..R-1 task-major (the linear
controller's (task, group) order), continuations R, R+1, ... in launch order.

[our choice] Budget: with `rollout.budget_tokens > 0` the step's *committed* tokens are what it
has generated plus what its running paths are expected to still generate (a root priced at the
mean finished root; a continuation at its launch price: the mean tokens that finished paths
through its origin generated after that node, the same pricing as VinePPO's plan). A
continuation is launched only if the committed tokens plus its own price fit the budget (the
method: a continuation in flight is charged its expected length at launch), so the step does not
overshoot by what is in flight. Prices are estimates from the paths that finished first, the
short ones, so steps still overshot (by 5% over a 100-step search-long run). The trainer's
`ctx.carry` keeps the run's tokens and budgets so far, and a step's launch limit is its budget
less the run's debt (what the earlier steps generated beyond their budgets, net): the run's total
spend then stays within one step's overshoot of its total budget, and no step launches beyond
its own budget. The rollout command's single step has no history and launches up to the budget.
Without a budget the step completes `tasks x group_size` paths, as many episodes as GRPO (roots
included; the roots per task are capped at `group_size`).
Roots are launched before any continuation.

[our choice] Training data: every path is an episode. A continuation from state s_k inherits
the source episode's first `position` tokens with `response_mask` 0 (turn/segment index -1), so
each segment's policy tokens are trained exactly once, in the path that generated them.

Allocators (`algo.focus_allocator`): `focus` (largest gain; ties: the shallower node, then the
older one), `uniform` (fewest continuations launched from the node so far), `random`,
`raw-residual` (largest |v - cbar|, no calibration), or a user's (`FILE.py:NAME`,
`module:NAME`, an `agentrl.allocators` entry point; docs/methods.md). Each is called as
`allocate(candidates, ctx)` with an `AllocatorContext` and returns a candidate or None.
"""
from __future__ import annotations

import copy
import itertools
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, fields, replace
from typing import Any, Callable

import torch

from ..context.episode import new_episode, start_context
from ..context.windows import inherit_windows
from ..credit.focus import focus_gain
from ..envs import guard, plugins
from ..errors import ConfigError
from ..metrics import spearman
from ..registry import Registry
from ..credit.focus_credit import FocusTrees
from ..types import Episode, EpisodeMeta, Payload
from .controllers import (RolloutContext, RolloutResult, StepTiming, record_spend, shape_rewards,
                          spend_limit)
from .tree import Node, Tree

# ----------------------------------------------------------------------------- RNG


def seed_base(generator: torch.Generator) -> int:
    """The step's one draw from its generator; every path's generator derives from it."""
    return int(torch.randint(0, 2**62, (1,), generator=generator))


def path_generator(base: int, path: int) -> torch.Generator:
    return torch.Generator().manual_seed((base * 1_000_003 + path * 7919 + 17) % (2**63 - 1))


# ----------------------------------------------------------------------------- allocators


def gain(node: Node, kappa: float, kind: str) -> float:
    """`focus_gain` of a node with n_eff = n + inflight (0 while it has no completed own sample)."""
    if node.n == 0 or node.terminal:
        return 0.0
    v = min(1.0, max(0.0, 0.5 if node.v is None else node.v))
    return focus_gain(v, node.n, node.cbar, kappa, node.inflight, kind)


@dataclass(frozen=True)
class AllocatorContext:
    """What an allocator reads besides its candidates: the run's `algo` config section (None
    in a bare call), the step's allocation rng, and the step's trees (every node, candidate or
    not)."""

    algo: Any
    rng: random.Random | None
    trees: list[Tree]


Allocator = Callable[[list[Node], AllocatorContext], "Node | None"]
ENTRY_POINTS = "agentrl.allocators"


def _checked_allocator(name: str, fn: Any) -> Allocator:
    """A user's allocator (`FILE.py:NAME`, `module:NAME`, an `agentrl.allocators` entry point,
    loaded by `envs.plugins` as user envs are): a function, else one line."""
    if not callable(fn):
        raise ConfigError(f"focus allocator '{name}' is a {type(fn).__name__}, not a function "
                          "fn(candidates, ctx) -> node or None")
    return fn


class NodeCopy(Node):
    """A copy of a `Node` handed to a user's allocator: its fields and children list its own,
    its env snapshot deep-copied on first read (most allocators never read it)."""

    def __init__(self, node: Node):
        for f in fields(Node):
            if f.name != "snapshot":
                setattr(self, f.name, getattr(node, f.name))
        self.children = list(node.children)
        self._source, self._copied = node.snapshot, False

    @property
    def snapshot(self) -> Any:
        if not self._copied:
            self._snap, self._copied = copy.deepcopy(self._source), True
        return self._snap

    @snapshot.setter
    def snapshot(self, value: Any) -> None:
        self._snap, self._copied = value, True


def allocator_view(cands: list[Node], ctx: AllocatorContext) -> tuple[list[Node], AllocatorContext]:
    """Copies of what an allocator is handed: the candidates and the step's trees (nodes, paths,
    their lists), the candidates being nodes of the copied trees; `ctx.algo` (frozen) and
    `ctx.rng` (the step's allocation generator, advanced by the allocator's draws) are the run's."""
    copies: dict[int, Node] = {}
    trees = []
    for t in ctx.trees:
        nodes = [NodeCopy(nd) for nd in t.nodes]
        copies.update((id(nd), c) for nd, c in zip(t.nodes, nodes))
        trees.append(Tree(t.task_id, t.group, nodes, {k: list(v) for k, v in t.paths.items()},
                          {k: list(v) for k, v in t.through.items()}))
    return [copies.get(id(nd)) or NodeCopy(nd) for nd in cands], replace(ctx, trees=trees)


def guarded_allocator(name: str, fn: Allocator, timeout_s: float) -> Allocator:
    """A user's allocator `fn` run as an env's steps are (`envs.guard.call_user`: within
    `timeout_s`, an exception, exit or timeout is one line naming it, its file and the step's
    tasks), on copies of its inputs (`allocator_view`: changing them changes nothing in the run;
    the copy it picks stands for the candidate it copies); a built-in one (a registered name) as
    it is."""
    if Registry.__contains__(ALLOCATORS, name):
        return fn

    def allocate(cands: list[Node], ctx: AllocatorContext) -> Node | None:
        tasks = ", ".join(dict.fromkeys(t.task_id for t in ctx.trees))
        view, view_ctx = allocator_view(cands, ctx)
        pick = guard.call_user(fn, (list(view), view_ctx), {}, timeout_s,
                               f"focus allocator '{name}' on tasks {tasks:.120}")
        return next((nd for nd, c in zip(cands, view) if c is pick), pick)

    return allocate


ALLOCATORS = plugins.PluginRegistry("focus allocator", ENTRY_POINTS,
                                    "your own: FILE.py:NAME, module:NAME", _checked_allocator)

# What the planner reads of `algo` (the FOCUS controllers, in process and on the path
# scheduler, declare it where they register): allocation only, credit is `credit.focus_credit`'s
PLANNER_READS = ("algo.focus_roots", "algo.focus_allocator", "algo.focus_gain", "algo.focus_critic",
                 "algo.focus_evidence", "algo.focus_max_inflight", "algo.focus_min_depth", "algo.kappa",
                 "algo.overlong_shaping", "algo.overlong_cache", "algo.rewards", "algo.reward_mode")


@ALLOCATORS.register("focus")
def _largest_gain(cands: list[Node], ctx: AllocatorContext) -> Node | None:
    best = max(cands, key=lambda nd: (nd.g, -nd.depth))  # ties: shallower, then older (first)
    return best if best.g > 0 else None


@ALLOCATORS.register("uniform")
def _uniform(cands: list[Node], ctx: AllocatorContext) -> Node:
    return min(cands, key=lambda nd: nd.launched)


@ALLOCATORS.register("random")
def _random(cands: list[Node], ctx: AllocatorContext) -> Node:
    return cands[ctx.rng.randrange(len(cands))]


@ALLOCATORS.register("entropy")
def _entropy(cands: list[Node], ctx: AllocatorContext) -> Node:
    """TreeRL's / ARPO's rule at turn boundaries: among the candidates with the fewest
    continuations launched so far, the state whose next turn was sampled with the highest mean
    surprisal (`Node.h`); each round of launches thus takes the most uncertain states first,
    one continuation each (TreeRL forks the top-N entropy points per iteration)."""
    fewest = min(nd.launched for nd in cands)
    return max((nd for nd in cands if nd.launched == fewest),
               key=lambda nd: (-math.inf if nd.h is None else nd.h, -nd.depth))


@ALLOCATORS.register("raw-residual")
def _raw_residual(cands: list[Node], ctx: AllocatorContext) -> Node:
    return max(cands, key=lambda nd: abs((0.5 if nd.v is None else nd.v) - nd.cbar))


def pick_continuation(trees: list[Tree], allocate: Allocator, rng: random.Random | None,
                      max_inflight: int, min_depth: int = 0,
                      algo: Any = None) -> tuple[Tree, Node] | None:
    """The allocation decision: the (tree, node) to launch the next continuation from, or None.

    Candidates are non-terminal, resumable nodes at least `min_depth` segments deep
    (`algo.focus_min_depth`) with at least one completed own sample and fewer than
    `max_inflight` of their own continuations running; `allocate` (one of
    `ALLOCATORS`) picks among them, called with an `AllocatorContext(algo, rng, trees)`; a pick
    that is not one of the candidates is a one-line ConfigError. Shared with the audit-tree diagnostic (`diagnostics.audit`),
    so both make exactly the same choice from the same tree state.
    """
    cands = [(tree, nd) for tree in trees for nd in tree.nodes
             if nd.n > 0 and not nd.terminal and nd.resumable and nd.own_inflight < max_inflight
             and nd.depth >= min_depth]
    pick = allocate([nd for _, nd in cands], AllocatorContext(algo, rng, trees)) if cands else None
    if pick is None:
        return None
    found = next(((t, nd) for t, nd in cands if nd is pick), None)
    if found is None:
        name = getattr(algo, "focus_allocator", None) or getattr(allocate, "__name__", "allocator")
        raise ConfigError(f"focus allocator '{name}' returned {type(pick).__name__}, not one of "
                          "its candidates (or None)")
    return found


# ----------------------------------------------------------------------------- episodes


def branch_episode(src: Episode, node: Node) -> Episode:
    """The episode a continuation from `node` starts with: the source path's first `position`
    tokens (not trained again: response_mask 0, turn/segment index -1), its turns before the
    node, its segment starts before the node, its context windows up to there."""
    k, pos = node.depth, node.position
    ep = Episode(task_id=src.task_id, group=src.group, token_ids=src.token_ids[:pos],
                 response_mask=[0] * pos, logprobs=[0.0] * pos, turn_index=[-1] * pos,
                 segment_starts=[s for s in src.segment_starts if s < pos],
                 turns=[replace(t) for t in src.turns[:k]], segment_index=[-1] * pos,
                 answer=src.answer, meta=src.meta.cleared(EpisodeMeta.PATH + EpisodeMeta.SHAPED),
                 num_tool_calls=node.tool_calls)
    inherit_windows(ep, src, pos)
    return ep


def turn_surprisal(tree: Tree, node_ids: list[int], ep: Episode) -> None:
    """Fill `Node.h` of the path's nodes that have none: the mean -log-prob of the policy tokens
    `ep` sampled between the node and the next one (a prefix the path inherited carries no
    log-probs and fills nothing)."""
    for a, b in zip(node_ids, node_ids[1:]):
        nd = tree.nodes[a]
        if nd.h is not None:
            continue
        lps = [-ep.logprobs[i] for i in range(nd.position, tree.nodes[b].position)
               if ep.response_mask[i]]
        if lps:
            nd.h = sum(lps) / len(lps)


def oracle_value(spec, snapshot) -> float | None:
    """The env's own success probability of a state (`algo.focus_critic=oracle`): a fresh env
    restored to `snapshot`, asked `oracle_value()` (None without a snapshot)."""
    if snapshot is None:
        return None
    env = spec.make()
    env.restore(snapshot)
    return float(env.oracle_value())


def env_snapshot(env) -> Any:
    """The env's snapshot, or None for an env that cannot be forked (it still rolls out)."""
    try:
        return env.snapshot()
    except Exception:
        return None


def compact_rows(kv, active: list, parked: list, share: int) -> list:
    """Drop the oldest parked rows (finished paths kept as fork sources) once the KV batch
    holds more than `2 x max(share, running)` rows; in a batch with holes (`engines.kv_batch.KVBatch`;
    a ragged batch has none) repack the cache when it is more than 1.25
    times as wide as its longest row (plus 32 columns): a decode forward attends every column,
    holes too, and at 1.5 times (plus 64) a FOCUS rollout's decode attention was 48% real
    tokens, at 1.25 57% (`benchmarks/bench_step.py`: 1.06x tokens per CPU-second; 1.125 packed
    more often for no further gain). Items carry a `.row` (None once dropped). Returns the parked
    items still holding rows."""
    if kv.n > 2 * max(share, len(active)):
        for q in parked[:-share]:
            q.row = None
        parked = parked[-share:]
        holders = sorted(active + parked, key=lambda q: q.row)
        kv.keep([q.row for q in holders])
        for i, q in enumerate(holders):
            q.row = i
    holes = kv.n and not getattr(kv, "ragged", False)
    if holes and kv.mask.shape[1] > 5 * int(kv.lengths.max()) // 4 + 32:
        kv.pack()
    return parked


# ----------------------------------------------------------------------------- the planner


@dataclass
class PlanPath:
    """One path of the step, as the planner sees it."""

    pid: int
    tree: Tree
    ep: Episode                   # its episode (the driver keeps it current)
    nodes: list[int]              # node ids root..current state (..leaf when finished)
    origin: int                   # node it was launched from (the root for root paths)
    continuation: bool
    price: float = 0.0            # continuation: expected tokens it generates (budget)
    done: bool = False


class FocusPlanner:
    """One step's trees, allocator and launch/absorb rules (module docstring)."""

    def __init__(self, ctx: RolloutContext, tasks: list, base: int, branching: bool = True,
                 generated: Callable[[PlanPath], int] | None = None):
        algo = ctx.algo                   # its names are checked before any work (`app.preflight`)
        self.ctx, self.algo, self.tasks, self.base = ctx, algo, tasks, base
        self.branching = branching
        self.rule = algo.focus_evidence
        self.allocate = guarded_allocator(algo.focus_allocator, ALLOCATORS.get(algo.focus_allocator),
                                          guard.user_timeout(ctx.spec))
        self.capacity = max(1, ctx.batch_size)
        self.rng = random.Random(base + 1)
        self.trees = [Tree(t.task_id, g) for g, t in enumerate(tasks)]
        self.paths: list[PlanPath] = []
        self.active: list[PlanPath] = []
        roots = max(1, algo.focus_roots) if branching else ctx.group_size
        if ctx.budget_tokens <= 0:
            roots = min(roots, ctx.group_size)
        self.root_queue = [g for g in range(len(tasks)) for _ in range(roots)]
        self.target_paths = len(tasks) * ctx.group_size
        self.generated = generated or (lambda p: p.ep.generated_tokens)
        self.spent = 0                # tokens generated so far (the driver keeps it current)
        # the launch limit: the budget, plus what the run's earlier steps left unspent, less
        # what they overspent (`controllers.spend_limit`, `ctx.carry["focus_spend"]`)
        self.limit = spend_limit(ctx, "focus_spend")
        self.t_book = 0.0             # seconds in allocation and tree bookkeeping

    # -- launching -------------------------------------------------------------------------

    def _register(self, tree: Tree, ep: Episode, origin: int, continuation: bool) -> PlanPath:
        pid = len(self.paths)
        nodes = tree.start_path(pid, origin, continuation, self.rule)
        p = PlanPath(pid, tree, ep, nodes, origin, continuation)
        ep.meta.focus_tree, ep.meta.focus_path, ep.meta.focus_origin = tree.group, pid, origin
        self.paths.append(p)
        self.active.append(p)
        self._regain(tree, nodes)
        return p

    def open_root(self, g: int) -> tuple[PlanPath, Any]:
        """A root episode of task `g`: a fresh env reset to the task, the episode holding its
        prompt (under the env's context operator, if any), booked in flight. The tree's root
        node is made by the task's first root (with the env's snapshot); that root path is the
        node's `path`. Returns the path and its env."""
        t0 = time.perf_counter()
        task, tree = self.tasks[g], self.trees[g]
        env = self.ctx.spec.make()
        user = env.reset(task)
        prompt = self.ctx.fmt.prompt_ids(env.system_prompt, user, getattr(env, "tool_schemas", None))
        ep = new_episode(task, g, prompt)
        start_context(ep, env)
        if not tree.nodes:
            root = tree.add(-1, 0, len(ep.token_ids), len(self.paths))
            self._state(root, env_snapshot(env), ep.num_tool_calls)
            if self.algo.focus_critic == "oracle":
                root.v = oracle_value(self.ctx.spec, root.snapshot)
        p = self._register(tree, ep, 0, continuation=False)
        self.t_book += time.perf_counter() - t0
        return p, env

    def branch(self, tree: Tree, node: Node) -> PlanPath:
        """A continuation from `node`: its episode (`branch_episode` of the path that created
        the node), booked in flight."""
        src = self.paths[node.path].ep
        return self._register(tree, branch_episode(src, node), node.id, continuation=True)

    def budget_left(self) -> bool:
        if not self.branching:
            return False
        if self.ctx.budget_tokens > 0:
            return self.committed() < self.limit
        return len(self.paths) < self.target_paths

    def committed(self) -> float:
        """Tokens generated so far plus the running paths' expected remaining tokens."""
        root = self._root_price()
        return self.spent + sum(max(0.0, (p.price if p.continuation else root) - self.generated(p))
                                for p in self.active)

    def price(self, tree: Tree, node: Node) -> float:
        """Expected tokens a continuation from `node` generates: the mean that the finished
        paths through the node generated after its position (at least 1)."""
        done = [self.paths[q].ep for q in tree.through[node.id] if q in tree.paths]
        if not done:
            return 1.0
        after = [sum(e.response_mask[node.position:]) for e in done]
        return max(1.0, sum(after) / len(after))

    def _root_price(self) -> float:
        roots = [p.ep.generated_tokens for p in self.paths if not p.continuation and p.done]
        return sum(roots) / len(roots) if roots else 0.0

    def fill(self, free: Callable[[], int], start_root: Callable[[int], None],
             start_branch: Callable[[PlanPath, Node], None]) -> None:
        """Open roots, then continuations, while the driver has free slots (`free()`) and the
        budget lasts. `start_root(g)` builds a root of task g (calling `open_root`);
        `start_branch(path, node)` starts the engine work of a continuation the planner has
        booked (`branch`) from `node`."""
        while self.root_queue and free() > 0:
            start_root(self.root_queue.pop(0))
        if self.root_queue:
            return
        while free() > 0 and self.budget_left():
            t0 = time.perf_counter()
            pick = pick_continuation(self.trees, self.allocate, self.rng, self.algo.focus_max_inflight,
                                     self.algo.focus_min_depth, self.algo)
            cost = 0.0 if pick is None else self.price(*pick)
            stop = pick is None or (self.ctx.budget_tokens > 0 and
                                    self.committed() + cost > self.limit)
            self.t_book += time.perf_counter() - t0
            if stop:
                break
            p = self.branch(*pick)
            p.price = cost
            start_branch(p, pick[1])

    # -- absorbing -------------------------------------------------------------------------

    def _regain(self, tree: Tree, node_ids: list[int]) -> None:
        for nid in node_ids:
            nd = tree.nodes[nid]
            nd.g = gain(nd, self.algo.kappa, self.algo.focus_gain)

    def _state(self, node: Node, snapshot, tool_calls: int) -> None:
        node.snapshot, node.tool_calls = snapshot, tool_calls
        node.resumable = (snapshot is not None and
                          node.position + self.ctx.params.max_new_tokens <= self.ctx.max_tokens)

    def grow(self, p: PlanPath, depth: int, position: int, snapshot, tool_calls: int) -> Node:
        """Path `p` reached a new segment-boundary state (with `algo.focus_critic=oracle`, its
        value is the env's `oracle_value()` there)."""
        t0 = time.perf_counter()
        node = p.tree.grow(p.pid, p.nodes, depth, position)
        self._state(node, snapshot, tool_calls)
        if self.algo.focus_critic == "oracle":
            node.v = oracle_value(self.ctx.spec, snapshot)
        self.t_book += time.perf_counter() - t0
        return node

    def finish(self, p: PlanPath, ep: Episode) -> Node:
        """Path `p` ended with episode `ep`: shape its reward, add its leaf, update evidence."""
        t0 = time.perf_counter()
        p.ep = ep
        shape_rewards([ep], self.ctx)
        leaf = p.tree.land(p.pid, p.nodes, p.origin, p.continuation, float(ep.reward),
                           ep.num_turns, len(ep.token_ids), self.rule, tool_calls=ep.num_tool_calls)
        turn_surprisal(p.tree, p.tree.paths[p.pid], ep)
        p.done = True
        self._regain(p.tree, p.nodes)
        self.active.remove(p)
        self.t_book += time.perf_counter() - t0
        return leaf

    # -- results ---------------------------------------------------------------------------

    def result(self) -> RolloutResult:
        """The step's episodes (path p is episode p), its trees (the `Tree`s, for traces and
        `agentrl rollout`, and as the estimator's payload the same trees as plain arrays,
        `credit.focus_credit.FocusTrees`) and its metrics."""
        eps = [p.ep for p in self.paths]
        metrics = self.metrics(eps)
        if self.ctx.budget_tokens > 0 and self.branching:
            record_spend(self.ctx, "focus_spend", metrics["focus/tokens"])
        return RolloutResult(eps, metrics=metrics, trees=self.trees,
                             payload=Payload(FocusTrees([t.arrays() for t in self.trees])))

    def metrics(self, eps: list[Episode]) -> dict:
        inner = [nd for t in self.trees for nd in t.nodes if not nd.terminal]
        with_n = [nd for nd in inner if nd.n > 0 and nd.v is not None]
        tokens = sum(e.generated_tokens for e in eps)
        conts = [p for p in self.paths if p.continuation]
        branch = sum(p.ep.generated_tokens for p in conts)
        depths = Counter(p.tree.nodes[p.origin].depth for p in conts)
        out = {
            "focus/nodes": sum(len(t.nodes) for t in self.trees),
            "focus/continuations": len(conts),
            "focus/tokens": tokens,
            "focus/abs_v_minus_cbar": (sum(abs(nd.v - nd.cbar) for nd in with_n) / len(with_n)
                                       if with_n else 0.0),
            "focus/tool_calls_per_episode": sum(e.num_tool_calls for e in eps) / max(1, len(eps)),
            "focus/branch_token_share": branch / tokens if tokens else 0.0,
            # trees left with their roots only: no continuation was worth the budget there
            "focus/unbranched_trees": (1 - len({id(p.tree) for p in conts}) / len(self.trees)
                                       if self.trees else 0.0),
            "focus/launch_depth_mean": (sum(d * c for d, c in depths.items()) / len(conts)
                                        if conts else 0.0),
            "focus/bookkeeping_seconds": self.t_book,
        }
        for d in sorted(depths):   # share of the step's continuations launched at each depth
            out[f"focus/launch_share_depth{d}"] = depths[d] / len(conts)
        rank = critic_rank(self.trees)
        if rank is not None:
            out["focus/critic_rank"] = rank
        out.update(outcome_agreement(self.paths))
        return out


def outcome_agreement(paths: list[PlanPath]) -> dict:
    """How often a continuation ends as the path it branched from (the path that first reached
    its origin state): `focus/continuation_agreement`; and, for comparison, how often two root
    paths of one tree end alike (`focus/root_agreement`, independent samples of the task). A
    continuation that repeats its origin's outcome adds no contrast to its tree. Rewards are
    compared as the group metrics compare them (equal or not); a share is left out when it
    has nothing to count."""
    out = {}
    conts = [p for p in paths if p.continuation]
    if conts:
        same = sum(p.ep.reward == paths[p.tree.nodes[p.origin].path].ep.reward for p in conts)
        out["focus/continuation_agreement"] = same / len(conts)
    roots: dict[int, list[float]] = {}
    for p in paths:
        if not p.continuation:
            roots.setdefault(id(p.tree), []).append(p.ep.reward)
    pairs = [pair for rs in roots.values() for pair in itertools.combinations(rs, 2)]
    if pairs:
        out["focus/root_agreement"] = sum(a == b for a, b in pairs) / len(pairs)
    return out


def critic_rank(trees: list[Tree]) -> float | None:
    """Spearman's rho between the critic's V(s) and the mean outcome of the samples that ran
    from s (`cbar`), over the step's non-terminal states with both: does the critic order the
    states the way the tree's own outcomes do? None when undefined (under two such states, or
    either side constant). Free (no extra samples), but noisy: a state's cbar averages a few
    outcomes; `agentrl diagnose critic-rank` measures it against fresh continuations."""
    pairs = [(nd.v, nd.cbar) for t in trees for nd in t.nodes
             if not nd.terminal and nd.n > 0 and nd.v is not None]
    return spearman([v for v, _ in pairs], [c for _, c in pairs])


def timed_tree_step(driver) -> RolloutResult:
    """Run a FOCUS step's driver (the in-process `focus.FocusRunner` or the path scheduler's
    `scheduler.PathScheduler`: each has `run()`, `result()` and its `plan`) and time it: the
    result's `timing` and its `focus/bookkeeping_share` metric."""
    t0 = time.perf_counter()
    driver.run()
    res = driver.result()
    wall = time.perf_counter() - t0
    res.metrics["focus/bookkeeping_share"] = driver.plan.t_book / max(wall, 1e-9)
    res.timing = StepTiming(wall, driver.plan.t_book)
    return res

"""The audit tree (docs/methods.md): how fast does each continuation allocator lower the error of
the refined values on a tree whose true node values are known?

A *world* supplies the states: root episodes (the fixed audit tree) and continuations from any
of its states. Two worlds exist:

- `SyntheticWorld` (instant, the default): tasks are explicit finite Markov trees of latent
  states with Bernoulli leaves, so every true value is exact (`LatentTree.value`). A continuation
  from a node samples a fresh path of latent states below the node's latent state; every state
  it passes becomes a new node (one node per visit, as in the real rollout).
- `diagnostics.audit_env.EnvWorld`: root episodes of a checkpoint's policy on an env; each
  audit state's true value is the mean reward of many fresh continuations from it.

Candidates [our choice]: by default only the audit tree's own states can be branched from (the
tree is fixed; continuations add evidence below them), so `uniform` is exactly round-robin over
the audit states and every allocator spends its budget on the states that are measured. With
`grow=True` (synthetic world) the states continuations reach are candidates too, as in training.

The simulation uses the real FOCUS machinery: the node statistics of `rollout.tree.Node`
(`n`, `cbar`, `inflight`, `launched`, `own_inflight`), their gain `rollout.planner.gain`
(`credit.focus_gain`), the allocators of `rollout.planner.ALLOCATORS` through the very decision
function the rollout runner calls (`rollout.planner.pick_continuation`; a user's allocator on
copies of its inputs and under the guard, `rollout.planner.guarded_allocator`), and the refined values
of `credit.refine_values` (Eq. 1; backed up incrementally, equal to it, tested). Paths advance
one state per tick and at most `capacity` run at once, as the asynchronous runner's rows do, so
in-flight continuations count in `n_eff`.

Measured: after every completed continuation, the mean over the audit nodes (the non-terminal
states of the root episodes, a fixed set shared by every allocator) of `(V~(s) - V*(s))^2`
(or of the calibrated estimate `m_n` with `estimate="calibrated"`). For a given seed every
allocator and critic starts from the same audit tree.
"""
from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol, Sequence

from ..config import AlgoConfig
from ..envs.guard import DEFAULT_TIMEOUT_S
from ..rollout.planner import ALLOCATORS, gain, guarded_allocator, pick_continuation
from ..rollout.tree import Node, Tree

ALLOCATOR_NAMES = tuple(ALLOCATORS.names())   # the registered ones (a user's is named with --allocators)


# ----------------------------------------------------------------------------- worlds


@dataclass
class State:
    """One state a path reaches: a segment-boundary state, or (last) the terminal leaf."""

    truth: float | None = None    # known true value V*(s) (None: not an audit state)
    critic: float | None = None   # a trained critic's value (None: the world has none)
    resumable: bool = True        # continuations can be launched from it
    key: object = None            # the world's handle to resume from it (latent id, pool index)


@dataclass
class PathDraw:
    """A complete path below some node: its new states in order, then the leaf's reward."""

    states: list[State]
    reward: float


class World(Protocol):
    n_tasks: int

    def root_state(self, task: int) -> State:
        """The task's first state (the prompt)."""

    def root_path(self, task: int, j: int, rng: random.Random) -> PathDraw:
        """The j-th root episode of `task`, below its root state."""

    def continuation(self, task: int, state: State, rng: random.Random) -> PathDraw:
        """A fresh on-policy path from `state` to a leaf."""


@dataclass
class LatentTree:
    """A finite Markov tree of latent states. State 0 is the start; a state without children is
    terminal and succeeds with probability `p_success`; `value` is the exact V* (gamma = 1)."""

    children: list[list[int]]
    probs: list[list[float]]
    p_success: list[float]
    value: list[float] = field(default_factory=list)

    def __post_init__(self):
        if not self.value:
            self.value = [0.0] * len(self.children)
            for z in reversed(range(len(self.children))):  # children have larger ids
                kids = self.children[z]
                self.value[z] = (self.p_success[z] if not kids else
                                 sum(p * self.value[c] for p, c in zip(self.probs[z], kids)))

    def walk(self, z: int, rng: random.Random) -> tuple[list[int], float]:
        """Latent states after `z` down to a terminal one (inclusive), and the 0/1 reward."""
        out = []
        while self.children[z]:
            z = rng.choices(self.children[z], weights=self.probs[z])[0]
            out.append(z)
        return out, float(rng.random() < self.p_success[z])


def synthetic_latent_tree(rng: random.Random, depth: int = 6, branching: int = 3,
                          informative: float = 0.15, eps: float = 0.02) -> LatentTree:
    """A task tree shaped like the situation FOCUS is built for [our choice]: most subtrees are
    near-deterministic (a wrong turn that fails for sure, or a solved state that succeeds with
    probability 1 - eps), and a few are *informative*: their outcome stays uncertain until the
    last turn (leaf success probabilities drawn uniformly).

    From each non-terminal state, `branching` next states with Dirichlet(1) transition
    probabilities; each child of an uncertain state is itself uncertain with probability
    `informative`, else it fails (success eps) with probability 3/4 or succeeds (1 - eps).
    The start state is uncertain. All leaves are at `depth`."""
    children: list[list[int]] = [[]]
    probs: list[list[float]] = [[]]
    kind = ["mixed"]
    p_success = [0.0]
    frontier = deque([(0, 0)])
    while frontier:
        z, d = frontier.popleft()
        if d == depth:
            p_success[z] = rng.random() if kind[z] == "mixed" else (
                eps if kind[z] == "fail" else 1.0 - eps)
            continue
        w = [rng.expovariate(1.0) for _ in range(branching)]
        probs[z] = [x / sum(w) for x in w]
        for _ in range(branching):
            c = len(children)
            if kind[z] == "mixed":
                k = "mixed" if rng.random() < informative else (
                    "fail" if rng.random() < 0.75 else "solved")
            else:
                k = kind[z]
            children.append([]), probs.append([]), kind.append(k), p_success.append(0.0)
            children[z].append(c)
            frontier.append((c, d + 1))
    return LatentTree(children, probs, p_success)


class SyntheticWorld:
    """Tasks are `LatentTree`s; every state is resumable and its truth is the exact value."""

    def __init__(self, trees: list[LatentTree], grow: bool = False):
        self.trees, self.grow = trees, grow
        self.n_tasks = len(trees)

    @classmethod
    def make(cls, seed: int, tasks: int = 4, grow: bool = False, **shape) -> "SyntheticWorld":
        rng = random.Random(seed * 7_919 + 11)
        return cls([synthetic_latent_tree(rng, **shape) for _ in range(tasks)], grow)

    def root_state(self, task: int) -> State:
        return State(truth=self.trees[task].value[0], key=0)

    def root_path(self, task: int, j: int, rng: random.Random) -> PathDraw:
        zs, r = self.trees[task].walk(0, rng)
        return PathDraw([State(truth=self.trees[task].value[z], key=z) for z in zs], r)

    def continuation(self, task: int, state: State, rng: random.Random) -> PathDraw:
        zs, r = self.trees[task].walk(state.key, rng)
        return PathDraw([State(resumable=self.grow, key=z) for z in zs], r)


# ----------------------------------------------------------------------------- critics


def make_critic(name: str, constant: float = 0.5) -> Callable[[State, random.Random], float]:
    """`constant`: V(s) = `constant` everywhere; `random`: V(s) ~ U(0, 1) drawn once per node,
    independent of the truth; `trained`: the world's own critic values (checkpoint worlds)."""
    if name == "constant":
        return lambda st, rng: constant
    if name == "random":
        return lambda st, rng: rng.random()
    if name == "trained":
        def trained(st: State, rng: random.Random) -> float:
            if st.critic is None:
                raise ValueError("the 'trained' critic needs a world with critic values "
                                 "(diagnose audit-tree --checkpoint DIR)")
            return st.critic
        return trained
    raise ValueError(f"unknown audit critic '{name}'; valid: constant, random, trained")


# ----------------------------------------------------------------------------- simulation


@dataclass
class _SimPath:
    tree: int
    nodes: list[int]              # node ids root..current state
    todo: list[State]             # states still to reach (the leaf's reward comes after)
    reward: float
    origin: int
    continuation: bool
    pid: int = 0                  # path id (the tree's bookkeeping tells own samples by it)


@dataclass
class AuditSpec:
    """What to simulate (the CLI's options)."""

    critics: tuple[str, ...] = ("constant", "random")
    allocators: tuple[str, ...] = field(default_factory=lambda: tuple(ALLOCATORS.names()))
    max_budget: int = 256         # continuations per run (all tasks together)
    roots: int = 2                # root episodes per task (the audit tree)
    seeds: int = 10
    kappa: float = 1.0
    gamma: float = 1.0
    gain_kind: str = "plugin"
    max_inflight: int = 2         # algo.focus_max_inflight
    min_depth: int = 0            # algo.focus_min_depth
    capacity: int = 1             # paths running at once (the runner's batch_size)
    constant: float | None = None  # the constant critic's value (None: the tasks' mean true value)
    evidence: str = "own"         # algo.focus_evidence: own | subtree
    estimate: str = "refined"     # refined (Eq. 1, V~) | calibrated (m_n = (kappa v + n cbar) / (kappa + n))


class AuditSim:
    """One allocator spending continuations on one world's audit tree, with one critic."""

    def __init__(self, world: World, critic: Callable[[State, random.Random], float],
                 allocator: str, spec: AuditSpec, seed: int):
        self.world, self.critic, self.spec = world, critic, spec
        self.allocate = guarded_allocator(allocator, ALLOCATORS.get(allocator), DEFAULT_TIMEOUT_S)
        self.algo = replace(AlgoConfig(), focus_allocator=allocator, kappa=spec.kappa,  # the allocator's ctx.algo
                            gamma=spec.gamma, focus_gain=spec.gain_kind, focus_evidence=spec.evidence,
                            focus_max_inflight=spec.max_inflight, focus_min_depth=spec.min_depth)
        self.tree_rng = random.Random(seed * 1_000_003 + 1)     # the audit tree: same for all
        self.critic_rng = random.Random(seed * 1_000_003 + 2)   # audit-node critic values: same
        self.cont_rng = random.Random(seed * 1_000_003 + 3)     # continuations: per allocator run
        self.alloc_rng = random.Random(seed * 1_000_003 + 4)
        self.trees: list[Tree] = []
        self.states: list[list[State]] = []                     # per tree, per node id
        self.active: list[_SimPath] = []
        self.audit: list[list[int]] = []                        # per tree: node ids measured
        self.dirty: list[set[int]] = []                         # per tree: nodes to back up
        self.vt: list[dict[int, float]] = []                    # per tree: node id -> V~ (Eq. 1)
        self.sq: list[float] = []                               # per tree: their squared errors
        self.completed = 0
        self.n_paths = -1                                       # path ids, per simulation
        self._build_audit()

    # -- tree bookkeeping (the trees' own rules: Tree.start_path / grow / land) ---------------

    def _add(self, t: int, parent: int, st: State, **kw) -> Node:
        tree = self.trees[t]
        depth = 0 if parent < 0 else tree.nodes[parent].depth + 1
        node = tree.add(parent, depth, 0, 0, **kw)
        self.states[t].append(st)
        self.vt[t][node.id] = node.reward if node.terminal else node.v
        if parent >= 0:
            self.dirty[t].add(parent)
        return node

    def _new_node(self, t: int, p: "_SimPath", st: State, rng: random.Random) -> Node:
        tree = self.trees[t]
        node = tree.grow(p.pid, p.nodes, tree.nodes[p.nodes[-1]].depth + 1, 0,
                         v=self.critic(st, rng))
        self._added(t, node, st)
        node.resumable = st.resumable
        return node

    def _added(self, t: int, node: Node, st: State) -> None:
        self.states[t].append(st)
        self.vt[t][node.id] = node.reward if node.terminal else node.v
        if node.parent >= 0:
            self.dirty[t].add(node.parent)

    def _regain(self, t: int, ids: Sequence[int]) -> None:
        tree = self.trees[t]
        for i in ids:
            tree.nodes[i].g = gain(tree.nodes[i], self.spec.kappa, self.spec.gain_kind)

    def _launch(self, t: int, origin: int, draw: PathDraw, continuation: bool) -> _SimPath:
        tree = self.trees[t]
        self.n_paths += 1
        nodes = tree.start_path(self.n_paths, origin, continuation, self.spec.evidence)
        self._regain(t, nodes)
        p = _SimPath(t, nodes, list(draw.states), draw.reward, origin, continuation, self.n_paths)
        self.active.append(p)
        return p

    def _advance(self, p: _SimPath, rng: random.Random) -> bool:
        """One turn of a running path; True when it finished."""
        if p.todo:
            self._new_node(p.tree, p, p.todo.pop(0), rng)
            return False
        tree = self.trees[p.tree]
        depth = tree.nodes[p.nodes[-1]].depth + 1
        leaf = tree.land(p.pid, p.nodes, p.origin, p.continuation, p.reward, depth, 0,
                         self.spec.evidence)
        self._added(p.tree, leaf, State(resumable=False))
        self._regain(p.tree, p.nodes)
        self.active.remove(p)
        return True

    def _build_audit(self) -> None:
        spec, world = self.spec, self.world
        for t in range(world.n_tasks):
            self.trees.append(Tree(f"task-{t}", t))
            self.states.append([])
            self.dirty.append(set())
            self.vt.append({})
            root = world.root_state(t)
            self._add(t, -1, root, v=self.critic(root, self.critic_rng)).resumable = root.resumable
            for j in range(spec.roots):
                p = self._launch(t, 0, world.root_path(t, j, self.tree_rng), continuation=False)
                while not self._advance(p, self.critic_rng):
                    pass
        self.audit = [[nd.id for nd in tree.nodes
                       if not nd.terminal and self.states[t][nd.id].truth is not None]
                      for t, tree in enumerate(self.trees)]
        self.n_audit = sum(len(a) for a in self.audit)
        if self.n_audit == 0:
            raise ValueError("the audit tree has no state with a known value")

    # -- the measurement -----------------------------------------------------------------------

    def estimate(self, t: int, i: int) -> float:
        nd, k = self.trees[t].nodes[i], self.spec.kappa
        if self.spec.estimate == "calibrated":
            return (k * nd.v + nd.csum) / (k + nd.n)
        return self.vt[t][i]

    def _refine(self, t: int) -> None:
        """`credit.refine_values` (Eq. 1), incrementally: only the nodes whose set of children
        changed since the last call, and their ancestors, are backed up again (deepest first,
        so every child is current). Equal to `credit.focus_credit.refine_tree` (tested)."""
        tree, k, gamma = self.trees[t], self.spec.kappa, self.spec.gamma
        todo: set[int] = set()
        for i in self.dirty[t]:
            while i >= 0 and i not in todo:
                todo.add(i)
                i = tree.nodes[i].parent
        self.dirty[t] = set()
        for i in sorted(todo, key=lambda j: -tree.nodes[j].depth):
            nd = tree.nodes[i]
            kids = [tree.nodes[c] for c in nd.children]
            vt = self.vt[t]
            g = sum(c.reward if c.terminal else gamma * vt[c.id] for c in kids) / len(kids)
            vt[i] = (k * nd.v + len(kids) * g) / (k + len(kids))

    def _tree_sq(self, t: int) -> float:
        """Sum of squared errors over tree t's audit nodes."""
        if self.spec.estimate == "refined":
            self._refine(t)
        return sum((self.estimate(t, i) - self.states[t][i].truth) ** 2 for i in self.audit[t])

    def mse(self) -> float:
        return sum(self.sq) / self.n_audit

    def run(self) -> list[float]:
        """MSE after 0, 1, ..., max_budget completed continuations (an allocator that stops
        early, e.g. FOCUS when every gain is 0, keeps its last value)."""
        spec = self.spec
        self.sq = [self._tree_sq(t) for t in range(len(self.trees))]
        curve = [self.mse()]
        launched = 0
        while len(curve) <= spec.max_budget:
            while len(self.active) < spec.capacity and launched < spec.max_budget:
                pick = pick_continuation(self.trees, self.allocate, self.alloc_rng, spec.max_inflight,
                                         spec.min_depth, self.algo)
                if pick is None:
                    break
                tree, node = pick
                t = tree.group
                draw = self.world.continuation(t, self.states[t][node.id], self.cont_rng)
                self._launch(t, node.id, draw, continuation=True)
                launched += 1
            if not self.active:
                break
            for p in list(self.active):
                if self._advance(p, self.cont_rng):
                    self.sq[p.tree] = self._tree_sq(p.tree)
                    curve.append(self.mse())
        while len(curve) <= spec.max_budget:
            curve.append(curve[-1])
        return curve[:spec.max_budget + 1]


# ----------------------------------------------------------------------------- the report


def budget_grid(max_budget: int) -> list[int]:
    """Budgets reported: 0, then doubling from 1 up to max_budget (max_budget included)."""
    out, b = [0], 1
    while b < max_budget:
        out.append(b)
        b *= 2
    return out + [max_budget]


def budget_to_reach(curve: Sequence[float], target: float) -> float:
    """Smallest number of continuations at which `curve` (MSE after 0, 1, 2, ...) is at or below
    `target`, linearly interpolated between integers; inf if it never gets there."""
    if curve[0] <= target:
        return 0.0
    for b in range(1, len(curve)):
        if curve[b] <= target:
            hi, lo = curve[b - 1], curve[b]
            return b - 1 + (hi - target) / (hi - lo) if hi > lo else float(b)
    return math.inf


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


def run_audit(make_world: Callable[[int], World], spec: AuditSpec,
              progress: Callable[[str], None] | None = None) -> dict:
    """Every (critic, allocator) over `spec.seeds` seeds (seed s: world `make_world(s)`, the same
    audit tree for all). Returns
    `{critic: {allocator: {"budgets", "mse" (mean over seeds), "mse_std", "mse_median",
    "curves" (per seed, every budget 0..max)}}}`, plus for FOCUS
    `"budget_ratio": {B: median over seeds of (budget at which FOCUS reaches uniform's MSE at B) / B}`."""
    for a in spec.allocators:
        ALLOCATORS.get(a)  # unknown names fail before any work
    for c in spec.critics:
        make_critic(c, 0.5)
    grid = budget_grid(spec.max_budget)
    out: dict = {}
    worlds = [make_world(s) for s in range(spec.seeds)]
    for cname in spec.critics:
        res: dict = {}
        for a in spec.allocators:
            curves = [AuditSim(worlds[s], critic_for(cname, spec, worlds[s]), a, spec, s).run()
                      for s in range(spec.seeds)]
            at = [[c[b] for c in curves] for b in grid]
            res[a] = {"budgets": grid,
                      "mse": [sum(x) / len(x) for x in at],
                      "mse_std": [_std(x) for x in at],
                      "mse_median": [median(x) for x in at],
                      "curves": curves}
            if progress:
                progress(f"{cname} critic, {a}: MSE {res[a]['mse'][0]:.4f} -> {res[a]['mse'][-1]:.4f}")
        if "focus" in res and "uniform" in res:
            res["focus"]["budget_ratio"] = budget_ratios(res["focus"]["curves"],
                                                         res["uniform"]["curves"], grid)
        out[cname] = res
    return out


def critic_for(name: str, spec: AuditSpec, world: World):
    """The named critic; the constant one predicts `spec.constant`, or by default the world's
    mean true value of its tasks' first states (what a critic regressed on returns without
    looking at the state would learn: the policy's average success)."""
    c = spec.constant
    if name == "constant" and c is None:
        c = sum(world.root_state(t).truth for t in range(world.n_tasks)) / world.n_tasks
    return make_critic(name, 0.5 if c is None else c)


def budget_ratios(focus: list[list[float]], uniform: list[list[float]], grid: list[int]) -> dict:
    """{B: median over seeds of budget_to_reach(focus_seed, uniform_seed[B]) / B} for B > 0."""
    out = {}
    for B in grid:
        if B == 0:
            continue
        out[str(B)] = median([budget_to_reach(f, u[B]) / B for f, u in zip(focus, uniform)])
    return out


def _std(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))

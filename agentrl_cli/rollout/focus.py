"""The FOCUS controller: an asynchronous tree rollout that spends the step's generation budget
where the critic is most wrong (METHODS.md §2).

Per task, `algo.focus_roots` root episodes are sampled; every segment-boundary state they pass
becomes a node of the task's tree (`rollout.tree`). Whenever an engine slot is free and budget
remains, a *continuation* is launched from the candidate node with the largest gain
`credit.focus_gain(v, n, cbar, kappa, n_inflight, algo.focus_gain)`. Candidates are non-terminal,
resumable nodes with at least one completed leaf below them (`cbar` needs one) and `g > 0`; at
most `algo.focus_max_inflight` continuations launched from a node run at once, at most
`rollout.batch_size` paths run at once in total. After the step, `credit.refine_values` backs
up refined values per tree, and the "focus" estimator turns them into segment advantages.

Engine: continuous batching over one growing `KVBatch`. Each tick feeds every running row its
next input (a decode token, or a whole observation for a row whose turn just ended and was
stepped in the env, or the prompt of a new root) in at most two forwards that compute only the
fed rows (`extend(..., only_fed=True)`: one-token rows, longer rows), then samples one token
for every running row. No row ever waits for another row's turn (no lock-step rounds). A
continuation forks the cache of a row that holds the node's prefix (`KVBatch.fork`: the K/V
are copied, one token is refed); finished rows stay parked as fork sources until the batch
holds more than 2 x `batch_size` rows, then the oldest parked rows are dropped (a later fork
from a state whose rows are all gone re-prefills the prefix). Rows fed at different times leave
holes in each other's cache columns, so the cache is repacked (`KVBatch.pack`) whenever it is
more than twice as wide as its longest row.

[our choice] Reproducibility: every path samples from its own generator, seeded from the step
generator and the path's id (`path_generator`). A path's tokens then depend only on its own
context, never on which rows share the batch or when it was scheduled, so with branching
disabled (`focus_roots = group_size` and no token budget) the step's episodes are exactly those
of the lock-step runner given the same per-episode generators (tested). Root paths get ids
0..R-1 task-major (the linear controller's (task, group) order), continuations R, R+1, ... in
launch order; `RolloutResult.episodes` is in path-id order.

[our choice] Budget: with `rollout.budget_tokens > 0` the step's *committed* tokens are what it
has generated plus what its running paths are expected to still generate (each priced at the
mean tokens that finished paths through its origin node generated after that node, the same
pricing as VinePPO's plan). The picked continuation is launched only if the committed tokens
plus half its own price fit the budget (rounding to the nearest continuation, so the step
lands on the budget on average instead of overshooting by everything in flight; session 2
measured a 22% overshoot when only finished tokens were charged); else no more continuations
start. The trainer logs the true `rollout/tokens`. Without a budget, the step completes
`tasks_per_step x group_size` paths, as many episodes as GRPO (roots included; the roots per
task are capped at `group_size`). Roots are launched before any continuation.

[our choice] Training data: every path is an episode. A continuation from state s_k inherits
the source episode's first `position` tokens with `response_mask` 0 (and turn/segment index
-1), so each segment's policy tokens are trained exactly once, in the path that generated
them; its own turns keep their true turn numbers k, k+1, .... `generated_tokens` counts only
its own tokens; `num_tool_calls` counts the whole root-to-leaf episode.
The critic value v of a node is the trainer's value head (`ctx.critic`) on the last hidden
state of the state's context (a separate critic: on its own model's, one forward over the
visible context), clamped to [0, 1] for the gains (raw in `refine_values`); without a value
head v = 0.5 (what the untrained head outputs).

Context operators (`context/`): segment-boundary states are the context resets, so nodes sit
at window starts. A continuation stores the source's tokens up to the node (all windows) but
resumes from the node's *visible* context (prompt + current window): it forks a row that has
not reset since the node, or prefills the visible context. The allocator and the tree never
look at the operator.

Allocators (`algo.focus_allocator`): `focus` (largest gain), `uniform` (fewest continuations
launched from the node so far), `random`, `raw-residual` (largest |v - cbar|, no calibration).
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from ..config import ConfigError
from ..context.windows import inherit_windows, visible_ids, visible_len
from ..credit.focus import focus_gain
from ..engines.hf import sample_rows
from ..models.critic import critic_hidden, is_separate
from ..registry import Registry
from ..types import Episode
from .controllers import CONTROLLERS, RolloutContext, RolloutResult, shape_rewards
from .runner import _Live, advance, append_turn, new_episode, start_context
from .tree import Node, Tree


# ----------------------------------------------------------------------------- RNG


def seed_base(generator: torch.Generator) -> int:
    """The step's one draw from its generator; every path's generator derives from it."""
    return int(torch.randint(0, 2**62, (1,), generator=generator))


def path_generator(base: int, path: int) -> torch.Generator:
    return torch.Generator().manual_seed((base * 1_000_003 + path * 7919 + 17) % (2**63 - 1))


# ----------------------------------------------------------------------------- allocators


def gain(node: Node, kappa: float, kind: str) -> float:
    """`focus_gain` of a node with n_eff = n + inflight (0 while no leaf below is complete)."""
    if node.n == 0 or node.terminal:
        return 0.0
    v = min(1.0, max(0.0, 0.5 if node.v is None else node.v))
    return focus_gain(v, node.n, node.cbar, kappa, node.inflight, kind)


ALLOCATORS: Registry[Callable[[list[Node], random.Random], Node]] = Registry("focus allocator")


@ALLOCATORS.register("focus")
def _largest_gain(cands: list[Node], rng: random.Random) -> Node | None:
    best = max(cands, key=lambda nd: (nd.g, -nd.depth))  # ties: shallower, then older
    return best if best.g > 0 else None


@ALLOCATORS.register("uniform")
def _uniform(cands: list[Node], rng: random.Random) -> Node:
    return min(cands, key=lambda nd: nd.launched)


@ALLOCATORS.register("random")
def _random(cands: list[Node], rng: random.Random) -> Node:
    return cands[rng.randrange(len(cands))]


@ALLOCATORS.register("raw-residual")
def _raw_residual(cands: list[Node], rng: random.Random) -> Node:
    return max(cands, key=lambda nd: abs((0.5 if nd.v is None else nd.v) - nd.cbar))


def pick_continuation(trees: list[Tree], allocate: Callable[[list[Node], random.Random], Node | None],
                      rng: random.Random, max_inflight: int) -> tuple[Tree, Node] | None:
    """The allocation decision: the (tree, node) to launch the next continuation from, or None.

    Candidates are non-terminal, resumable nodes with at least one completed leaf below them and
    fewer than `max_inflight` of their own continuations running; `allocate` (one of
    `ALLOCATORS`) picks among them. Shared by the rollout runner and the audit-tree diagnostic
    (`diagnostics.audit`), so both make exactly the same choice from the same tree state.
    """
    cands = [(tree, nd) for tree in trees for nd in tree.nodes
             if nd.n > 0 and not nd.terminal and nd.resumable and nd.own_inflight < max_inflight]
    pick = allocate([nd for _, nd in cands], rng) if cands else None
    if pick is None:
        return None
    return next((t, nd) for t, nd in cands if nd is pick)


# ----------------------------------------------------------------------------- the runner


@dataclass
class _Path:
    pid: int
    tree: Tree
    live: _Live
    gen: torch.Generator
    nodes: list[int]              # node ids root..current state (..leaf when finished)
    origin: int                   # node it was launched from (the root for root paths)
    continuation: bool
    row: int | None = None        # KVBatch row (None: not in the batch)
    feed: list[int] | None = None  # input of the next tick
    turn_ids: list[int] = field(default_factory=list)
    turn_lps: list[float] = field(default_factory=list)
    price: float = 0.0            # continuation: expected tokens it generates (budget)


class FocusRunner:
    """One step of FOCUS tree rollouts over `tasks` (see the module docstring)."""

    def __init__(self, ctx: RolloutContext, tasks: list):
        algo = ctx.algo
        if algo.focus_allocator not in ALLOCATORS.names():
            raise ConfigError(f"algo.focus_allocator must be one of {', '.join(ALLOCATORS.names())}, "
                              f"got '{algo.focus_allocator}'")
        if algo.focus_gain not in ("plugin", "bayes"):
            raise ConfigError(f"algo.focus_gain must be plugin or bayes, got '{algo.focus_gain}'")
        self.ctx, self.algo, self.tasks = ctx, algo, tasks
        self.allocate = ALLOCATORS.get(algo.focus_allocator)
        self.capacity = max(1, ctx.batch_size)
        self.base = seed_base(ctx.generator)
        self.rng = random.Random(self.base + 1)
        self.trees = [Tree(t.task_id, g) for g, t in enumerate(tasks)]
        self.paths: list[_Path] = []
        self.active: list[_Path] = []
        self.parked: list[_Path] = []       # finished paths whose rows are still in the batch
        roots = max(1, algo.focus_roots)
        if ctx.budget_tokens <= 0:
            roots = min(roots, ctx.group_size)
        self.root_queue = [g for g in range(len(tasks)) for _ in range(roots)]
        self.target_paths = len(tasks) * ctx.group_size
        self.kv = ctx.engine.new_batch(0)
        self.critic = getattr(ctx, "critic", None)
        self.kv.keep_hidden = self.critic is not None and not is_separate(self.critic)
        self.value_wait: list[tuple[_Path, Node]] = []  # nodes whose v comes after the next extend
        self.spent = 0
        self.t_book = 0.0             # seconds in allocation and tree bookkeeping

    # -- launching ---------------------------------------------------------------------------

    def _new_path(self, tree: Tree, live: _Live, origin: int, continuation: bool) -> _Path:
        t0 = time.perf_counter()
        p = _Path(len(self.paths), tree, live, path_generator(self.base, len(self.paths)),
                  tree.ancestry(origin), origin, continuation)
        self.paths.append(p)
        p.live.ep.meta.update(focus_tree=tree.group, focus_path=p.pid, focus_origin=origin)
        for nid in p.nodes:
            if tree.through[nid][-1] != p.pid:
                tree.through[nid].append(p.pid)
        for nid in self._evidence_nodes(p, p.nodes):
            tree.nodes[nid].inflight += 1
        if continuation:
            tree.nodes[origin].launched += 1
            tree.nodes[origin].own_inflight += 1
        self._regain(tree, p.nodes)
        self.active.append(p)
        self.t_book += time.perf_counter() - t0
        return p

    def _launch_root(self, g: int) -> None:
        ctx, tree, task = self.ctx, self.trees[g], self.tasks[g]
        env = ctx.spec.make()
        user = env.reset(task)
        prompt = ctx.fmt.prompt_ids(env.system_prompt, user)
        live = _Live(new_episode(task, g, prompt), env)
        start_context(live.ep, env)
        first = not tree.nodes
        if first:
            root = tree.add(-1, 0, len(prompt), len(self.paths))
            self._snapshot(root, env, live.ep)
        p = self._new_path(tree, live, 0, continuation=False)
        p.row = self.kv.add_row()
        p.feed = list(prompt)
        if first:
            self.value_wait.append((p, tree.nodes[0]))

    def _launch_from(self, tree: Tree, node: Node) -> None:
        ctx = self.ctx
        src = self.paths[node.path].live.ep
        k, pos = node.depth, node.position
        env = ctx.spec.make()
        env.restore(node.snapshot)
        ep = Episode(task_id=src.task_id, group=src.group, token_ids=src.token_ids[:pos],
                     response_mask=[0] * pos, logprobs=[0.0] * pos, turn_index=[-1] * pos,
                     segment_starts=[s for s in src.segment_starts if s < pos],
                     turns=[replace(t) for t in src.turns[:k]], segment_index=[-1] * pos,
                     answer=src.answer, meta={kk: v for kk, v in src.meta.items()
                                              if not kk.startswith("focus_") and kk not in
                                              ("reward_raw", "overlong_penalty")},
                     num_tool_calls=node.tool_calls)
        inherit_windows(ep, src, pos)
        p = self._new_path(tree, _Live(ep, env), node.id, continuation=True)
        src_row = next((self.paths[q].row for q in tree.through[node.id]
                        if self.paths[q].row is not None and q != p.pid
                        and self._holds(self.paths[q].live.ep, ep)
                        and int(self.kv.lengths[self.paths[q].row]) >= visible_len(ep)), None)
        if src_row is not None:
            p.row = self.kv.fork(src_row, visible_len(ep))
            p.feed = []                      # refeeds the prefix's last token
        else:
            p.row = self.kv.add_row()
            p.feed = visible_ids(ep)

    @staticmethod
    def _holds(other: Episode, ep: Episode) -> bool:
        """The row of `other` (a path through the node `ep` starts from) still holds `ep`'s
        visible context: `other` has not reset its context since (a reset keeps the prefix only)."""
        return (len(other.window_starts) == len(ep.window_starts)
                or visible_len(ep) <= ep.window_prefix)

    def _budget_left(self) -> bool:
        if self.ctx.budget_tokens > 0:
            return self.committed() < self.ctx.budget_tokens
        return len(self.paths) < self.target_paths

    def committed(self) -> float:
        """Tokens generated so far plus the running paths' expected remaining tokens (a root
        is priced at the mean finished root, a continuation at its launch price)."""
        root = self._root_price()
        return self.spent + sum(max(0.0, (p.price if p.continuation else root) - self._generated(p))
                                for p in self.active)

    def _generated(self, p: _Path) -> int:
        """Tokens path `p` has generated so far."""
        return p.live.ep.generated_tokens + len(p.turn_ids)

    def price(self, tree: Tree, node: Node) -> float:
        """Expected tokens a continuation from `node` generates: the mean that the finished
        paths through the node generated after its position (at least 1)."""
        done = [self.paths[q].live.ep for q in tree.through[node.id] if q in tree.paths]
        if not done:
            return 1.0
        after = [sum(e.response_mask[node.position:]) for e in done]
        return max(1.0, sum(after) / len(after))

    def _root_price(self) -> float:
        roots = [p.live.ep.generated_tokens for p in self.paths
                 if not p.continuation and p.pid in p.tree.paths]
        return sum(roots) / len(roots) if roots else 0.0

    def _fill(self) -> None:
        """Launch roots, then continuations, while slots and budget remain."""
        while self.root_queue and len(self.active) < self.capacity:
            self._launch_root(self.root_queue.pop(0))
        if self.root_queue:
            return
        while len(self.active) < self.capacity and self._budget_left():
            t0 = time.perf_counter()
            pick = pick_continuation(self.trees, self.allocate, self.rng, self.algo.focus_max_inflight)
            cost = 0.0 if pick is None else self.price(*pick)
            stop = pick is None or (self.ctx.budget_tokens > 0 and
                                    self.committed() + cost > self.ctx.budget_tokens)
            self.t_book += time.perf_counter() - t0
            if stop:
                break
            self._launch_from(*pick)          # env restore + KV fork: engine time, not bookkeeping
            self.active[-1].price = cost

    # -- tree bookkeeping ----------------------------------------------------------------------

    def _evidence_nodes(self, p: _Path, node_ids: list[int]) -> list[int]:
        """The nodes whose evidence (n, cbar, in-flight count) path `p` is.

        `algo.focus_evidence=own` (METHODS.md §2): the node it was launched from (the root for a
        root episode) and the nodes it created itself: its own samples. Leaves that land below a
        node through continuations launched from its descendants are not on-policy draws from it.
        `subtree` (the earlier reading, kept for ablation): every node on the path."""
        if self.algo.focus_evidence == "subtree":
            return list(node_ids)
        nodes = p.tree.nodes
        return [nid for nid in node_ids if nid == p.origin or nodes[nid].path == p.pid]

    def _regain(self, tree: Tree, node_ids: list[int]) -> None:
        for nid in node_ids:
            nd = tree.nodes[nid]
            nd.g = gain(nd, self.algo.kappa, self.algo.focus_gain)

    def _snapshot(self, node: Node, env, ep: Episode) -> None:
        try:
            node.snapshot = env.snapshot()
            node.resumable = node.position + self.ctx.params.max_new_tokens <= self.ctx.max_tokens
        except Exception:  # an env without snapshots still rolls out, without branching
            node.snapshot, node.resumable = None, False
        node.tool_calls = ep.num_tool_calls

    def _new_state(self, p: _Path) -> None:
        """The path's context now ends at a new segment-boundary state (after an observation)."""
        t0 = time.perf_counter()
        ep, tree = p.live.ep, p.tree
        node = tree.add(p.nodes[-1], ep.num_turns, len(ep.token_ids), p.pid, inflight=1)
        self._snapshot(node, p.live.env, ep)
        p.nodes.append(node.id)
        self.value_wait.append((p, node))
        self.t_book += time.perf_counter() - t0

    def _finish(self, p: _Path) -> None:
        t0 = time.perf_counter()
        ep, tree = p.live.ep, p.tree
        shape_rewards([ep], self.ctx)
        R = float(ep.reward)
        leaf = tree.add(p.nodes[-1], ep.num_turns, len(ep.token_ids), p.pid, reward=R, n=1, csum=R,
                        tool_calls=ep.num_tool_calls)
        for nid in self._evidence_nodes(p, p.nodes):
            nd = tree.nodes[nid]
            nd.n += 1
            nd.csum += R
            nd.inflight -= 1
        if p.continuation:
            tree.nodes[p.origin].own_inflight -= 1
        p.nodes.append(leaf.id)
        tree.paths[p.pid] = list(p.nodes)
        self._regain(tree, p.nodes)
        self.active.remove(p)
        self.parked.append(p)
        self.t_book += time.perf_counter() - t0

    def _compact(self) -> None:
        """Drop the oldest parked rows once the batch holds more than 2 x capacity rows."""
        if self.kv.n <= 2 * self.capacity:
            return
        keep_parked = self.parked[-self.capacity:]
        for p in self.parked[:-self.capacity]:
            p.row = None
        self.parked = keep_parked
        holders = sorted(self.active + self.parked, key=lambda q: q.row)
        self.kv.keep([q.row for q in holders])
        for i, q in enumerate(holders):
            q.row = i

    def _values(self) -> None:
        """Critic values of the states whose context was just fed."""
        if not self.value_wait:
            return
        if self.critic is None:
            for _, nd in self.value_wait:
                nd.v = 0.5
        elif is_separate(self.critic):  # the critic's own forward over each visible context
            ctxs = [visible_ids(p.live.ep) for p, _ in self.value_wait]
            n = torch.tensor([len(c) for c in ctxs])
            ids = torch.zeros(len(ctxs), int(n.max()), dtype=torch.long)
            for i, c in enumerate(ctxs):
                ids[i, :len(c)] = torch.tensor(c)
            attn = (torch.arange(ids.shape[1])[None] < n[:, None]).long()
            dev = next(self.critic.parameters()).device
            with torch.no_grad():
                h = critic_hidden(self.critic, None, ids.to(dev), attn.to(dev))
                h = h[torch.arange(len(ctxs), device=dev), (n - 1).to(dev)].float()
                v = self.critic(h).squeeze(-1).float().tolist()
        else:
            rows = torch.tensor([p.row for p, _ in self.value_wait], dtype=torch.long)
            with torch.no_grad():
                h = self.kv.last_hidden[rows].float()
                v = self.critic(h).squeeze(-1).float().tolist()
        if self.critic is not None:
            for (_, nd), x in zip(self.value_wait, v):
                nd.v = float(x)
        self.value_wait = []

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> None:
        ctx, fmt, params = self.ctx, self.ctx.fmt, self.ctx.params
        stop = set(fmt.stop_ids)
        self._fill()
        while self.active:
            chunks: list[list[int] | None] = [None] * self.kv.n
            for p in self.active:
                chunks[p.row], p.feed = p.feed, None
            self.kv.extend(chunks, only_fed=True)
            self._values()
            running = list(self.active)
            idx = torch.tensor([p.row for p in running], dtype=torch.long)
            tok, lp = sample_rows(self.kv.last_logits[idx], params, [p.gen for p in running])
            for p, t, l in zip(running, tok.tolist(), lp.tolist()):
                p.turn_ids.append(t)
                p.turn_lps.append(l)
                self.spent += 1
                if t not in stop and len(p.turn_ids) < params.max_new_tokens:
                    p.feed = [t]
                    continue
                self.kv.pending[p.row] = [t]
                ids, lps, p.turn_ids, p.turn_lps = p.turn_ids, p.turn_lps, [], []
                turn = append_turn(p.live.ep, ids, lps, fmt.decode_action(ids))
                obs, boundary, reset = advance(p.live, fmt, turn, ctx.max_tokens,
                                               params.max_new_tokens)
                if reset:
                    self.kv.truncate(p.row, p.live.ep.window_prefix)
                if obs is None:
                    self._finish(p)
                else:
                    p.feed = obs
                    if boundary:
                        self._new_state(p)
            self._compact()
            if self.kv.mask.shape[1] > 2 * int(self.kv.lengths.max()) + 64:
                self.kv.pack()
            self._fill()

    # -- results -----------------------------------------------------------------------------

    def result(self) -> RolloutResult:
        t0 = time.perf_counter()
        algo = self.algo
        for tree in self.trees:
            tree.refine(algo.kappa, algo.gamma)
        eps = [p.live.ep for p in self.paths]
        if algo.focus_baseline == "loo":
            values = [p.tree.path_values_loo(p.pid, algo.kappa, algo.gamma) for p in self.paths]
        else:
            values = [p.tree.path_values(p.pid) for p in self.paths]
        targets: list[list[tuple[int, float]]] = [[] for _ in self.paths]
        for tree in self.trees:
            for nd in tree.nodes:
                if not nd.terminal and nd.G_bar is not None:
                    targets[nd.path].append((nd.position, nd.G_bar))
        self.t_book += time.perf_counter() - t0
        extras = {"trees": self.trees, "focus_values": values, "focus_value_targets": targets,
                  "metrics": self.metrics(eps)}
        return RolloutResult(eps, extras=extras)

    def metrics(self, eps: list[Episode]) -> dict:
        inner = [nd for t in self.trees for nd in t.nodes if not nd.terminal]
        with_n = [nd for nd in inner if nd.n > 0 and nd.v is not None]
        with_g = [nd for nd in inner if nd.G_bar is not None and nd.v is not None]
        tokens = sum(e.generated_tokens for e in eps)
        branch = sum(p.live.ep.generated_tokens for p in self.paths if p.continuation)
        return {
            "focus/nodes": sum(len(t.nodes) for t in self.trees),
            "focus/continuations": sum(p.continuation for p in self.paths),
            "focus/tokens": tokens,
            "focus/abs_v_minus_cbar": (sum(abs(nd.v - nd.cbar) for nd in with_n) / len(with_n)
                                       if with_n else 0.0),
            "focus/critic_mse": (sum((nd.v - nd.G_bar) ** 2 for nd in with_g) / len(with_g)
                                 if with_g else 0.0),
            "focus/tool_calls_per_episode": sum(e.num_tool_calls for e in eps) / max(1, len(eps)),
            "focus/branch_token_share": branch / tokens if tokens else 0.0,
            "focus/bookkeeping_seconds": self.t_book,
        }


@CONTROLLERS.register("focus")
def focus(ctx: RolloutContext, tasks) -> RolloutResult:
    """FOCUS tree rollouts with gain-based continuation allocation (module docstring)."""
    t0 = time.perf_counter()
    runner = FocusRunner(ctx, list(tasks))
    runner.run()
    res = runner.result()
    wall = time.perf_counter() - t0
    res.extras["metrics"]["focus/bookkeeping_share"] = runner.t_book / max(wall, 1e-9)
    res.extras["focus_timing"] = {"wall_seconds": wall, "bookkeeping_seconds": runner.t_book}
    return res

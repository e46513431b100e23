"""FOCUS search trees (docs/methods.md, focus): one tree per task, nodes are segment-boundary states.

A node is the state `s` the policy is about to act from: the task prompt (the root) or an
episode's context right after an observation was appended. A *leaf* is the terminal state of
one episode (a root-to-leaf path) and carries its reward `R`. Every episode (path) that passes
through a node has the same first `position` tokens, so any of them can be forked there.

Evidence kept per node (docs/methods.md, focus: "own samples"), updated as paths finish: the own
samples of a node are the path that created it plus every continuation launched from it (for
the root: every root episode and every continuation launched from the root). `n` counts its
completed own samples (a leaf counts itself), `cbar` their mean outcome, `inflight` its own
samples still running (the asynchronous allocator's effective sample count is
`n + inflight`), `launched` the continuations launched from it. `g` is the current gain of one
more continuation, and after the step `G_bar` / `V_tilde` come from `credit.refine_values`.
`evidence="subtree"` (`algo.focus_evidence`, an ablation) counts every path through a node
instead, the earlier reading.

The bookkeeping rules live here, once: `start_path` (a root episode or a continuation is
launched), `grow` (a running path reached a new state) and `land` (a path finished). The
in-process runner (`rollout.focus`), the path scheduler (`rollout.scheduler`) and the audit-tree
simulation (`diagnostics.audit`) all call them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..credit.focus import calibrated, refine_values


@dataclass
class Node:
    id: int                       # index in Tree.nodes (0 = root)
    parent: int                   # parent node id, -1 for the root
    depth: int                    # k: segments (turns) taken before this state
    position: int                 # tokens of context = where segment k's policy tokens start
                                  # (for a leaf: the episode's length)
    path: int                     # path (episode) that first reached this state
    v: float | None = None        # critic V(s) (None until computed; unused at leaves)
    snapshot: Any = None          # env snapshot at this state (None: cannot be resumed)
    resumable: bool = False       # the env can be restored here and a turn still fits
    tool_calls: int = 0           # tool calls on the path up to this state
    reward: float | None = None   # terminal reward R (leaves only)
    children: list[int] = field(default_factory=list)
    n: int = 0                    # completed own samples (itself for a leaf)
    csum: float = 0.0             # sum of their outcomes
    inflight: int = 0             # own samples still running
    launched: int = 0             # continuations launched from this node
    own_inflight: int = 0         # of those, still running (capped by algo.focus_max_inflight)
    g: float = 0.0                # current gain of one more continuation
    G_bar: float | None = None    # backed-up target (Eq. 1), None at leaves / without children
    V_tilde: float | None = None  # refined value

    @property
    def terminal(self) -> bool:
        return self.reward is not None

    @property
    def cbar(self) -> float:
        """Mean outcome of the completed own samples (NaN while n == 0)."""
        return self.csum / self.n if self.n else math.nan

    def to_json(self) -> dict:
        def num(x):
            return None if x is None or (isinstance(x, float) and math.isnan(x)) else x

        return {"id": self.id, "parent": self.parent, "depth": self.depth,
                "position": self.position, "path": self.path, "v": num(self.v), "n": self.n,
                "cbar": num(self.cbar), "g": self.g, "G_bar": num(self.G_bar),
                "V_tilde": num(self.V_tilde), "reward": self.reward,
                "resumable": self.resumable, "launched": self.launched,
                "tool_calls": self.tool_calls, "children": list(self.children)}


def _critic(nd: Node) -> float:
    """A non-leaf node's critic value; 0.5 (the untrained value head's output) if never computed."""
    return 0.5 if nd.v is None else nd.v


@dataclass
class Tree:
    """All paths of one task in one step."""

    task_id: str
    group: int                    # the task's index in the step (= Episode.group of its paths)
    nodes: list[Node] = field(default_factory=list)
    paths: dict[int, list[int]] = field(default_factory=dict)  # path id -> node ids root..leaf
    through: dict[int, list[int]] = field(default_factory=dict)  # node id -> path ids through it
    prior: float | None = None    # what `refine` put in place of the critic values (None: none)

    def add(self, parent: int, depth: int, position: int, path: int, **kw) -> Node:
        node = Node(len(self.nodes), parent, depth, position, path, **kw)
        self.nodes.append(node)
        if parent >= 0:
            self.nodes[parent].children.append(node.id)
        self.through[node.id] = [path]
        return node

    # -- bookkeeping: the one place the evidence rules are written ---------------------------

    def evidence(self, pid: int, origin: int, node_ids: list[int], rule: str = "own") -> list[int]:
        """The nodes among `node_ids` (a path's nodes) whose evidence path `pid`, launched from
        `origin`, is: `own`, the origin and the nodes the path created; `subtree`, all."""
        if rule == "subtree":
            return list(node_ids)
        if rule != "own":
            raise ValueError(f"unknown evidence rule '{rule}'; valid: own, subtree")
        return [i for i in node_ids if i == origin or self.nodes[i].path == pid]

    def start_path(self, pid: int, origin: int, continuation: bool, rule: str = "own") -> list[int]:
        """Path `pid` starts from node `origin` (the root for a root episode): returns its node
        ids so far (root..origin) and books it as in flight."""
        ids = self.ancestry(origin)
        for i in ids:
            if self.through[i][-1] != pid:
                self.through[i].append(pid)
        for i in self.evidence(pid, origin, ids, rule):
            self.nodes[i].inflight += 1
        if continuation:
            self.nodes[origin].launched += 1
            self.nodes[origin].own_inflight += 1
        return ids

    def grow(self, pid: int, ids: list[int], depth: int, position: int, **kw) -> Node:
        """Running path `pid` (node ids `ids`) reached a new segment-boundary state: a node it
        created, so one of its own samples is in flight there. Appends the id to `ids`."""
        node = self.add(ids[-1], depth, position, pid, inflight=1, **kw)
        ids.append(node.id)
        return node

    def land(self, pid: int, ids: list[int], origin: int, continuation: bool, reward: float,
             depth: int, position: int, rule: str = "own", **kw) -> Node:
        """Path `pid` ended with `reward`: add its leaf, move it from in flight to completed at
        the nodes it is evidence of, record the path. Appends the leaf's id to `ids`."""
        leaf = self.add(ids[-1], depth, position, pid, reward=reward, n=1, csum=reward, **kw)
        for i in self.evidence(pid, origin, ids, rule):
            nd = self.nodes[i]
            nd.n += 1
            nd.csum += reward
            nd.inflight -= 1
        if continuation:
            self.nodes[origin].own_inflight -= 1
        ids.append(leaf.id)
        self.paths[pid] = list(ids)
        return leaf

    def ancestry(self, node_id: int) -> list[int]:
        """Node ids from the root down to `node_id` (inclusive)."""
        out = []
        while node_id >= 0:
            out.append(node_id)
            node_id = self.nodes[node_id].parent
        return out[::-1]

    def refine(self, kappa: float, gamma: float, prior: float | None = None) -> None:
        """Fill G_bar and V_tilde of every node with `credit.refine_values` (Eq. 1).

        A node whose critic value was never computed (cannot happen for a finished tree) uses
        0.5, the untrained value head's output. `prior` (`algo.focus_prior=tree`: the tree's
        mean reward) replaces every node's critic value in Eq. 1 (and in `path_values_loo`)."""
        self.prior = prior
        parent = [nd.parent for nd in self.nodes]
        leaf = [nd.reward for nd in self.nodes]
        critic = [0.0 if nd.terminal else (_critic(nd) if prior is None else prior)
                  for nd in self.nodes]
        g_bar, v_tilde = refine_values(parent, leaf, critic, kappa, gamma)
        for nd, gb, vt in zip(self.nodes, g_bar, v_tilde):
            nd.G_bar, nd.V_tilde = gb, vt

    def path_values(self, path: int) -> list[float]:
        """[V_tilde(s_0), ..., V_tilde(s_{K-1})] of a finished path (its non-leaf states)."""
        return [self.nodes[i].V_tilde for i in self.paths[path][:-1]]

    def mean_reward(self) -> float:
        """Mean reward of the tree's finished paths (0.5 if none finished)."""
        rewards = [nd.reward for nd in self.nodes if nd.terminal and nd.reward is not None]
        return sum(rewards) / len(rewards) if rewards else 0.5

    def path_values_loo(self, path: int, kappa: float, gamma: float) -> list[float]:
        """`path_values` with the path's own leaf left out (`algo.focus_baseline=loo`).

        Bottom-up along the path, each node's `V~` is recomputed (Eq. 1) from its children
        without the path's leaf: the on-path child contributes its own leave-one-out value, the
        other children their usual targets, and a node left without evidence falls back to its
        critic value (or the prior `refine` was given). So `R` never enters the baseline it is
        compared with; e.g. on an unbranched path `V~_-(s_k) = (kappa V(s_k) + V(s_{k+1})) /
        (kappa + 1)`. Call after `refine`."""
        ids = self.paths[path]
        out: list[float] = []
        below: float | None = None             # LOO value of the on-path child (None: own leaf)
        for i in range(len(ids) - 2, -1, -1):
            nd, on_path = self.nodes[ids[i]], ids[i + 1]
            targets = []
            for c in nd.children:
                ch = self.nodes[c]
                if c == on_path:
                    if below is not None:
                        targets.append(gamma * below)
                elif ch.terminal:
                    targets.append(float(ch.reward))
                else:
                    targets.append(gamma * ch.V_tilde)
            v = _critic(nd) if self.prior is None else self.prior
            below = calibrated(v, len(targets), sum(targets) / len(targets), kappa) if targets else v
            out.append(below)
        return out[::-1]

    def to_json(self) -> dict:
        return {"task_id": self.task_id, "group": self.group,
                "nodes": [nd.to_json() for nd in self.nodes],
                "paths": {str(k): v for k, v in self.paths.items()}}

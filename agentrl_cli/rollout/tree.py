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
more continuation. After the step the tree goes to credit as plain arrays (`Tree.arrays`):
refined values, baselines and critic targets are `credit.focus_credit`'s.
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

from ..credit.focus_credit import FocusTree, TreeValues


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
    h: float | None = None        # mean surprisal (-log-prob) of the turn sampled from this state
                                  # on the first finished path that generated one here: an
                                  # unbiased estimate of the policy's per-token entropy there

    @property
    def terminal(self) -> bool:
        return self.reward is not None

    @property
    def cbar(self) -> float:
        """Mean outcome of the completed own samples (NaN while n == 0)."""
        return self.csum / self.n if self.n else math.nan

    def to_json(self, G_bar: float | None = None, V_tilde: float | None = None) -> dict:
        """The node's row; `G_bar` / `V_tilde`: its refined values (`credit.focus_credit`),
        when the caller computed them."""
        def num(x):
            return None if x is None or (isinstance(x, float) and math.isnan(x)) else x

        return {"id": self.id, "parent": self.parent, "depth": self.depth,
                "position": self.position, "path": self.path, "v": num(self.v), "n": self.n,
                "h": num(self.h),
                "cbar": num(self.cbar), "g": self.g, "G_bar": num(G_bar),
                "V_tilde": num(V_tilde), "reward": self.reward,
                "resumable": self.resumable, "launched": self.launched,
                "tool_calls": self.tool_calls, "children": list(self.children)}


@dataclass
class Tree:
    """All paths of one task in one step."""

    task_id: str
    group: int                    # the task's index in the step (= Episode.group of its paths)
    nodes: list[Node] = field(default_factory=list)
    paths: dict[int, list[int]] = field(default_factory=dict)  # path id -> node ids root..leaf
    through: dict[int, list[int]] = field(default_factory=dict)  # node id -> path ids through it

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

    def arrays(self) -> FocusTree:
        """The tree as plain arrays for credit (`credit.focus_credit.FocusTree`)."""
        nodes = self.nodes
        return FocusTree(parent=[nd.parent for nd in nodes], reward=[nd.reward for nd in nodes],
                         critic=[None if nd.terminal else nd.v for nd in nodes],
                         position=[nd.position for nd in nodes], creator=[nd.path for nd in nodes],
                         paths={p: list(ids) for p, ids in self.paths.items()})

    def to_json(self, values: TreeValues | None = None) -> dict:
        """The tree's row; `values`: its refined values (`credit.focus_credit.tree_values`), else
        null `G_bar` / `V_tilde`."""
        rows = [nd.to_json() if values is None else nd.to_json(values.G_bar[i], values.V_tilde[i])
                for i, nd in enumerate(self.nodes)]
        return {"task_id": self.task_id, "group": self.group, "nodes": rows,
                "paths": {str(k): v for k, v in self.paths.items()}}

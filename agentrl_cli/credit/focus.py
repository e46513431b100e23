"""FOCUS: continuation gain for rollout allocation and refined values on a search tree
(docs/methods.md).

The tree is given in parent-array form: node 0 is the root (parent -1), every other node's
parent has a smaller or larger index (any order works, cycles are rejected). A node is a leaf —
the terminal state of one episode — iff its `leaf_reward` is not None.
"""
from __future__ import annotations

from collections import deque
from typing import Sequence


def calibrated(v: float, n: int, cbar: float, kappa: float = 1.0) -> float:
    """`(kappa v + n cbar) / (kappa + n)`: the critic value v as a Beta prior of strength kappa,
    mixed with the mean cbar of n outcomes (the refined value `V~` of Eq. 1 when n > 0)."""
    return (kappa * v + n * cbar) / (kappa + n)


def calibrated_mse(v: float, n: int, p: float, kappa: float = 1.0) -> float:
    """`MSE_n(p) = (kappa^2 (v - p)^2 + n p (1 - p)) / (kappa + n)^2`.

    Expected squared error of the calibrated estimate `m_n = (kappa v + n cbar) / (kappa + n)`
    (Beta prior of strength kappa centred on the critic value v, n Bernoulli(p) outcomes) when
    the true value is p. the paper leaves this form to be reconstructed.
    """
    return (kappa ** 2 * (v - p) ** 2 + n * p * (1.0 - p)) / (kappa + n) ** 2


GAIN_KINDS = ("plugin", "bayes")   # `algo.focus_gain`: the definitions `focus_gain` offers


def focus_gain(v: float, n: int, cbar: float, kappa: float = 1.0, n_inflight: int = 0,
               kind: str = "plugin") -> float:
    """Expected benefit of one more continuation from a node.

    v: critic value V(s) in [0, 1]; n: completed leaves below s; cbar: their mean outcome;
    n_inflight: continuations from s (or below it) still running.
    kind="plugin" (default): `MSE_{n_eff}(cbar) - MSE_{n_eff+1}(cbar)` with the plug-in true value
        `p = cbar` and `n_eff = n + n_inflight`, so in-flight work is not double-booked while
        `cbar` uses completed continuations only. With kappa = 1, n = 1 and cbar in {0, 1} this is
        `5 (v - cbar)^2 / 36`.
    kind="bayes": the posterior-variance drop `m (1 - m) / (kappa + n_eff + 1)^2` with
        `m = (kappa v + n cbar) / (kappa + n)` from the completed n.
    Unknown `kind` raises ValueError.
    """
    if n < 0 or n_inflight < 0:
        raise ValueError(f"n and n_inflight must be >= 0, got n={n}, n_inflight={n_inflight}")
    n_eff = n + n_inflight
    if kind == "plugin":
        return calibrated_mse(v, n_eff, cbar, kappa) - calibrated_mse(v, n_eff + 1, cbar, kappa)
    if kind == "bayes":
        m = calibrated(v, n, cbar, kappa)
        return m * (1.0 - m) / (kappa + n_eff + 1) ** 2
    raise ValueError(f"unknown gain kind '{kind}'; valid: {', '.join(sorted(GAIN_KINDS))}")


def _children_and_order(parent: Sequence[int], n_nodes: int) -> tuple[list[list[int]], list[int]]:
    """Children lists and a root-first (BFS) order; raises on a malformed tree."""
    if n_nodes == 0 or parent[0] != -1:
        raise ValueError("node 0 must be the root (parent -1)")
    children: list[list[int]] = [[] for _ in range(n_nodes)]
    for node in range(1, n_nodes):
        p = parent[node]
        if not 0 <= p < n_nodes or p == node:
            raise ValueError(f"node {node} has invalid parent {p}")
        children[p].append(node)
    order, queue = [], deque([0])
    while queue:
        node = queue.popleft()
        order.append(node)
        queue.extend(children[node])
    if len(order) != n_nodes:
        raise ValueError("parent array is not a tree rooted at node 0 (cycle or stray node)")
    return children, order


def refine_values(parent: Sequence[int], leaf_reward: Sequence[float | None],
                  critic: Sequence[float], kappa: float = 1.0,
                  gamma: float = 1.0) -> tuple[list[float | None], list[float]]:
    """Refined values by one-step backup (docs/methods.md, Eq. 1), bottom-up.

    parent: [N] parent index per node, -1 for the root (node 0).
    leaf_reward: [N] terminal reward R at leaves, None at internal nodes.
    critic: [N] critic values V(s) (ignored at leaves).
    Returns (G_bar [N], V_tilde [N]):
        `V~(leaf) = R`, `G_bar(leaf) = None`;
        `G_bar(s) = mean_{c in C(s)} [R_c if c is a leaf else gamma V~(c)]` (the reward on the
        edge into a leaf is not discounted);
        `V~(s) = (kappa V(s) + |C(s)| G_bar(s)) / (kappa + |C(s)|)`.
    A non-leaf node without children (e.g. a continuation that has not finished) has no
    evidence: its G_bar is None and its V~ is the critic value.
    G_bar is the critic's regression target; V~ feeds `segment_td_advantages`.
    """
    N = len(parent)
    if len(leaf_reward) != N or len(critic) != N:
        raise ValueError("parent, leaf_reward and critic must have the same length")
    children, order = _children_and_order(parent, N)
    g_bar: list[float | None] = [None] * N
    v_tilde: list[float] = [0.0] * N
    for node in reversed(order):  # children before parents
        if leaf_reward[node] is not None:
            if children[node]:
                raise ValueError(f"leaf {node} (has a reward) cannot have children")
            v_tilde[node] = float(leaf_reward[node])
            continue
        kids = children[node]
        if not kids:
            v_tilde[node] = float(critic[node])
            continue
        targets = [float(leaf_reward[c]) if leaf_reward[c] is not None else gamma * v_tilde[c]
                   for c in kids]
        g = sum(targets) / len(targets)
        g_bar[node] = g
        v_tilde[node] = calibrated(critic[node], len(kids), g, kappa)
    return g_bar, v_tilde

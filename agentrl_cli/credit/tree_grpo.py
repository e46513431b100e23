"""Tree-GRPO's credit (Ji et al., "Tree Search for LLM Agent Reinforcement Learning", arXiv
2509.21240), on the trees the FOCUS controller grows (docs/methods.md, tree_grpo).

A task's tree here is Tree-GRPO's forest of one prompt: the root is the prompt, and every
path that leaves the root (a root episode, or a continuation launched from the root) starts
one of Tree-GRPO's trees, the subtree under its first node. Each finished path (leaf) `i` with
outcome `R_i` gets the sum of two group-relative advantages (the paper's Eq. for
`A(H_i) = A_intra + A_inter`):

    A_intra(i) = (R_i - mean_{j in tree(i)} R_j) / (std_{j in tree(i)} R_j + eps)
    A_inter(i) = (R_i - mean_{j in task} R_j) / (std_{j in task} R_j + eps)

(population std; a group of one leaf, or of equal rewards, gives 0). No critic.

Tokens: in a tree every shared prefix is generated, stored and trained once (by the path that
generated it), where Tree-GRPO's per-trajectory loss trains it once per trajectory through it.
Here each segment's tokens get the mean advantage of the leaves below the state the segment
leads to (for a path's last segment: its own leaf's), which is Tree-GRPO's per-token
gradient up to the count of trajectories sharing the prefix; the resulting process credit is
the paper's "implicit step-level preference".
"""
from __future__ import annotations

import torch

from . import batched
from .estimators import ESTIMATORS, Credit
from .focus_credit import FocusTree, step_trees

EPS = 1e-6


def _relative(rewards: list[float], eps: float) -> list[float]:
    """Group-relative advantages (R - mean) / (std + eps), population std."""
    if len(rewards) < 2:
        return [0.0] * len(rewards)
    m = sum(rewards) / len(rewards)
    sd = (sum((r - m) ** 2 for r in rewards) / len(rewards)) ** 0.5
    return [(r - m) / (sd + eps) for r in rewards]


def leaf_advantages(tree: FocusTree, eps: float = EPS) -> dict[int, float]:
    """Tree-GRPO's advantage of each finished path of `tree` (row -> A_intra + A_inter)."""
    rows = sorted(tree.paths)
    reward = {p: float(tree.reward[tree.paths[p][-1]]) for p in rows}
    inter = dict(zip(rows, _relative([reward[p] for p in rows], eps)))
    by_tree: dict[int, list[int]] = {}
    for p in rows:
        ids = tree.paths[p]
        by_tree.setdefault(ids[1] if len(ids) > 1 else -1 - p, []).append(p)
    out = {}
    for members in by_tree.values():
        for p, a in zip(members, _relative([reward[q] for q in members], eps)):
            out[p] = a + inter[p]
    return out


def segment_advantages(trees: list[FocusTree], n_paths: int, eps: float = EPS) -> torch.Tensor:
    """[n_paths, K] each path's segment advantages: segment k of path p (the tokens from its
    node k to its node k + 1) gets the mean leaf advantage of the finished paths through node
    k + 1 (module docstring); 0 beyond a path's segments."""
    rows: list[list[float]] = [[] for _ in range(n_paths)]
    for tree in trees:
        adv = leaf_advantages(tree, eps)
        below: dict[int, list[float]] = {}
        for p, ids in tree.paths.items():
            for i in ids[1:]:
                below.setdefault(i, []).append(adv[p])
        for p, ids in tree.paths.items():
            rows[p] = [sum(below[i]) / len(below[i]) for i in ids[1:]]
    K = max((len(r) for r in rows), default=0)
    out = torch.zeros(n_paths, max(K, 1))
    for p, r in enumerate(rows):
        if r:
            out[p, :len(r)] = torch.tensor(r)
    return out


@ESTIMATORS.register("tree_grpo", reads=())
def tree_grpo_credit(batch, algo) -> Credit:
    """Tree-GRPO's credit of a step's batch from its trees (module docstring)."""
    seg = segment_advantages(step_trees(batch, "tree_grpo"), batch.size)
    return Credit(batched.broadcast_turn_values(seg, batch.segment_index, batch.response_mask))

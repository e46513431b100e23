"""FOCUS credit, in one place (docs/methods.md, focus): everything computed from a step's search
trees once the rollout is done, and every `algo.focus_*` key that credit reads.

The rollout hands over plain arrays (`FocusTrees`, the payload of the FOCUS controller in
`batch.payload`: a `FocusTree` per task tree; the Tree's own evidence bookkeeping, which the allocator needs while the step runs,
stays in `rollout.tree`). From them, per tree:
- the prior of Eq. 1 (`algo.focus_prior`): each node's critic value V(s) (0.5 where never
  computed, the untrained value head's output), or the tree's mean reward (`tree_prior`);
- the refined values (`refine_tree`, Eq. 1 by `credit.refine_values`): `G_bar(s)` (the
  critic's target) and `V~(s)`;
- each path's baseline (`algo.focus_baseline`): the refined values of its non-leaf states
  (`path_values`), or the same with the path's own leaf left out (`path_values_loo`);
- the critic targets: `G_bar` of every non-leaf node, at its boundary position in the episode
  that first reached it (`algo.focus_critic_targets=tokens`: also every policy token of a
  segment, on the refined value the segment leads to: `with_token_targets`);
  `algo.focus_critic_backup=evidence` backs them up from the tree's outcomes only (`kappa = 0`
  in Eq. 1: `target_values`), so the critic is not regressed toward its own values.
Then over the batch: `A_k = sum_l (gamma lam)^l delta_{k+l}` with `delta_k = (R if k = K-1 else
gamma V~(s_{k+1})) - V~(s_k)` (`credit.segment_td_advantages`, lam = `algo.focus_lam`),
broadcast to the policy tokens of segment k (`algo.focus_return=subtree`: `A_k = target_k -
V~(s_k)` with the targets of `path_returns`, every outcome below the state a segment leads to).
A continuation's inherited segments carry no policy tokens in its episode (response_mask 0), so
every segment is trained once; `algo.focus_segment_weight=visit` scales each segment's
advantage by its state's on-policy share (`visit_weights`, `visit_scale`), last.
`algo.focus_norm=tree` centres a tree's advantages on its policy tokens and divides them by the
std of its paths' rewards (and zeroes a tree without outcome contrast), the per-task scale
GRPO's group normalisation gives; `algo.focus_norm=contrast` only zeroes a tree without outcome
contrast (`contrast_gate`); `algo.whiten` optionally normalises the advantages over the
batch instead. The step's `focus/critic_mse` (critic vs its targets) is reported with the credit.

Path ids are rows: path p of a step is row p of its episodes (the planner's launch order).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import batched
from .estimators import ESTIMATORS, Credit, value_free
from .focus import calibrated, refine_values
from .gae import segment_td_advantages

UNTRAINED_VALUE = 0.5   # a node whose critic value was never computed: the untrained head's output


@dataclass
class FocusTree:
    """One task's search tree of a step, as plain arrays (node 0 is the root)."""

    parent: list[int]                  # [N] parent node id, -1 for the root
    reward: list[float | None]         # [N] terminal reward R at leaves, None at inner nodes
    critic: list[float | None]         # [N] critic V(s) at inner nodes (None: never computed)
    position: list[int]                # [N] the node's boundary position (tokens of context)
    creator: list[int]                 # [N] the path (row) that first reached the node
    paths: dict[int, list[int]]        # finished path (row) -> its node ids, root..leaf


@dataclass
class FocusTrees:
    """A tree controller's payload (`RolloutResult.payload`): the step's search trees as plain
    arrays, one per task tree, for the estimators that credit trees (focus, tree_grpo)."""

    trees: list[FocusTree]


def step_trees(batch, estimator: str) -> list[FocusTree]:
    """The step's trees from `batch.payload`; a one-line error for a rollout without trees."""
    found = batch.payload.get(FocusTrees)
    if found is None:
        raise ValueError(f"estimator '{estimator}' needs search trees from a tree controller "
                         "(algo.controller=focus)")
    return found.trees


@dataclass
class TreeValues:
    """A tree's refined values (Eq. 1) and the prior they were refined with."""

    G_bar: list[float | None]          # [N] backed-up target, None at leaves and childless nodes
    V_tilde: list[float]               # [N] refined value (R at leaves)
    prior: float | None = None         # what replaced every critic value (None: the critic)


def tree_prior(tree: FocusTree) -> float:
    """Mean reward of the tree's finished paths (its leaves; 0.5 if none): the prior of
    `algo.focus_prior=tree`."""
    rewards = [r for r in tree.reward if r is not None]
    return sum(rewards) / len(rewards) if rewards else UNTRAINED_VALUE


def _v(tree: FocusTree, i: int, prior: float | None) -> float:
    """Node i's V(s) in Eq. 1: the prior when given, else its critic value (0.5 if none)."""
    if prior is not None:
        return prior
    v = tree.critic[i]
    return UNTRAINED_VALUE if v is None else v


def refine_tree(tree: FocusTree, kappa: float, gamma: float, prior: float | None = None) -> TreeValues:
    """`credit.refine_values` (Eq. 1) on the tree; `prior` replaces every critic value."""
    critic = [0.0 if r is not None else _v(tree, i, prior) for i, r in enumerate(tree.reward)]
    g_bar, v_tilde = refine_values(tree.parent, tree.reward, critic, kappa, gamma)
    return TreeValues(g_bar, v_tilde, prior)


def tree_values(tree: FocusTree, algo) -> TreeValues:
    """The refined values the run's settings give (`algo.kappa`, `algo.gamma`, `algo.focus_prior`)."""
    prior = tree_prior(tree) if algo.focus_prior == "tree" else None
    return refine_tree(tree, algo.kappa, algo.gamma, prior)


def path_values(tree: FocusTree, vals: TreeValues, path: int) -> list[float]:
    """[V~(s_0), ..., V~(s_{K-1})] of a finished path (its non-leaf states)."""
    return [vals.V_tilde[i] for i in tree.paths[path][:-1]]


def path_values_loo(tree: FocusTree, vals: TreeValues, path: int, kappa: float,
                    gamma: float) -> list[float]:
    """`path_values` with the path's own leaf left out (`algo.focus_baseline=loo`).

    Bottom-up along the path, each node's `V~` is recomputed (Eq. 1) from its children
    without the path's leaf: the on-path child contributes its own leave-one-out value, the
    other children their usual targets, and a node left without evidence falls back to its
    critic value (or the prior `vals` were refined with). So `R` never enters the baseline it
    is compared with; e.g. on an unbranched path `V~_-(s_k) = (kappa V(s_k) + V(s_{k+1})) /
    (kappa + 1)`."""
    children: list[list[int]] = [[] for _ in tree.parent]
    for i, p in enumerate(tree.parent):
        if p >= 0:
            children[p].append(i)
    ids = tree.paths[path]
    out: list[float] = []
    below: float | None = None             # LOO value of the on-path child (None: own leaf)
    for i in range(len(ids) - 2, -1, -1):
        node, on_path = ids[i], ids[i + 1]
        targets = []
        for c in children[node]:
            if c == on_path:
                if below is not None:
                    targets.append(gamma * below)
            elif tree.reward[c] is not None:
                targets.append(float(tree.reward[c]))
            else:
                targets.append(gamma * vals.V_tilde[c])
        v = _v(tree, node, vals.prior)
        below = calibrated(v, len(targets), sum(targets) / len(targets), kappa) if targets else v
        out.append(below)
    return out[::-1]


def target_values(tree: FocusTree, vals: TreeValues, algo) -> TreeValues:
    """The values whose `G_bar` the critic regresses on: the refined values `vals` (the paper's),
    or with `algo.focus_critic_backup=evidence` Eq. 1 with `kappa = 0`, the one-step backup of
    the tree's outcomes alone (a node's critic value only where it has no finished child)."""
    if algo.focus_critic_backup == "evidence":
        return refine_tree(tree, 0.0, algo.gamma, vals.prior)
    return vals


def path_returns(tree: FocusTree, vals: TreeValues, evidence: TreeValues, path: int,
                 lam: float, gamma: float) -> list[float]:
    """`algo.focus_return=subtree`: each segment's target, from the state s_{k+1} it leads to:
    `(1 - lam) gamma V~(s_{k+1}) + lam gamma G(s_{k+1})`, G the evidence-only value (`evidence`:
    Eq. 1 with kappa = 0, the recursive mean outcome of the samples below s_{k+1}); the last
    segment's target is the path's reward R. On a path with no branch below s_{k+1}, G is R's
    (discounted) value, so with lam = 1 it equals the path return's target."""
    ids = tree.paths[path]
    out = [gamma * ((1.0 - lam) * vals.V_tilde[i] + lam * evidence.V_tilde[i]) for i in ids[1:-1]]
    out.append(float(tree.reward[ids[-1]]))
    return out


def padded(rows: list[list[float]]) -> torch.Tensor:
    """[B, max K] the per-path rows, 0-padded on the right."""
    out = torch.zeros(len(rows), max((len(r) for r in rows), default=0))
    for b, row in enumerate(rows):
        if row:
            out[b, :len(row)] = torch.tensor(row)
    return out


def subtree_advantages(values: list[list[float]], returns: list[list[float]]) -> torch.Tensor:
    """[B, max K] segment advantages `target_k - V(s_k)` (0-padded) of `path_returns`."""
    return padded(returns) - padded(values)


def path_credit(trees: list[FocusTree], algo, n_paths: int):
    """-> (each path's baseline values [n_paths][K_p] (`algo.focus_baseline`), each path's
    critic targets [n_paths][(position, G_bar)] (`algo.focus_critic_backup`), the trees' refined
    values, the values the targets came from (`target_values`: the refined ones by default))."""
    values: list[list[float]] = [[] for _ in range(n_paths)]
    targets: list[list[tuple[int, float]]] = [[] for _ in range(n_paths)]
    refined = [tree_values(t, algo) for t in trees]
    for tree, vals in zip(trees, refined):
        for p in tree.paths:
            values[p] = (path_values_loo(tree, vals, p, algo.kappa, algo.gamma)
                         if algo.focus_baseline == "loo" else path_values(tree, vals, p))
    backed = [target_values(t, v, algo) for t, v in zip(trees, refined)]
    for tree, vals in zip(trees, backed):
        for i, g in enumerate(vals.G_bar):
            if tree.reward[i] is None and g is not None:
                targets[tree.creator[i]].append((tree.position[i], g))
    return values, targets, refined, backed


def segment_returns(trees: list[FocusTree], refined: list[TreeValues], algo,
                    n_paths: int) -> list[list[float]]:
    """Every path's `path_returns` (row p: path p), from the trees' refined values."""
    out: list[list[float]] = [[] for _ in range(n_paths)]
    for tree, vals in zip(trees, refined):
        evidence = refine_tree(tree, 0.0, algo.gamma, vals.prior)
        for p in tree.paths:
            out[p] = path_returns(tree, vals, evidence, p, algo.focus_lam, algo.gamma)
    return out


def visit_weights(tree: FocusTree) -> dict[int, list[float]]:
    """`algo.focus_segment_weight=visit`: per finished path, each segment's weight: the on-policy
    share of the state it leads to, `w(child) = w(s) / |C(s)|` from `w(root) = 1`, where C(s)
    are the children of s that lie on a finished path (a segment is one of |C(s)| samples
    drawn at s, and s is reached with share w(s))."""
    children: dict[int, set[int]] = {}
    for ids in tree.paths.values():
        for a, b in zip(ids, ids[1:]):
            children.setdefault(a, set()).add(b)
    share = {0: 1.0}
    for ids in tree.paths.values():
        for a, b in zip(ids, ids[1:]):
            share[b] = share[a] / len(children[a])
    return {p: [share[i] for i in ids[1:]] for p, ids in tree.paths.items()}


def visit_scale(trees: list[FocusTree], shape: tuple[int, int], segment_index: torch.Tensor,
                response_mask: torch.Tensor) -> torch.Tensor:
    """[B, L] per-token factor of `algo.focus_segment_weight=visit`: each policy token carries
    its segment's `visit_weights`, rescaled per tree so that the tree's policy tokens keep their
    total weight (their count)."""
    seg = torch.zeros(shape)
    for tree in trees:
        for p, w in visit_weights(tree).items():
            seg[p, :len(w)] = torch.tensor(w)
    tok = batched.broadcast_turn_values(seg, segment_index, response_mask)
    mask = (response_mask > 0) & (segment_index >= 0)
    for tree in trees:
        rows = list(tree.paths)
        total = float((tok[rows] * mask[rows]).sum())
        if total > 0:
            tok[rows] *= float(mask[rows].sum()) / total
    return tok


def critic_mse(trees: list[FocusTree], refined: list[TreeValues]) -> float:
    """Mean `(V(s) - G_bar(s))^2` over the inner nodes with a critic value and a target."""
    err = [(v - g) ** 2 for t, vals in zip(trees, refined)
           for v, g, r in zip(t.critic, vals.G_bar, t.reward)
           if r is None and g is not None and v is not None]
    return sum(err) / len(err) if err else 0.0


def focus_segment_advantages(values: list[list[float]], rewards: list[float], gamma: float,
                             lam: float) -> torch.Tensor:
    """[B, max K] segment advantages (0-padded) from per-episode refined values."""
    return padded([segment_td_advantages(v, r, gamma, lam) if v else []
                   for v, r in zip(values, rewards)])


def focus_critic_targets(targets: list[list[tuple[int, float]]], shape: tuple[int, int]):
    """-> (returns [B, L], value_mask [B, L]) with G_bar at each node's boundary position."""
    returns = torch.zeros(shape)
    mask = torch.zeros(shape)
    for b, row in enumerate(targets):
        for pos, g in row:
            returns[b, pos] = g
            mask[b, pos] = 1.0
    return returns, mask


def segment_targets(values: list[list[float]], rewards: list[float], gamma: float) -> torch.Tensor:
    """[B, max K] per-segment critic targets: segment k of a path leads to `gamma V~(s_{k+1})`,
    the last one to the path's reward R (0-padded)."""
    return padded([[r if k == len(v) - 1 else gamma * v[k + 1] for k in range(len(v))]
                   for v, r in zip(values, rewards)])


def with_token_targets(returns: torch.Tensor, value_mask: torch.Tensor, values: list[list[float]],
                       rewards: list[float], gamma: float, segment_index: torch.Tensor,
                       response_mask: torch.Tensor):
    """`algo.focus_critic_targets=tokens`: besides `G_bar` at the tree nodes' boundaries, every
    policy token of segment k is regressed on the refined value the segment leads to
    (`segment_targets`), as PPO regresses every token on its return. The nodes keep theirs."""
    seg = segment_targets(values, rewards, gamma)
    tok = batched.broadcast_turn_values(seg, segment_index, response_mask)
    on_tok = ((segment_index >= 0) & (response_mask > 0)).to(returns.dtype)
    node = value_mask > 0
    return torch.where(node, returns, tok), torch.where(node, value_mask, on_tok)


def tree_scale(rewards: torch.Tensor, group_index: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """[B] per-path factor of `algo.focus_norm=tree`: `1 / (std + eps)` of the rewards of the
    path's task tree (all its paths: roots and continuations; sample std, as GRPO's group), and
    0 for every path of a tree whose paths all got the same reward (no outcome contrast in the
    tree, so no policy signal: GRPO's rule for such a group)."""
    _, _, sd, informative = batched._group_stats(rewards, group_index)
    return torch.where(informative, 1.0 / (sd + eps), torch.zeros_like(sd))


def contrast_gate(adv: torch.Tensor, rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """[B, L] `algo.focus_norm=contrast`: the raw advantages, but 0 on every path of a task tree
    whose paths all got the same reward (GRPO's rule for a group without outcome contrast), with
    no centring or scaling. In such a tree `A_k = R - V~(s_k)` is only the critic's offset: an
    all-fail tree pushes every call it made down by its value, where GRPO gives no gradient."""
    informative = batched._group_stats(rewards, group_index)[3]
    return adv * informative.to(adv.dtype)[:, None]


def tree_normalize(adv: torch.Tensor, mask: torch.Tensor, rewards: torch.Tensor,
                   group_index: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """[B, L] `algo.focus_norm=tree`: per task tree (rows sharing `group_index`), subtract the
    mean advantage over the tree's policy tokens, then divide by the std of its paths' rewards
    (`tree_scale`: 0 for a tree without outcome contrast).

    Centring per tree replaces the critic's offset for that task (a critic that lags behind a
    policy that improves puts every path of a task above or below its baseline) by the tree's
    own evidence, keeping the state-dependent part of the refined values; the scale is GRPO's
    per-group one, so a hard task's rare success weighs as much as under GRPO."""
    _, inv = torch.unique(group_index, return_inverse=True)
    n = int(inv.max()) + 1 if inv.numel() else 0
    tok = torch.zeros(n, dtype=adv.dtype).scatter_add_(0, inv, (adv * mask).sum(1))
    cnt = torch.zeros(n, dtype=adv.dtype).scatter_add_(0, inv, mask.sum(1).to(adv.dtype))
    mean = tok / cnt.clamp(min=1)
    scale = tree_scale(rewards, group_index, eps)
    return (adv - mean[inv][:, None]) * mask * scale[:, None]


@ESTIMATORS.register("focus", reads=("algo.kappa", "algo.gamma", "algo.focus_prior",
                                        "algo.focus_baseline", "algo.focus_lam", "algo.focus_norm",
                                        "algo.focus_critic_targets", "algo.focus_critic_backup",
                                        "algo.focus_return", "algo.focus_segment_weight",
                                        "algo.whiten"))
@value_free                     # it reads its critic inside the trees (`FocusTree.critic`)
def focus_credit(batch, algo) -> Credit:
    """FOCUS credit of a step's batch from its trees (module docstring)."""
    trees = step_trees(batch, "focus")
    values, targets, refined, backed = path_credit(trees, algo, batch.size)
    rewards = batch.rewards.tolist()
    if algo.focus_return == "subtree":
        seg = subtree_advantages(values, segment_returns(trees, refined, algo, batch.size))
    else:
        seg = focus_segment_advantages(values, rewards, algo.gamma, algo.focus_lam)
    adv = batched.broadcast_turn_values(seg, batch.segment_index, batch.response_mask)
    if algo.focus_norm == "tree":
        adv = tree_normalize(adv, batch.response_mask, batch.rewards, batch.group_index)
    elif algo.focus_norm == "contrast":
        adv = contrast_gate(adv, batch.rewards, batch.group_index)
    if algo.whiten:
        adv = batched.masked_whiten(adv, batch.response_mask)
    if algo.focus_segment_weight == "visit":
        adv = adv * visit_scale(trees, tuple(seg.shape), batch.segment_index, batch.response_mask)
    returns, value_mask = focus_critic_targets(targets, tuple(batch.input_ids.shape))
    if algo.focus_critic_targets == "tokens":
        returns, value_mask = with_token_targets(returns, value_mask, values, rewards, algo.gamma,
                                                 batch.segment_index, batch.response_mask)
    return Credit(adv, returns, value_mask, metrics={"focus/critic_mse": critic_mse(trees, backed)})

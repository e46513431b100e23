"""The "focus" estimator: segment TD advantages of FOCUS's refined values (docs/methods.md).

Inputs, from the "focus" rollout controller through `batch.extras`:
- `focus_values[b]`: `[V~(s_0), ..., V~(s_{K_b-1})]`, the refined values of the non-leaf states
  on episode b's root-to-leaf path;
- `focus_value_targets[b]`: `[(position, G_bar), ...]`, the backed-up critic target of every
  non-leaf node that episode b first reached, at the node's boundary position (the column
  where `values[:, p_k] = V(s_k)`; each node appears in exactly one episode).

`A_k = sum_l (gamma lam)^l delta_{k+l}` with `delta_k = (R if k = K-1 else gamma V~(s_{k+1})) -
V~(s_k)` (`credit.segment_td_advantages`, lam = `algo.focus_lam`, 0 by default), broadcast to the
policy tokens of segment k. A continuation's inherited segments carry no policy tokens in its
episode (response_mask 0), so every segment is trained once. `algo.focus_norm=tree` centres a
tree's advantages on its policy tokens and divides them by the std of its paths' rewards (and
zeroes a tree without outcome contrast), the per-task scale GRPO's group normalisation gives; `algo.whiten` optionally normalises the
advantages over the batch instead.
"""
from __future__ import annotations

import torch

from . import batched
from .estimators import ESTIMATORS, Credit
from .gae import segment_td_advantages


def focus_segment_advantages(values: list[list[float]], rewards: list[float], gamma: float,
                             lam: float) -> torch.Tensor:
    """[B, max K] segment advantages (0-padded) from per-episode refined values."""
    width = max((len(v) for v in values), default=0)
    out = torch.zeros(len(values), width)
    for b, (v, r) in enumerate(zip(values, rewards)):
        if v:
            out[b, :len(v)] = torch.tensor(segment_td_advantages(v, r, gamma, lam))
    return out


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
    width = max((len(v) for v in values), default=0)
    out = torch.zeros(len(values), width)
    for b, (v, r) in enumerate(zip(values, rewards)):
        for k in range(len(v)):
            out[b, k] = r if k == len(v) - 1 else gamma * v[k + 1]
    return out


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


@ESTIMATORS.register("focus", reads=("algo.gamma", "algo.focus_lam", "algo.focus_norm", "algo.whiten",
                                        "algo.focus_critic_targets"))
def focus_credit(batch, algo) -> Credit:
    if "focus_values" not in batch.extras:
        raise ValueError("estimator 'focus' needs refined values from the 'focus' controller")
    seg = focus_segment_advantages(batch.extras["focus_values"], batch.rewards.tolist(),
                                   algo.gamma, algo.focus_lam)
    adv = batched.broadcast_turn_values(seg, batch.segment_index, batch.response_mask)
    if algo.focus_norm == "tree":
        adv = tree_normalize(adv, batch.response_mask, batch.rewards, batch.group_index)
    if algo.whiten:
        adv = batched.masked_whiten(adv, batch.response_mask)
    returns, value_mask = focus_critic_targets(batch.extras["focus_value_targets"],
                                               tuple(batch.input_ids.shape))
    if algo.focus_critic_targets == "tokens":
        returns, value_mask = with_token_targets(returns, value_mask, batch.extras["focus_values"],
                                                 batch.rewards.tolist(), algo.gamma,
                                                 batch.segment_index, batch.response_mask)
    return Credit(adv, returns, value_mask)

"""MPO: turn-level credit with token-level resolution (docs/methods.md).

Unbatched reference; `credit.batched.mpo_token_advantages` is the vectorised version.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def mpo_advantages(values: Sequence[Tensor], reward: float, lam: float = 0.80,
                   lam_intra: float = 0.95, beta: float = 1.0) -> list[Tensor]:
    """Multi-scale advantage (MAE) of one episode, before batch normalisation.

    values: list of T tensors, `values[t]` = [n_t] critic values V_{t,i} at the policy tokens of
        turn t (every turn must have at least one policy token).
    reward: terminal reward R, received at the end of the last turn. gamma = 1.
    Returns a list of T tensors [n_t]:
        `A_{t,i} = A^turn_t + beta (A^intra_{t,i} - mean_i A^intra_{t,i})` where
        - `delta_t = 1{t = T} R + V_{t+1,1} - V_{t,1}` (with `V_{T+1,1} = 0`),
          `A^turn_t = sum_l lam^l delta_{t+l}` (credit decays once per turn);
        - `delta_{t,i} = V_{t,i+1} - V_{t,i}` inside the turn, and for the last token
          `delta_{t,n_t} = 1{t = T} R + V_{t+1,1} - V_{t,n_t}`;
          `A^intra_{t,i} = sum_{j>=i} lam_intra^{j-i} delta_{t,j}` (the intra-turn trace does not
          cross turn boundaries — the paper leaves this open, METHODS marks it reconstructed).
    Normalising over the batch's valid tokens (`batched.masked_whiten`) is the caller's job.
    """
    T = len(values)
    if any(v.numel() == 0 for v in values):
        raise ValueError("every turn needs at least one policy token")
    if T == 0:
        return []
    first = [v[0] for v in values]
    zero = values[0].new_zeros(())
    next_first = [first[t + 1] if t + 1 < T else zero for t in range(T)]
    end_reward = [reward if t == T - 1 else 0.0 for t in range(T)]

    turn_adv = [zero] * T
    acc = zero
    for t in reversed(range(T)):
        delta_t = end_reward[t] + next_first[t] - first[t]
        acc = delta_t + lam * acc
        turn_adv[t] = acc

    out = []
    for t in range(T):
        v = values[t]
        next_v = torch.cat([v[1:], next_first[t].reshape(1)])
        delta = next_v - v
        delta[-1] = delta[-1] + end_reward[t]
        intra = torch.zeros_like(v)
        acc = zero
        for i in reversed(range(v.numel())):
            acc = delta[i] + lam_intra * acc
            intra[i] = acc
        out.append(turn_adv[t] + beta * (intra - intra.mean()))
    return out

"""TRACE: critic-free turn credit from a frozen reference model (docs/methods.md).

Unbatched reference; `credit.batched.trace_token_advantages` is the vectorised version.
"""
from __future__ import annotations

import torch
from torch import Tensor


def trace_turn_rewards(mean_logprobs: Tensor, outcome_advantage: float, eps: float = 0.1,
                       K: int = 3, gamma_td: float = 0.8, lambda_term: float = 2.0) -> Tensor:
    """Turn rewards r_0..r_{T-1} of one episode with T tool-call turns.

    mean_logprobs: [T+1], `l_k` = mean token log-prob of the gold answer under the frozen
        reference model, teacher-forced after state S_k (S_0 = the question, S_k = the prefix
        after the k-th tool-call turn).
    outcome_advantage: the episode's GRPO outcome advantage A^out.
    Returns [T]:
        `d_k = -l_k + eps`, `delta_k = log(d_k / d_{k+1})` (the one-step gain in the reference
        model's confidence in the gold answer), `h = min(k + K - 1, T - 1)`,
        `c_k = sum_{u=k}^{h} gamma_td^{u-k} delta_u / sum_{u=k}^{h} gamma_td^{u-k}`,
        `r_k = c_k + 1[h = T - 1] lambda_term gamma_td^{T-k} A^out`.
    Turn credit is not group-normalised (as in the paper). T = 0 gives an empty tensor.
    """
    if mean_logprobs.dim() != 1 or mean_logprobs.numel() < 1:
        raise ValueError("mean_logprobs must be 1-D with T+1 >= 1 entries")
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    T = mean_logprobs.numel() - 1
    d = -mean_logprobs + eps
    log_d = torch.log(d)
    delta = log_d[:-1] - log_d[1:]
    rewards = torch.zeros_like(delta)
    for k in range(T):
        h = min(k + K - 1, T - 1)
        num = sum(gamma_td ** (u - k) * delta[u] for u in range(k, h + 1))
        den = sum(gamma_td ** (u - k) for u in range(k, h + 1))
        r = num / den
        if h == T - 1:
            r = r + lambda_term * gamma_td ** (T - k) * outcome_advantage
        rewards[k] = r
    return rewards

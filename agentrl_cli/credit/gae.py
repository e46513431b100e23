"""Temporal-difference advantages: GAE over a sequence (PPO, docs/methods.md) and TD(lambda)
over one path of segment states (VinePPO §1 and FOCUS §2)."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def gae(rewards: Tensor, values: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over one sequence of T steps.

    rewards: [T] reward after each step (for an episode: zeros, then R on the last step).
    values:  [T] V(s_t); the value after the last step is 0 (the episode is over).
    Returns (advantages [T], returns [T]) with
    `delta_t = r_t + gamma V_{t+1} - V_t`, `A_t = delta_t + gamma lam A_{t+1}`,
    `returns = A + V` (the critic's regression target).
    """
    if rewards.shape != values.shape or rewards.dim() != 1:
        raise ValueError(f"rewards and values must be 1-D of equal length, got "
                         f"{tuple(rewards.shape)} and {tuple(values.shape)}")
    T = rewards.numel()
    advantages = torch.zeros_like(values)
    last = values.new_zeros(())
    for t in reversed(range(T)):
        next_value = values[t + 1] if t + 1 < T else values.new_zeros(())
        delta = rewards[t] + gamma * next_value - values[t]
        last = delta + gamma * lam * last
        advantages[t] = last
    return advantages, advantages + values


def segment_td_advantages(values_tilde: Sequence[float], reward: float, gamma: float = 1.0,
                          lam: float = 0.0) -> list[float]:
    """Segment advantages along one root-to-leaf path (FOCUS §2 policy update; VinePPO).

    values_tilde: [K] values of the segment-start states s_0..s_{K-1} of one episode (FOCUS:
        refined values V~; VinePPO: Monte-Carlo means of the extra continuations).
    reward: the terminal reward R of this episode (reached after segment K-1).
    Returns [K] with `delta_k = (R if k == K-1 else gamma V(s_{k+1})) - V(s_k)` — the reward is
    not discounted on the edge into the leaf — and `A_k = sum_l (gamma lam)^l delta_{k+l}`
    (lam = 0, the FOCUS default, gives the one-step TD residual).
    """
    K = len(values_tilde)
    out = [0.0] * K
    acc = 0.0
    for k in reversed(range(K)):
        target = reward if k == K - 1 else gamma * values_tilde[k + 1]
        delta = target - values_tilde[k]
        acc = delta + gamma * lam * acc
        out[k] = acc
    return out

"""Outcome (episode-level) advantages from a group of episodes of the same task (docs/methods.md).

Unbatched reference definitions; `credit.batched` holds the token-level versions the trainer
uses, which must agree with these exactly.
"""
from __future__ import annotations

import torch
from torch import Tensor


def grpo_advantages(rewards: Tensor, std: bool = True, eps: float = 1e-6) -> Tensor:
    """GRPO advantage of each episode in one group.

    rewards: [G] terminal rewards of the G episodes sampled for one task.
    Returns [G]: `(R_i - mean R) / (std R + eps)` with the sample standard deviation (`n - 1`,
    as `torch.std`, verl and TRL). `std=False` is Dr. GRPO: `R_i - mean R` (the constant length
    normaliser of Dr. GRPO lives in the loss aggregation, not here).
    A group of one has no baseline and gets advantage 0. A group whose rewards are all equal gets
    exactly 0 (otherwise rounding in the mean, divided by `std + eps` = eps, leaves noise of
    order 1e-1 in float32 for rewards like 0.7).
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [G], got shape {tuple(rewards.shape)}")
    if rewards.numel() <= 1 or bool(rewards.max() == rewards.min()):
        return torch.zeros_like(rewards)
    centred = rewards - rewards.mean()
    if not std:
        return centred
    return centred / (rewards.std() + eps)


def rloo_advantages(rewards: Tensor) -> Tensor:
    """REINFORCE leave-one-out advantage: `A_i = R_i - mean_{j != i} R_j`.

    rewards: [G]. Returns [G]. A group of one, or of all-equal rewards, gets exactly 0.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [G], got shape {tuple(rewards.shape)}")
    g = rewards.numel()
    if g <= 1 or bool(rewards.max() == rewards.min()):
        return torch.zeros_like(rewards)
    loo_mean = (rewards.sum() - rewards) / (g - 1)
    return rewards - loo_mean

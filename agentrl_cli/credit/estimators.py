"""The estimator registry: one signature for every advantage estimator the trainer can call.

`estimator(batch, algo) -> Credit` where `batch` is a `train.batch.Batch` with `old_values`
filled when the recipe has a critic, and `algo` is the run's `AlgoConfig`. Each entry only
routes tensors to the pure functions of `credit.batched`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..registry import Registry
from . import batched


@dataclass
class Credit:
    advantages: torch.Tensor              # [B, L], zero outside policy tokens
    returns: torch.Tensor | None = None   # [B, L] critic targets, or None (critic-free)
    value_mask: torch.Tensor | None = None  # [B, L] where the critic is regressed


ESTIMATORS: Registry[Callable[..., Credit]] = Registry("estimator")


@ESTIMATORS.register("grpo")
def _grpo(batch, algo) -> Credit:
    adv = batched.grpo_token_advantages(batch.rewards, batch.group_index, batch.response_mask,
                                        std=algo.std_normalize)
    return Credit(adv)


@ESTIMATORS.register("dr_grpo")
def _dr_grpo(batch, algo) -> Credit:
    adv = batched.grpo_token_advantages(batch.rewards, batch.group_index, batch.response_mask,
                                        std=False)
    return Credit(adv)


@ESTIMATORS.register("rloo")
def _rloo(batch, algo) -> Credit:
    return Credit(batched.rloo_token_advantages(batch.rewards, batch.group_index,
                                                batch.response_mask))

"""Policy-loss registry: `loss(logp_new [b, L], micro_batch, algo) -> (loss, stats)`.

Each entry routes a micro-batch to a pure function of `losses.py`. `algo.agg_norm` reaches them
resolved (the trainer passes `RunConfig.agg_norm`, never 0).
"""
from __future__ import annotations

from typing import Callable

from .. import losses
from ..registry import Registry

POLICY_LOSSES: Registry[Callable] = Registry("loss")


@POLICY_LOSSES.register("ppo_clip", reads=("algo.eps_low", "algo.eps_high", "algo.agg", "algo.agg_norm"))
def _ppo_clip(lp, m, algo):
    return losses.ppo_clip_loss(lp, m.old_logprobs, m.advantages, m.response_mask,
                                algo.eps_low, algo.eps_high, algo.agg, algo.agg_norm)


@POLICY_LOSSES.register("gspo", reads=("algo.eps_low", "algo.eps_high"))
def _gspo(lp, m, algo):
    # the GRPO advantage is constant over an episode's tokens: take it per sequence
    seq_adv = (m.advantages * m.response_mask).sum(1) / m.response_mask.sum(1).clamp(min=1)
    return losses.gspo_loss(lp, m.old_logprobs, seq_adv, m.response_mask,
                            algo.eps_low, algo.eps_high)


@POLICY_LOSSES.register("turn_ratio", reads=("algo.eps_low", "algo.eps_high", "algo.agg",
                                                "algo.agg_norm"))
def _turn_ratio(lp, m, algo):
    return losses.turn_ratio_loss(lp, m.old_logprobs, m.advantages, m.turn_index,
                                  m.response_mask, algo.eps_low, algo.eps_high, algo.agg,
                                  algo.agg_norm)

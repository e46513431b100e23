"""The estimator registry: one signature for every advantage estimator the trainer can call.

`estimator(batch, algo) -> Credit` where `batch` is a `train.batch.Batch` with `old_values`
filled when the recipe has a critic, and `algo` is the run's `AlgoConfig`. Each entry only
routes tensors to the pure functions of `credit.batched`.

What an estimator reads beyond the batch's tokens, rewards and values comes in
`batch.payload` (`types.Payload`), one object per type: the method's controller made it
(`RolloutResult.payload`: VinePPO's `SegmentValues`, FOCUS's `focus_credit.FocusTrees`) or its
preparer added it (`train.prepare`: TRACE's `TraceReference`). The type is the contract; the
trainer passes the payload through without reading it. An estimator that never reads the
critic's per-token values declares it where it registers (`value_free`), so the scoring pass
skips them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..registry import Registry
from . import batched


@dataclass
class Credit:
    advantages: torch.Tensor              # [B, L], zero outside policy tokens
    returns: torch.Tensor | None = None   # [B, L] critic targets, or None (critic-free)
    value_mask: torch.Tensor | None = None  # [B, L] where the critic is regressed
    metrics: dict = field(default_factory=dict)  # the step's credit diagnostics (metrics.jsonl)


ESTIMATORS: Registry[Callable[..., Credit]] = Registry("estimator")


def value_free(estimator: Callable[..., Credit]) -> Callable[..., Credit]:
    """Declare, where an estimator registers, that it never reads `batch.old_values` (the
    critic's per-token values): the trainer's scoring pass then leaves them out."""
    estimator.value_free = True
    return estimator


def reads_values(estimator: Callable[..., Credit]) -> bool:
    """Whether an estimator may read `batch.old_values` (it did not declare `value_free`)."""
    return not getattr(estimator, "value_free", False)


@ESTIMATORS.register("grpo", reads=("algo.std_normalize",))
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


def _whiten(adv: torch.Tensor, mask: torch.Tensor, algo) -> torch.Tensor:
    return batched.masked_whiten(adv, mask) if algo.whiten else adv


@ESTIMATORS.register("gae", reads=("algo.gamma", "algo.lam", "algo.whiten"))
def _gae(batch, algo) -> Credit:
    """PPO (docs/methods.md): token-level GAE on the critic's values, reward on the last policy token.

    Returns are the unwhitened `A + V` (the critic's targets); `algo.whiten` then normalises the
    advantages over the batch's policy tokens (the PPO recipe turns it on).
    """
    if batch.old_values is None:
        raise ValueError("estimator 'gae' needs critic values (a recipe with critic=True)")
    adv, returns = batched.gae_token_advantages(batch.rewards, batch.old_values, batch.response_mask,
                                                gamma=algo.gamma, lam=algo.lam)
    return Credit(_whiten(adv, batch.response_mask, algo), returns, batch.response_mask)


def segment_values_tensor(values: list[list[float]], dtype=torch.float32) -> torch.Tensor:
    """Per-episode lists of V(s_0..s_{T_b-1}) -> [B, max T_b], right-padded with NaN."""
    width = max((len(v) for v in values), default=0)
    out = torch.full((len(values), width), float("nan"), dtype=dtype)
    for b, v in enumerate(values):
        if v:
            out[b, :len(v)] = torch.tensor(v, dtype=dtype)
    return out


def vine_segment_advantages(values: torch.Tensor, num_segments: torch.Tensor, rewards: torch.Tensor,
                            gamma: float = 1.0) -> torch.Tensor:
    """VinePPO one-step segment advantages, [B, S] (docs/methods.md).

    values: [B, S] Monte-Carlo V(s_k) (NaN where a state got no continuation, e.g. budget spent);
    num_segments: [B] long, T_b; rewards: [B] terminal R.
    `A_k = r_k + gamma V(s_{k+1}) - V(s_k)` with `r_k = 1{k = T_b - 1} R` and `V(s_{T_b}) = 0`
    (equals `credit.segment_td_advantages(values, R, gamma, lam=0)` row by row). A segment whose
    two values are not both known gets advantage 0 (it carries no credit rather than a guess).
    """
    B, S = values.shape
    k = torch.arange(S).expand(B, S)
    last = k == (num_segments[:, None] - 1)
    nxt = torch.cat([values[:, 1:], values.new_zeros(B, 1)], dim=1)
    target = torch.where(last, rewards[:, None].to(values.dtype), gamma * nxt)
    adv = target - values
    ok = (k < num_segments[:, None]) & torch.isfinite(adv)
    return torch.where(ok, adv, torch.zeros_like(adv))


@dataclass
class SegmentValues:
    """VinePPO's payload (the "vine" controller, `rollout.vine`): per episode, the Monte-Carlo
    value of each segment's start state and how many continuations each value averages."""

    values: list[list[float]]     # [B][T_b] V(s_k) (NaN: no continuation reached the state)
    counts: list[list[int]]       # [B][T_b] continuations behind each value


@dataclass
class TraceReference:
    """TRACE's payload: the reference model's confidence in the gold answer at every tool-call
    boundary (added by the "trace" preparer, `train/prepare/trace_reference.py`)."""

    mean_logprobs: torch.Tensor   # [B, M] float: l_k of episode b at boundary k (0 beyond T_b)
    num_turns: torch.Tensor       # [B] long: boundaries of episode b (its turns, T_b + 1)

    def to(self, device) -> "TraceReference":
        return TraceReference(self.mean_logprobs.to(device), self.num_turns.to(device))


@ESTIMATORS.register("vine", reads=("algo.gamma", "algo.whiten"))
def _vine(batch, algo) -> Credit:
    """VinePPO (docs/methods.md): segment TD residuals of the vine controller's Monte-Carlo values
    (the payload's `SegmentValues`, one list per episode) on each segment's policy tokens."""
    seg_values = batch.payload.get(SegmentValues)
    if seg_values is None:
        raise ValueError("estimator 'vine' needs segment values from the 'vine' controller")
    values = segment_values_tensor(seg_values.values)
    valid = (batch.segment_index >= 0) & (batch.response_mask > 0)
    num_segments = torch.where(valid, batch.segment_index, -1).max(1).values + 1
    seg_adv = vine_segment_advantages(values, num_segments, batch.rewards, algo.gamma)
    adv = batched.broadcast_turn_values(seg_adv, batch.segment_index, batch.response_mask)
    return Credit(_whiten(adv, batch.response_mask, algo))


@ESTIMATORS.register("mpo", reads=("algo.lam", "algo.lam_intra", "algo.beta", "algo.whiten"))
def _mpo(batch, algo) -> Credit:
    """MPO (docs/methods.md): multi-scale advantage on the critic's token values, normalised once
    over the batch's policy tokens (`algo.whiten`, on in the recipe); the critic regresses every
    policy token to the terminal reward R (lambda_critic = 1)."""
    if batch.old_values is None:
        raise ValueError("estimator 'mpo' needs critic values (a recipe with critic=True)")
    adv = batched.mpo_token_advantages(batch.old_values, batch.rewards, batch.turn_index,
                                       batch.response_mask, lam=algo.lam,
                                       lam_intra=algo.lam_intra, beta=algo.beta)
    returns = batch.rewards[:, None] * batch.response_mask
    return Credit(_whiten(adv, batch.response_mask, algo), returns, batch.response_mask)


@ESTIMATORS.register("trace", reads=("algo.std_normalize", "algo.trace_eps", "algo.trace_k",
                                        "algo.gamma_td", "algo.lambda_term", "algo.alpha_out",
                                        "algo.alpha_turn"))
def _trace(batch, algo) -> Credit:
    """TRACE (docs/methods.md): GRPO outcome advantage plus reference-model turn credit.

    Needs the payload's `TraceReference`, from the "trace" preparer
    (`train/prepare/trace_reference.py`). The last turn of every episode gets the outcome
    term only: it is the final answer, or (for an episode cut by a limit) a turn whose
    observation never entered the context, so its information gain cannot be measured.
    """
    ref = batch.payload.get(TraceReference)
    if ref is None:
        raise ValueError("estimator 'trace' needs the 'trace' preparer's reference log-probs")
    out = batched.grpo_episode_advantages(batch.rewards, batch.group_index, std=algo.std_normalize)
    adv = batched.trace_token_advantages(
        ref.mean_logprobs, ref.num_turns, out,
        batch.turn_index, batch.response_mask, final_turn_is_answer=True, eps=algo.trace_eps,
        K=algo.trace_k, gamma_td=algo.gamma_td, lambda_term=algo.lambda_term,
        alpha_out=algo.alpha_out, alpha_turn=algo.alpha_turn)
    return Credit(adv)


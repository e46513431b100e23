"""Policy and critic losses: stateless functions of [B, L] token tensors (docs/methods.md).

Conventions: B episodes right-padded to L token positions; `mask` [B, L] is 1.0 on policy tokens
(the only ones with loss) and 0.0 elsewhere; log-probs are per-token log pi(a_t | h_t) of the
sampled tokens. Every loss is to be minimised. `stats` values are detached scalar tensors under
the project's fixed metric names (`clipfrac`, `kl/approx`, ...).

Aggregation (`agg`):
- "token-mean": sum over all valid tokens of the batch / number of valid tokens (DAPO; default);
- "seq-mean":   mean over rows (with at least one valid token) of each row's token mean;
- "token-sum-norm": sum over all valid tokens / (rows x `norm`), a constant `norm` per row
  (Dr. GRPO: no length normalisation; TRL's `loss_type="dr_grpo"` with `norm` =
  `max_completion_length`). Every row counts in `rows`, empty ones included, as in TRL.
"""
from __future__ import annotations

import torch
from torch import Tensor

AGG_MODES = ("token-mean", "seq-mean", "token-sum-norm")


def aggregate(per_token: Tensor, mask: Tensor, agg: str = "token-mean",
              norm: float | None = None) -> Tensor:
    """Reduce per-token values [B, L] to a scalar over the valid tokens (see module docstring).

    Rows without valid tokens are left out of "seq-mean"; an all-empty batch gives 0.
    "token-sum-norm" needs `norm` (> 0), the constant divisor per row.
    """
    mask = mask.to(per_token.dtype)
    if agg == "token-mean":
        return (per_token * mask).sum() / mask.sum().clamp(min=1)
    if agg == "token-sum-norm":
        if norm is None or norm <= 0:
            raise ValueError("aggregation 'token-sum-norm' needs norm > 0 (the per-row constant)")
        return (per_token * mask).sum() / (per_token.shape[0] * norm)
    if agg == "seq-mean":
        tokens = mask.sum(dim=1)
        row_mean = (per_token * mask).sum(dim=1) / tokens.clamp(min=1)
        has_tokens = (tokens > 0).to(per_token.dtype)
        return (row_mean * has_tokens).sum() / has_tokens.sum().clamp(min=1)
    raise ValueError(f"unknown aggregation '{agg}'; valid: {', '.join(AGG_MODES)}")


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1)


def _clipped_surrogate(ratio: Tensor, advantages: Tensor, mask: Tensor, eps_low: float,
                       eps_high: float, agg: str, norm: float | None = None) -> tuple[Tensor, Tensor]:
    """Per-token `-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)` aggregated; also the
    indicator [B, L] of tokens where the clipped branch is active (no gradient)."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped)
    return aggregate(per_token, mask, agg, norm), (clipped > unclipped)


def _policy_stats(log_ratio: Tensor, ratio: Tensor, clip_active: Tensor, mask: Tensor) -> dict:
    """`kl/approx` is the k3 estimator of KL(pi_old || pi_new), `(r - 1) - log r` with the token
    ratio r = pi_new / pi_old: unbiased under samples from pi_old and never negative."""
    with torch.no_grad():
        valid = mask > 0
        ratio = ratio.detach()
        ratio_max = ratio[valid].max() if bool(valid.any()) else ratio.new_zeros(())
        return {
            "clipfrac": _masked_mean(clip_active.to(ratio.dtype), mask),
            "kl/approx": _masked_mean(torch.expm1(log_ratio) - log_ratio, mask),
            "ratio/mean": _masked_mean(ratio, mask),
            "ratio/max": ratio_max,
        }


def _token_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """Accept [B] (per sequence) or [B, L] advantages; return [B, L]."""
    if advantages.dim() == 1:
        return advantages[:, None].expand_as(like)
    return advantages


def ppo_clip_loss(logp_new: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor,
                  eps_low: float = 0.2, eps_high: float = 0.2,
                  agg: str = "token-mean", norm: float | None = None) -> tuple[Tensor, dict]:
    """PPO clipped surrogate with per-token ratios (GRPO, DAPO, PPO; docs/methods.md).

    logp_new, logp_old, mask: [B, L]; advantages: [B, L] (or [B], broadcast to tokens).
    Per token `-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)`, `r = exp(logp_new - logp_old)`;
    `eps_high > eps_low` is DAPO's clip-higher. Returns (scalar loss, stats) with stats
    `clipfrac` (share of valid tokens where the clipped branch is active), `kl/approx` (k3 form,
    see `_policy_stats`), `ratio/mean`, `ratio/max`.
    """
    advantages = _token_advantages(advantages, logp_new)
    log_ratio = logp_new - logp_old
    ratio = torch.exp(log_ratio)
    loss, clip_active = _clipped_surrogate(ratio, advantages, mask, eps_low, eps_high, agg, norm)
    return loss, _policy_stats(log_ratio.detach(), ratio, clip_active, mask)


def gspo_loss(logp_new: Tensor, logp_old: Tensor, seq_advantages: Tensor, mask: Tensor,
              eps_low: float = 3e-4, eps_high: float = 4e-4,
              agg: str = "seq-mean", norm: float | None = None) -> tuple[Tensor, dict]:
    """GSPO: one clipped importance ratio per sequence (docs/methods.md).

    logp_new, logp_old, mask: [B, L]; seq_advantages: [B] or [B, L] (GRPO advantages).
    Sequence ratio `s_i = exp(mean over the row's policy tokens of (logp_new - logp_old))`,
    written in GSPO-token form `s_{i,t} = sg(s_i) * exp(logp_new_t - sg(logp_new_t))`: the forward
    value of every token is s_i, and d s_{i,t} / d logp_new_t = s_i. With the default "seq-mean"
    aggregation each token's gradient therefore carries `s_i A_i / |y_i|` (divided by B), which is
    exactly the gradient of GSPO's sequence objective. Clipping is at [1 - eps_low, 1 + eps_high]
    on s_i. No clamp on the log ratio is applied (the mean of token log ratios stays small).
    Returns (loss, stats) like `ppo_clip_loss`; `clipfrac` counts tokens (so sequences are
    weighted by length).
    """
    advantages = _token_advantages(seq_advantages, logp_new)
    m = mask.to(logp_new.dtype)
    log_ratio = logp_new - logp_old
    seq_log_ratio = (log_ratio * m).sum(1) / m.sum(1).clamp(min=1)
    log_s = seq_log_ratio.detach()[:, None] + logp_new - logp_new.detach()
    ratio = torch.exp(log_s)
    loss, clip_active = _clipped_surrogate(ratio, advantages, mask, eps_low, eps_high, agg, norm)
    return loss, _policy_stats(log_ratio.detach(), ratio, clip_active, mask)


def turn_ratio(logp_new: Tensor, logp_old: Tensor, turn_id: Tensor,
               max_log_ratio: float = 20.0) -> Tensor:
    """MPO turn-level importance ratio (docs/methods.md), flat: [N] -> [N].

    For a token i of turn t: `rho~_i = rho_i * sg(prod_{j != i} rho_j)`. Forward value: the whole
    turn's ratio `rho_t = exp(sum_{j in t} (logp_new_j - logp_old_j))` at every token of the turn;
    gradient w.r.t. `logp_new_i`: `rho_t` (i.e. `rho_t * grad log pi(a_i)`).
    Computed in log space, `exp(sg(S_t) + logp_new_i - sg(logp_new_i))` with `S_t` the turn's sum
    of log ratios, so no product over thousands of tokens is ever formed. For safety `S_t` is
    clamped to [-max_log_ratio, max_log_ratio] (exp(20) ~ 5e8; the clipped loss ignores such
    ratios anyway); the clamp does not change the gradient form.
    turn_id: [N] any integer labels (need not be contiguous or sorted); tokens with a negative id
    belong to no turn: ratio 1 and no gradient.
    """
    valid = turn_id >= 0
    log_ratio = (logp_new - logp_old).detach()
    labels, inv = torch.unique(torch.where(valid, turn_id, turn_id.new_full((), -1)),
                               return_inverse=True)
    turn_sum = torch.zeros(labels.numel(), dtype=log_ratio.dtype, device=log_ratio.device)
    turn_sum.scatter_add_(0, inv, torch.where(valid, log_ratio, torch.zeros_like(log_ratio)))
    token_turn_sum = turn_sum[inv].clamp(-max_log_ratio, max_log_ratio)
    rho = torch.exp(token_turn_sum + logp_new - logp_new.detach())
    return torch.where(valid, rho, torch.ones_like(rho))


def turn_ratio_loss(logp_new: Tensor, logp_old: Tensor, advantages: Tensor, turn_index: Tensor,
                    mask: Tensor, eps_low: float = 0.2, eps_high: float = 0.2,
                    agg: str = "token-mean", norm: float | None = None) -> tuple[Tensor, dict]:
    """MPO clipped loss with the turn-level ratio (docs/methods.md).

    logp_new, logp_old, advantages, mask: [B, L]; turn_index: [B, L] long, the turn of each
    policy token within its row (-1 elsewhere). Each (row, turn) is one turn; only valid policy
    tokens enter a turn's ratio. Per token `-min(rho~ A, clip(rho~, 1 - eps_low, 1 + eps_high) A)`
    with `rho~` from `turn_ratio`, aggregated by `agg`. Stats as `ppo_clip_loss` (`kl/approx`
    from token ratios, `ratio/mean` of the turn ratios).
    """
    B, L = logp_new.shape
    valid = (mask > 0) & (turn_index >= 0)
    width = int(turn_index.max()) + 1 if valid.any() else 1
    rows = torch.arange(B, device=turn_index.device)[:, None]
    turn_id = torch.where(valid, rows * width + turn_index, turn_index.new_full((), -1))
    ratio = turn_ratio(logp_new.reshape(-1), logp_old.reshape(-1), turn_id.reshape(-1)).reshape(B, L)
    loss, clip_active = _clipped_surrogate(ratio, advantages, mask, eps_low, eps_high, agg, norm)
    return loss, _policy_stats((logp_new - logp_old).detach(), ratio, clip_active, mask)


def value_loss(values: Tensor, returns: Tensor, mask: Tensor, old_values: Tensor | None = None,
               clip: float | None = None, agg: str = "token-mean") -> tuple[Tensor, dict]:
    """Critic loss `0.5 * (V - target)^2` over valid tokens (PPO, MPO critic; docs/methods.md).

    values, returns, mask (and old_values): [B, L]. With `clip` and `old_values`, PPO value
    clipping: `0.5 * max((V - R)^2, (old + clip(V - old, -clip, clip) - R)^2)`.
    Stats: `critic/clipfrac` (share of tokens where the clipped term is larger), `critic/values`
    and `critic/returns` (masked means).
    """
    sq = (values - returns) ** 2
    if clip is not None:
        if old_values is None:
            raise ValueError("value clipping needs old_values")
        clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
        sq_clipped = (clipped_values - returns) ** 2
        clip_active = sq_clipped > sq
        sq = torch.maximum(sq, sq_clipped)
    else:
        clip_active = torch.zeros_like(sq, dtype=torch.bool)
    loss = 0.5 * aggregate(sq, mask, agg)
    with torch.no_grad():
        stats = {
            "critic/clipfrac": _masked_mean(clip_active.to(values.dtype), mask),
            "critic/values": _masked_mean(values.detach(), mask),
            "critic/returns": _masked_mean(returns.detach(), mask),
        }
    return loss, stats


def kl_k3(logp_new: Tensor, logp_ref: Tensor, mask: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi_new || pi_ref), [B, L]: `exp(d) - d - 1` with
    `d = logp_ref - logp_new`; >= 0, 0 outside the mask. Aggregate with `aggregate`."""
    d = logp_ref - logp_new
    return (torch.exp(d) - d - 1.0) * mask.to(logp_new.dtype)


KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_penalty(logp_new: Tensor, logp_ref: Tensor, mask: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(pi_new || pi_ref), [B, L], 0 outside the mask, with
    `d = logp_ref - logp_new` (Schulman's estimators): k1 `-d` (unbiased, can be negative),
    k2 `d^2 / 2` (biased, low variance, never negative), k3 `exp(d) - d - 1` (`kl_k3`: unbiased,
    never negative; the default). Aggregate with `aggregate`."""
    if estimator == "k3":
        return kl_k3(logp_new, logp_ref, mask)
    d = logp_ref - logp_new
    if estimator == "k1":
        return -d * mask.to(logp_new.dtype)
    if estimator == "k2":
        return 0.5 * d * d * mask.to(logp_new.dtype)
    raise ValueError(f"unknown KL estimator '{estimator}'; valid: {', '.join(KL_ESTIMATORS)}")

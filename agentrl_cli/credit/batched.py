"""Batched, vectorised advantage estimators — what the trainer calls.

Every function works on a right-padded batch of B episodes flattened to L token positions:

- `response_mask` [B, L] float: 1.0 on policy tokens (trained on), 0.0 on prompt, environment
  observations, harness text and padding.
- `turn_index` [B, L] long: index 0..T_b-1 of the turn (segment) a policy token belongs to,
  -1 elsewhere. Turns are numbered in order of position and every turn 0..T_b-1 has at least
  one policy token.
- `rewards` [B]: terminal reward of each episode; `group_index` [B] long: which group (task) an
  episode belongs to (any labels).

Each function agrees (to float rounding) with the unbatched reference in `credit.outcome`,
`credit.gae`, `credit.mpo` and `credit.trace`; `tests/test_credit.py` checks that on random
batches. No Python loop runs over episodes, turns or tokens (only over TRACE's K look-ahead
steps); recursions are blocked matrix-product scans over packed policy tokens.
Outputs are 0 outside the mask.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

# ----------------------------------------------------------------------------- helpers


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` over positions where `mask` is 1 (all of them, or along `dim`); 0 if none."""
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Normalise `x` [B, L] over the valid positions of the whole batch.

    `(x - mean) / sqrt(var + eps)` with the unbiased (n - 1) masked variance (as verl);
    `shift_mean=False` adds the mean back (rescale only). Positions outside the mask become 0.
    """
    m = mask.to(x.dtype)
    count = m.sum()
    mean = (x * m).sum() / count.clamp(min=1)
    var = (((x - mean) ** 2) * m).sum() / (count - 1).clamp(min=1)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * m


def broadcast_turn_values(per_turn: Tensor, turn_index: Tensor, response_mask: Tensor) -> Tensor:
    """Scatter per-turn (or per-segment) scalars onto their tokens.

    per_turn: [B, Tmax]; turn_index, response_mask: [B, L]. Returns [B, L] with
    `out[b, i] = per_turn[b, turn_index[b, i]]` on policy tokens that have a turn, 0 elsewhere.
    """
    valid = (turn_index >= 0) & (response_mask > 0)
    top = _max_turn(turn_index, valid)
    if top >= per_turn.shape[1]:
        raise ValueError(f"turn_index reaches {top} but per_turn has only {per_turn.shape[1]} columns")
    idx = turn_index.clamp(min=0, max=max(per_turn.shape[1] - 1, 0))
    if per_turn.shape[1] == 0:
        return torch.zeros(turn_index.shape, dtype=per_turn.dtype, device=per_turn.device)
    return torch.where(valid, per_turn.gather(1, idx), per_turn.new_zeros(()))


def _max_turn(turn_index: Tensor, valid: Tensor) -> int:
    """Largest turn index among valid tokens, -1 if there are none."""
    if turn_index.numel() == 0:
        return -1
    return int(torch.where(valid, turn_index, turn_index.new_full((), -1)).max())


_SCAN_CHUNK = 32  # positions per block of the blocked scans (and packed widths' multiple)


class _Packed:
    """The valid (policy) positions of each row of a [B, L] batch, packed to the left in order.

    After packing, "the next policy token" is simply the next column, so environment tokens and
    padding disappear from the recursions. Packed tensors are [B, width]: column 0 is a dump
    that every position which is not packed maps to (emptied after each pack), row b's policy
    tokens fill slots 1..count[b] in order, and at least one empty slot follows (`width` = the
    largest count + 2, rounded up to a multiple of `_SCAN_CHUNK` so that the scans need no
    padding). `last[b] = count[b]` is the slot of row b's last policy token (the dump if the row
    has none).

    Built with one float cumsum; packing is one scatter into a filled buffer, unpacking one
    gather, both through the same [B, L] slot numbers. On a CPU, integer cumsums and cummins,
    and every extra [B, L] pass or fresh buffer (page faults), cost more than the arithmetic
    (a [B, width] index of positions for a gather-based pack cost a third of GAE's time).
    Slot numbers are exact while L < 2^24 (float64 beyond).
    """

    def __init__(self, response_mask: Tensor, turn_index: Tensor | None = None):
        """Packs the positions where `response_mask > 0` (and `turn_index >= 0` if given)."""
        B, L = response_mask.shape
        self.L = L
        device = response_mask.device
        ftype = torch.float32 if L < 2 ** 24 else torch.float64
        # 0/1 in float: comparisons written straight into float buffers and float products are
        # about twice as fast on a CPU as bool tensors and bool -> float conversions
        keep = torch.gt(response_mask, 0, out=torch.empty(B, L, dtype=ftype, device=device))
        if turn_index is not None:
            keep.mul_(torch.ge(turn_index, 0, out=torch.empty_like(keep)))
        seen = keep.cumsum(1)                               # rank among the row's policy tokens
        self.count = seen[:, -1].to(torch.long) if L else torch.zeros(B, dtype=torch.long,
                                                                        device=device)
        self.max_count = int(self.count.max()) if B else 0
        self.width = -(-(self.max_count + 2) // _SCAN_CHUNK) * _SCAN_CHUNK
        self.last = self.count
        self.keep = keep                                    # [B, L] 0/1 float: packed or not
        self._slot = seen.mul_(keep).to(torch.long)         # rank, or 0 (the dump) if not packed

    def pack(self, x: Tensor, fill=0) -> Tensor:
        """[B, L] -> [B, width]; empty slots (the dump included) get `fill`."""
        out = torch.full((x.shape[0], self.width), fill, dtype=x.dtype, device=x.device)
        out.scatter_(1, self._slot, x)                      # everything not packed -> the dump
        out[:, 0] = fill
        return out

    def unpack(self, x: Tensor) -> Tensor:
        """[B, width] -> [B, L]; positions that are not policy tokens get 0. Sets x's dump
        column to 0 in place; other empty slots of x are ignored."""
        x[:, 0] = 0
        return x.gather(1, self._slot)

    def add_at_last(self, x: Tensor, value: Tensor) -> Tensor:
        """`x[b, last[b]] += value[b]` in place (into the dump for a row without tokens)."""
        return x.scatter_add_(1, self.last[:, None], value.to(x.dtype)[:, None])


def _shift_left(x: Tensor, fill=0) -> Tensor:
    """`out[:, j] = x[:, j + 1]`, last column `fill`."""
    return torch.cat([x[:, 1:], torch.full_like(x[:, :1], fill)], dim=1)


def _discounted_suffix_sum(delta: Tensor, decay: float, restart: Tensor | None = None) -> Tensor:
    """`A_j = delta_j + decay * A_{j+1}` right to left along dim 1 of a packed [B, W] tensor.

    decay: a scalar in [0, 1]. restart: optional [B, W] bool; where True the sum does not carry
    over from j+1 (`A_j = delta_j`), e.g. at the last token of a turn. Trailing empty slots must
    hold delta = 0.

    A blocked scan, so that a 1,000-token episode is not 1,000 sequential tiny ops: within
    chunks of `_SCAN_CHUNK` positions the suffix sum is one matrix product with the chunk's
    transfer matrix `M[i, k] = decay^(k - i)` (k >= i), and the chunk starts are the same scan
    one level up (decay^chunk between chunks). Restarts subtract what flowed in from beyond the
    segment's end: `A_j = S_j - decay^(r + 1 - j) S_{r+1}`, with S the unrestarted sum and r the
    first restart at or after j.
    """
    B, W = delta.shape
    if W == 0:
        return delta.clone()
    decay = float(decay)
    S = _blocked_scan(delta, decay)
    if restart is None:
        return S
    after = _segment_ends(restart) + 1
    S_next = torch.cat([S, S.new_zeros(B, 1)], dim=1).gather(1, after)
    powers = torch.pow(torch.as_tensor(decay, dtype=delta.dtype, device=delta.device),
                       torch.arange(W + 1, dtype=delta.dtype, device=delta.device))
    distance = after.sub_(torch.arange(W, device=delta.device))  # r + 1 - j, in 1..W
    flow = powers.expand(B, W + 1).gather(1, distance).mul_(S_next)
    return S.sub_(flow)


def _segment_ends(restart: Tensor) -> Tensor:
    """[B, W] bool -> [B, W] long: the first position at or after j where `restart` is True,
    W - 1 if there is none. One float cumsum, one scatter, one gather."""
    B, W = restart.shape
    r = restart.to(torch.float32 if W < 2 ** 24 else torch.float64)
    before = (r.cumsum(1) - r).to(torch.long)           # restarts strictly before j
    idx = torch.arange(W, device=restart.device).expand(B, W)
    table = torch.full((B, W + 1), W - 1, dtype=torch.long, device=restart.device)
    table.scatter_(1, torch.where(restart, before, W), idx)  # k-th restart's position
    return table[:, :W].gather(1, before)


def _blocked_scan(delta: Tensor, decay: float) -> Tensor:
    """The unrestarted suffix sum of `_discounted_suffix_sum` ([B, W], W >= 1)."""
    B, W = delta.shape
    C = min(_SCAN_CHUNK, W)
    n = -(-W // C)
    d = delta if n * C == W else torch.nn.functional.pad(delta, (0, n * C - W))
    MT, exit_ = _transfer(C, float(decay), delta.dtype, delta.device)
    local = (d.reshape(B * n, C) @ MT).view(B, n, C)         # suffix sums within each chunk
    if n > 1:
        # A at each chunk's first position: the same recursion over the chunk heads, decay^C
        # apart; then each chunk receives decay^(C - i) times the next chunk's head
        starts = _blocked_scan(local[:, :, 0].contiguous(), decay ** C)
        local[:, :-1].addcmul_(starts[:, 1:, None], exit_)
    return local.view(B, n * C)[:, :W]


@functools.lru_cache(maxsize=32)
def _transfer(C: int, decay: float, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """The blocked scan's constants for one chunk size and decay (read-only): the transposed
    transfer matrix `M[i, k] = decay^(k - i)` (k >= i, else 0) and `decay^(C - i)`, [C]."""
    i = torch.arange(C, device=device, dtype=dtype)
    gap = i[None, :] - i[:, None]                             # k - i
    base = torch.as_tensor(decay, dtype=dtype, device=device)
    M = torch.where(gap >= 0, torch.pow(base, gap.clamp(min=0)), torch.zeros((), dtype=dtype))
    return M.T.contiguous(), torch.pow(base, C - i)


def _group_stats(rewards: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-episode (group size, group mean, group sample std with n - 1, whether the group has
    a non-constant reward), each [B]."""
    _, inv = torch.unique(group_index, return_inverse=True)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    counts = torch.zeros(n_groups, dtype=rewards.dtype, device=rewards.device)
    counts.scatter_add_(0, inv, torch.ones_like(rewards))
    sums = torch.zeros_like(counts).scatter_add_(0, inv, rewards)
    mean = sums / counts
    sq = torch.zeros_like(counts).scatter_add_(0, inv, (rewards - mean[inv]) ** 2)
    std = torch.sqrt(sq / (counts - 1).clamp(min=1))
    gmax = torch.full_like(counts, -torch.inf).scatter_reduce_(0, inv, rewards, reduce="amax")
    gmin = torch.full_like(counts, torch.inf).scatter_reduce_(0, inv, rewards, reduce="amin")
    informative = (counts > 1) & (gmax > gmin)
    return counts[inv], mean[inv], std[inv], informative[inv]


# ----------------------------------------------------------------------------- outcome


def grpo_episode_advantages(rewards: Tensor, group_index: Tensor, std: bool = True,
                            eps: float = 1e-6) -> Tensor:
    """[B] GRPO advantage of every episode within its group (`credit.grpo_advantages` per group).

    `std=False` is Dr. GRPO (centre only). Groups of one or of all-equal rewards get exactly 0.
    """
    _, mean, sd, informative = _group_stats(rewards, group_index)
    adv = rewards - mean
    if std:
        adv = adv / (sd + eps)
    return torch.where(informative, adv, torch.zeros_like(adv))


def grpo_token_advantages(rewards: Tensor, group_index: Tensor, response_mask: Tensor,
                          std: bool = True, eps: float = 1e-6) -> Tensor:
    """[B, L] GRPO advantage broadcast to every policy token of its episode (docs/methods.md)."""
    adv = grpo_episode_advantages(rewards, group_index, std=std, eps=eps)
    return adv[:, None] * response_mask


def rloo_token_advantages(rewards: Tensor, group_index: Tensor, response_mask: Tensor) -> Tensor:
    """[B, L] RLOO advantage `R_i - mean_{j != i} R_j` on every policy token.

    Groups of one or of all-equal rewards get exactly 0.
    """
    size, mean, _, informative = _group_stats(rewards, group_index)
    loo_mean = (size * mean - rewards) / (size - 1).clamp(min=1)
    adv = torch.where(informative, rewards - loo_mean, torch.zeros_like(rewards))
    return adv[:, None] * response_mask


# ----------------------------------------------------------------------------- PPO / GAE


def gae_token_advantages(rewards: Tensor, values: Tensor, response_mask: Tensor, gamma: float = 1.0,
                         lam: float = 0.95) -> tuple[Tensor, Tensor]:
    """Token-level GAE over the policy tokens of each episode (PPO, docs/methods.md).

    rewards: [B] terminal rewards, placed on the last policy token; values: [B, L] critic values.
    Environment and padding tokens are skipped: the next value of the last policy token of a turn
    is the value at the first policy token of the next turn, and 0 after the last policy token.
    Equals `credit.gae` on each row's policy-token subsequence.
    Returns (advantages [B, L], returns [B, L] = advantages + values), 0 outside the mask.
    """
    packed = _Packed(response_mask)
    v = packed.pack(values)
    delta = packed.add_at_last(_shift_left(v).mul_(gamma).sub_(v), rewards)  # empty slots: 0
    adv = packed.unpack(_discounted_suffix_sum(delta, gamma * lam))
    # returns = adv + values on policy tokens: one fused pass instead of a second unpack
    return adv, torch.addcmul(adv, values.to(adv.dtype), packed.keep.to(adv.dtype))


# ----------------------------------------------------------------------------- MPO


def mpo_token_advantages(values: Tensor, rewards: Tensor, turn_index: Tensor,
                         response_mask: Tensor, lam: float = 0.80, lam_intra: float = 0.95,
                         beta: float = 1.0) -> Tensor:
    """[B, L] MPO multi-scale advantage (docs/methods.md), before batch normalisation.

    values: [B, L] critic values; rewards: [B]; gamma = 1. Equals `credit.mpo_advantages` on each
    row: turn-level GAE with `lam` on the values at each turn's first policy token, plus
    `beta` x (the centred intra-turn trace with `lam_intra`, which restarts at every turn).
    Follow with `masked_whiten(adv, response_mask)` to normalise over the batch's valid tokens.
    """
    packed = _Packed(response_mask, turn_index)
    if packed.max_count == 0:
        return torch.zeros_like(values)
    B, W = values.shape[0], packed.width
    dtype, device = values.dtype, values.device
    v = packed.pack(values)
    # turn of each packed token; turns are numbered in order of position, so a row's slots hold
    # non-decreasing turns (each turn a run of consecutive slots), its last slot the largest
    slot = packed.pack(turn_index, fill=W)
    slot[:, 0] = -1                                   # the dump column sorts first
    n_turns = int(slot.gather(1, packed.last[:, None]).max()) + 1
    t = torch.arange(n_turns, device=device)
    after = torch.searchsorted(slot, t.expand(B, n_turns).contiguous(), right=True)
    # after[b, t]: the slot after turn t's last one (the next turn's first, or an empty slot)
    counts = after - torch.cat([after.new_ones(B, 1), after[:, :-1]], dim=1)
    T = (counts > 0).sum(1, keepdim=True)             # turns of each row
    slot.clamp_(max=n_turns)[:, 0] = n_turns          # empty slots and the dump -> column n_turns

    # intra-turn trace: token TD residuals (gamma = 1), accumulated with lam_intra within a turn:
    # the unrestarted suffix sum S minus what flows in from the next turn's first slot,
    # lam_intra^(after - j) S[after]
    delta = packed.add_at_last(_shift_left(v).sub_(v), rewards)  # empty slots: 0
    S = _blocked_scan(delta, lam_intra)
    dump = torch.full((B, 1), W, dtype=torch.long, device=device)
    distance = torch.cat([after, dump], dim=1).gather(1, slot).sub_(torch.arange(W, device=device))
    powers = torch.pow(torch.as_tensor(float(lam_intra), dtype=dtype, device=device),
                       torch.arange(W + 1, dtype=dtype, device=device))
    inflow = torch.cat([S.gather(1, after), S.new_zeros(B, 1)], dim=1).gather(1, slot)
    intra = S.sub_(powers.expand(B, W + 1).gather(1, distance).mul_(inflow))  # distance >= 1

    # turn-level GAE on the value at each turn's first policy token
    first = v.gather(1, after - counts)
    next_first = torch.where(t + 1 < T, _shift_left(first), 0.0)
    delta_turn = torch.where(t < T, rewards[:, None].to(dtype) * (t == T - 1) + next_first - first,
                             0.0)
    turn_adv = _discounted_suffix_sum(delta_turn, lam)

    # centre the intra trace within each turn (least-squares projection keeps the turn mean):
    # A = beta * intra + (turn_adv - beta * mean intra), one gather of the per-turn part
    sums = v.new_zeros(B, n_turns + 1).scatter_add_(1, slot, intra)[:, :n_turns]
    per_turn = turn_adv - beta * (sums / counts.clamp(min=1))
    per_turn = torch.cat([per_turn, per_turn.new_zeros(B, 1)], dim=1).gather(1, slot)
    return packed.unpack(intra.mul_(beta).add_(per_turn))


# ----------------------------------------------------------------------------- TRACE


def trace_token_advantages(mean_logprobs: Tensor, num_turns: Tensor, outcome_adv: Tensor,
                           turn_index: Tensor, response_mask: Tensor,
                           final_turn_is_answer: bool = True, eps: float = 0.1, K: int = 3,
                           gamma_td: float = 0.8, lambda_term: float = 2.0,
                           alpha_out: float = 1.0, alpha_turn: float = 0.2) -> Tensor:
    """[B, L] TRACE token advantages `alpha_out A^out + alpha_turn r_{turn(token)}` (docs/methods.md).

    mean_logprobs: [B, M] right-padded; row b uses entries 0..T_b (states S_0..S_{T_b}), the rest
        is ignored. num_turns: [B] long, the number of turns of each episode.
    outcome_adv: [B] GRPO outcome advantage (e.g. `grpo_episode_advantages`).
    T_b, the number of tool-call turns, is `num_turns - 1` when the last turn is the final answer
    (`final_turn_is_answer=True`: that turn's tokens get the outcome term only) and `num_turns`
    otherwise (every turn gets turn credit). Requires `T_b + 1 <= M`.
    The turn rewards r_k equal `credit.trace_turn_rewards` on each row.
    """
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    B, M = mean_logprobs.shape
    T = num_turns - 1 if final_turn_is_answer else num_turns
    if bool((T + 1 > M).any()) or bool((T < 0).any()):
        raise ValueError("mean_logprobs needs T_b + 1 entries per row (T_b >= 0)")
    dtype, device = mean_logprobs.dtype, mean_logprobs.device
    k = torch.arange(M, device=device).expand(B, M)
    state_valid = k <= T[:, None]
    log_d = torch.log(torch.where(state_valid, -mean_logprobs + eps, torch.ones((), dtype=dtype,
                                                                                  device=device)))
    delta = log_d[:, :-1] - log_d[:, 1:]  # [B, M-1], valid for k < T_b
    kk = k[:, :-1]
    turn_valid = kk < T[:, None]
    delta = torch.where(turn_valid, delta, torch.zeros((), dtype=dtype, device=device))

    num = torch.zeros_like(delta)
    den = torch.zeros_like(delta)
    padded = torch.cat([delta, delta.new_zeros(B, K)], dim=1)
    for j in range(K):
        in_window = ((kk + j) < T[:, None]).to(dtype)
        num = num + gamma_td ** j * padded[:, j:j + M - 1] * in_window
        den = den + gamma_td ** j * in_window
    c = num / den.clamp(min=1e-12)
    reaches_end = (kk + K - 1 >= T[:, None] - 1) & turn_valid
    steps_to_end = (T[:, None] - kk).clamp(min=0).to(dtype)
    term = lambda_term * torch.pow(torch.as_tensor(gamma_td, dtype=dtype), steps_to_end) \
        * outcome_adv[:, None]
    r = torch.where(turn_valid, c + term * reaches_end, torch.zeros((), dtype=dtype, device=device))

    # per-turn advantage, then one gather onto the tokens; turns without turn credit (the answer
    # turn, turns past T_b) get the outcome term only, non-policy tokens the dump column's 0
    top = int(turn_index.max()) if turn_index.numel() else -1
    width = max(M - 1, top + 1)
    outcome = alpha_out * outcome_adv[:, None].to(dtype)
    per_turn = torch.cat([outcome + alpha_turn * r, outcome.expand(B, width - (M - 1)),
                          r.new_zeros(B, 1)], dim=1)
    idx = torch.where((response_mask > 0) & (turn_index >= 0), turn_index, width)
    return per_turn.gather(1, idx)

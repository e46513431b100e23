"""From episodes to the training batch, and micro-batches by token budget.

All per-token tensors are [B, L] aligned with `input_ids`: position t holds what concerns token
t (its log-prob given the prefix before it, the critic's value of the state before it).
Position 0 is always a prompt token, so nothing is lost by the shift.

What an estimator reads beyond the tokens, rewards and values is the batch's `payload`
(`types.Payload`): the controller's (`RolloutResult.payload`, handed to `collate`) and what a
preparer adds (`train.prepare`). The batch carries it whole: `select` and `trim` keep it, `to`
moves the tensors its objects hold.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from ..context.windows import window_index
from ..models.critic import critic_hidden, is_separate
from ..models.sequences import (can_pack, hidden_states, logprobs_from_hidden, pack_rows,
                                packed_hidden_states, pad_episodes, pad_field, tree_hidden_states,
                                tree_mask, tree_next_logprobs, tree_pack_rows, tree_packable,
                                unpack_next)
from ..types import Episode, Payload


@dataclass
class Batch:
    input_ids: torch.Tensor       # [B, L] long, right-padded
    attention_mask: torch.Tensor  # [B, L] long, 1 on real tokens
    response_mask: torch.Tensor   # [B, L] float, 1 on policy tokens (the only ones trained on)
    engine_logprobs: torch.Tensor  # [B, L] float, the engine's log-prob of each policy token
    turn_index: torch.Tensor      # [B, L] long, turn of each policy token, -1 elsewhere
    segment_index: torch.Tensor   # [B, L] long, segment of each policy token, -1 elsewhere
    rewards: torch.Tensor         # [B] float, terminal reward R
    group_index: torch.Tensor     # [B] long, GRPO group (task) of each episode
    old_logprobs: torch.Tensor | None = None  # [B, L] trainer log-probs before the update
    ref_logprobs: torch.Tensor | None = None  # [B, L] frozen reference's log-probs
    old_values: torch.Tensor | None = None    # [B, L] critic before the update
    advantages: torch.Tensor | None = None    # [B, L] frozen for the update
    returns: torch.Tensor | None = None       # [B, L] critic targets (masked by value_mask)
    value_mask: torch.Tensor | None = None    # [B, L] where the critic is regressed
    # what the estimator reads beside the tokens, typed by the part that made it: the rollout's
    # (`RolloutResult.payload`) and a preparer's (module docstring)
    payload: Payload = field(default_factory=Payload)
    window_index: torch.Tensor | None = None  # [B, L] long context window of each token (-1 on
                                  # the prompt), None when no episode's context was reset

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> "Batch":
        """The same batch with every tensor (the payload's too) on `device` (no copy where
        already)."""
        move = lambda v: v.to(device) if isinstance(v, (torch.Tensor, Payload)) else v
        return Batch(**{f.name: move(getattr(self, f.name)) for f in fields(self)})

    def select(self, rows: list[int]) -> "Batch":
        idx = torch.tensor(rows, dtype=torch.long)
        kw = {}
        for f in fields(self):
            v = getattr(self, f.name)
            kw[f.name] = v[idx] if isinstance(v, torch.Tensor) else v
        return Batch(**kw)


def collate(episodes: list[Episode], pad_id: int, payload: Payload | None = None) -> Batch:
    """The padded batch of `episodes`, carrying the rollout's `payload` for the estimator."""
    ids, mask, attn = pad_episodes(episodes, pad_id)
    windows = None
    if any(e.window_starts for e in episodes):
        windows = torch.zeros_like(ids)
        for i, e in enumerate(episodes):
            w = window_index(e)
            if w:
                windows[i, :len(w)] = torch.tensor(w, dtype=torch.long)
    return Batch(
        input_ids=ids, attention_mask=attn, response_mask=mask,
        engine_logprobs=pad_field(episodes, "logprobs", 0.0, torch.float),
        turn_index=pad_field(episodes, "turn_index", -1, torch.long),
        segment_index=pad_field(episodes, "segment_index", -1, torch.long),
        rewards=torch.tensor([e.reward for e in episodes], dtype=torch.float),
        group_index=torch.tensor([e.group for e in episodes], dtype=torch.long),
        window_index=windows, payload=Payload() if payload is None else payload,
    )


def microbatches(batch: Batch, max_tokens: int, packed: bool | str = False) -> list[list[int]]:
    """Pack rows into micro-batches whose padded size (rows x longest) stays within `max_tokens`,
    or with `packed` whose real tokens (the sum of the rows' lengths: a packed forward, see
    `forward`) do, or with `packed="tree"` whose distinct tokens (a prefix shared by several
    rows counted once: a tree-packed forward) do.

    Rows are packed longest first, so episodes of similar length share a micro-batch and little
    padding is computed; a row longer than the budget gets a micro-batch of its own. For trees,
    rows go group by group (a group's rows share their prefixes). Gradients accumulated over the
    micro-batches, each weighted by its share of tokens (or sequences), equal one pass over the
    whole batch.
    """
    lengths = batch.attention_mask.sum(1).tolist()
    if packed == "tree":
        return _tree_microbatches(batch, lengths, max_tokens)
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties keep row order
    groups: list[list[int]] = []
    cur: list[int] = []
    used = 0
    for i in order:
        if packed:
            size = used + lengths[i]
        else:                                         # cur[0] is its longest row
            size = lengths[cur[0]] * (len(cur) + 1) if cur else 0
        if cur and size > max_tokens:
            groups.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += lengths[i]
    if cur:
        groups.append(cur)
    return groups


def _tree_microbatches(batch: Batch, lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Micro-batches by distinct tokens: a row adds its tokens after the longest prefix it
    shares with a row already in the micro-batch."""
    ids, attn = batch.input_ids, batch.attention_mask.bool()
    order = sorted(range(len(lengths)),
                   key=lambda i: (int(batch.group_index[i]), -lengths[i]))
    groups: list[list[int]] = []
    cur: list[int] = []
    used = 0
    for i in order:
        n = int(lengths[i])
        share = 0
        if cur:
            same = (ids[cur, :n] == ids[i, :n]) & attn[cur, :n]
            share = int(same.long().cumprod(1).sum(1).max())
        if cur and used + n - share > max_tokens:
            groups.append(cur)
            cur, used, share = [], 0, 0
        cur.append(i)
        used += n - share
    if cur:
        groups.append(cur)
    return groups


def trim(batch: Batch) -> Batch:
    """Drop the all-padding tail columns of a micro-batch."""
    L = int(batch.attention_mask.sum(1).max())
    kw = {}
    for f in fields(batch):
        v = getattr(batch, f.name)
        kw[f.name] = v[:, :L] if isinstance(v, torch.Tensor) and v.dim() == 2 else v
    return Batch(**kw)


def forward(model, critic, mb: Batch, temperature: float, chunk: int = 512,
            pack: bool | str = False, logprobs: bool = True, entropy: bool = False):
    """-> (logprobs [b, L] or None, values [b, L] or None) aligned with input_ids (position 0 = 0).

    `chunk`: tokens per log-prob chunk (see `logprobs_from_hidden`; 0 = whole sequence).
    `pack`: run the micro-batch packed into one row without padding (`models.sequences`), when
    the models allow it (`can_pack`) and no episode's context was reset; the outputs are the
    padded forward's (0 on padding) in the same [b, L] layout. `pack="tree"`: one row holding
    each distinct prefix once, under a tree attention mask (`tree_pack_rows`), when the models
    allow it (`tree_packable`) and no context was reset; else the packed or padded pass.
    `logprobs=False`: values only (no LM head; with a separate critic, no policy forward).
    Log-probs are computed for policy tokens only (`mb.response_mask`, all a loss, a KL term or
    a scoring pass reads) and are 0 elsewhere: the LM head runs on about a tenth of an agent
    episode's tokens.
    `entropy` (with `logprobs`): -> (logprobs, values, entropies [b, L]): the policy's entropy
    at each policy token's position, from the same logits (`models.sequences`), 0 elsewhere.
    The inputs go to the model's device; the outputs stay there."""
    dev = next(model.parameters()).device
    ids = mb.input_ids.to(dev)
    policy = mb.response_mask.to(dev) > 0
    window = mb.window_index.to(dev) if mb.window_index is not None else None
    if pack == "tree" and _tree_packable(model, critic, window):
        return _tree_forward(model, critic, mb, dev, policy, temperature, chunk, logprobs,
                             entropy)
    if pack and _packable(model, critic, window):
        return _packed_forward(model, critic, ids, mb.attention_mask.to(dev), policy, temperature,
                               chunk, logprobs, entropy)
    need_h = logprobs or (critic is not None and not is_separate(critic))
    h = hidden_states(model, ids, mb.attention_mask.to(dev), window) if need_h else None
    lp = ent = None
    if logprobs:
        lp = logprobs_from_hidden(model, h, ids, temperature, chunk, where=policy[:, 1:],
                                  entropy=entropy)
        lp, ent = lp if entropy else (lp, None)
        lp = torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)
        ent = torch.cat([torch.zeros_like(ent[:, :1]), ent], dim=1) if entropy else None
    values = None
    if critic is not None:
        hv = critic_hidden(critic, h, ids, mb.attention_mask.to(dev), window)
        v = critic(hv[:, :-1].float()).squeeze(-1)
        values = torch.cat([torch.zeros_like(v[:, :1]), v], dim=1)
    return (lp, values, ent) if entropy else (lp, values)


def _packable(model, critic, window) -> bool:
    if window is not None and bool((window > 0).any()):
        return False
    return can_pack(model) and (not is_separate(critic) or can_pack(critic.model))


def _packed_forward(model, critic, ids, attn, policy, temperature: float, chunk: int,
                    logprobs: bool, entropy: bool = False):
    flat, pos, bounds = pack_rows(ids, attn)
    separate = is_separate(critic)
    need_h = logprobs or (critic is not None and not separate)
    h = packed_hidden_states(model, flat, pos, bounds) if need_h else None     # [1, T, H]
    lp = values = ent = None
    if logprobs:
        # a policy token never starts an episode, so no needed entry crosses into the next row
        where = policy[attn.bool()][None, 1:]
        out = logprobs_from_hidden(model, h, flat, temperature, chunk, where, entropy)
        lp, ent = out if entropy else (out, None)
        lp = unpack_next(lp[0], attn, bounds)
        ent = unpack_next(ent[0], attn, bounds) if entropy else None
    if critic is not None:
        hv = packed_hidden_states(critic.model, flat, pos, bounds) if separate else h
        values = unpack_next(critic(hv[0, :-1].float()).squeeze(-1), attn, bounds)
    return (lp, values, ent) if entropy else (lp, values)


def _tree_packable(model, critic, window) -> bool:
    if window is not None and bool((window > 0).any()):
        return False
    return tree_packable(model) and (not is_separate(critic) or tree_packable(critic.model))


def _tree_forward(model, critic, mb: Batch, dev, policy, temperature: float, chunk: int,
                  logprobs: bool, entropy: bool = False):
    """`forward` over the micro-batch's prefix tree: each distinct token is forwarded once;
    a row's outputs are gathered from its tokens' (autograd sums their gradients back)."""
    attn = mb.attention_mask
    flat, pos, parent, index = tree_pack_rows(mb.input_ids, attn)
    mask = tree_mask(index, attn.sum(1).tolist()).to(dev)
    flat, pos, parent = flat.to(dev), pos.to(dev), parent.to(dev)
    index = index.to(dev)
    real = index >= 0
    real[:, 0] = False                      # position 0 has no next-token output
    at = index.clamp(min=0)
    separate = is_separate(critic)
    need_h = logprobs or (critic is not None and not separate)
    h = tree_hidden_states(model, flat, pos, mask) if need_h else None       # [T, H]
    lp = values = ent = None
    if logprobs:
        where = torch.zeros(flat.shape[0], dtype=torch.bool, device=dev)
        where[index[policy & real]] = True
        out = tree_next_logprobs(model, h, flat, parent, temperature, chunk, where, entropy)
        lp_flat, ent_flat = out if entropy else (out, None)
        lp = torch.where(real & policy, lp_flat[at], lp_flat.new_zeros(()))
        if entropy:
            ent = torch.where(real & policy, ent_flat[at], ent_flat.new_zeros(()))
    if critic is not None:
        hv = tree_hidden_states(critic.model, flat, pos, mask) if separate else h
        v_flat = critic(hv.index_select(0, parent.clamp(min=0)).float()).squeeze(-1)
        values = torch.where(real, v_flat[at], v_flat.new_zeros(()))
    return (lp, values, ent) if entropy else (lp, values)

"""Batched forward passes over stored episodes: padding, per-token log-probs, values.

Log-probs are computed from the backbone's hidden states in sequence chunks, recomputed in
backward, so the full `tokens x vocabulary` logits never exist at once, not even as tensors
saved for backward (the memory-lean step).
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from ..types import Episode


def pad_episodes(episodes: list[Episode], pad_id: int):
    """-> ids [B, L] (right-padded), response_mask [B, L] float, attention_mask [B, L] long."""
    L = max(len(e.token_ids) for e in episodes)
    B = len(episodes)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    mask = torch.zeros(B, L)
    attn = torch.zeros(B, L, dtype=torch.long)
    for i, e in enumerate(episodes):
        n = len(e.token_ids)
        ids[i, :n] = torch.tensor(e.token_ids)
        mask[i, :n] = torch.tensor(e.response_mask, dtype=torch.float)
        attn[i, :n] = 1
    return ids, mask, attn


def pad_field(episodes: list[Episode], name: str, fill, dtype) -> torch.Tensor:
    """Right-pad a per-token list field (`logprobs`, `turn_index`, ...) to [B, L]."""
    L = max(len(e.token_ids) for e in episodes)
    out = torch.full((len(episodes), L), fill, dtype=dtype)
    for i, e in enumerate(episodes):
        v = getattr(e, name)
        out[i, :len(v)] = torch.tensor(v, dtype=dtype)
    return out


def backbone(model):
    """The decoder stack without the LM head (works for any *ForCausalLM)."""
    if hasattr(model, "get_decoder"):
        dec = model.get_decoder()
        if dec is not None:
            return dec
    return model.model


def window_attention(window: torch.Tensor, attn: torch.Tensor, dtype: torch.dtype | None = None):
    """Attention mask and position ids of stored episodes with context windows (`context/`).

    window: [B, L] long, -1 on each row's shared prefix (the prompt), else the token's window;
    attn: [B, L] padding mask. Returns (mask [B, 1, L, L], position_ids [B, L]): token q sees
    token k <= q iff k is in the prefix or in q's window (padding queries see every earlier
    token, so no softmax row is empty); a window's positions continue from the prefix length,
    as the engine's were after the context reset. `dtype` None gives a boolean mask (True =
    attend); a float dtype gives an additive mask (0 / dtype min) for eager attention.
    """
    B, L = window.shape
    causal = torch.ones(L, L, dtype=torch.bool, device=window.device).tril()
    same = window[:, :, None] == window[:, None, :]
    shared = (window < 0)[:, None, :]
    pad_q = (attn == 0)[:, :, None]
    mask = (causal & (same | shared | pad_q))[:, None]
    first = torch.ones_like(window, dtype=torch.bool)
    first[:, 1:] = window[:, 1:] != window[:, :-1]           # each run of one window starts here
    idx = torch.arange(L, device=window.device).expand(B, L)
    run_start = torch.where(first, idx, torch.zeros_like(idx)).cummax(1).values
    prefix = (window < 0).sum(1, keepdim=True)
    pos = torch.where(window < 0, idx, prefix + idx - run_start)
    if dtype is not None and dtype.is_floating_point:
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
            ~mask, torch.finfo(dtype).min)
    return mask, pos


def hidden_states(model, ids: torch.Tensor, attn: torch.Tensor,
                  window: torch.Tensor | None = None) -> torch.Tensor:
    """Last hidden states [B, L, H] of a RIGHT-padded batch.

    With right padding, causal attention already keeps every real token away from the padding
    that follows it, so no padding mask is passed: outputs at real positions are exact and SDPA
    can take its fused causal path (about 2x faster on CPU than with a mask). Hidden states at
    padding positions are garbage and must be masked by the caller.

    `window` ([B, L], see `window_attention`) is given for episodes whose context was reset
    (context operators): if any row has a token beyond window 0, the forward gets the window
    mask and position ids (a dense [B, 1, L, L] mask, for sdpa, sink_sdpa and eager attention),
    so every token is scored in the context the engine generated it in.
    """
    if bool((attn[:, 1:] > attn[:, :-1]).any()):
        raise ValueError("hidden_states expects a right-padded batch")
    if window is None or not bool((window > 0).any()):
        out = backbone(model)(input_ids=ids, use_cache=False)
        return out.last_hidden_state
    from .attention import HF_NAMES

    impl = getattr(model.config, "_attn_implementation", "sdpa")
    if impl not in ("sdpa", "eager", HF_NAMES["sink_sdpa"]):
        raise ValueError(f"context windows need sdpa, sink_sdpa or eager attention, not '{impl}'")
    dtype = next(model.parameters()).dtype if impl == "eager" else None
    mask, pos = window_attention(window.to(ids.device), attn.to(ids.device), dtype)
    out = backbone(model)(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
    return out.last_hidden_state


def _piece_logprobs(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float):
    logits = head(hidden).float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)


def logprobs_from_hidden(model, hidden: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0,
                         chunk: int = 512) -> torch.Tensor:
    """log p(ids[:, t+1] | prefix) for t < L-1 -> [B, L-1].

    With `chunk` > 0 the logits exist for `chunk` positions at a time, and under autograd each
    chunk is recomputed in backward (checkpointed), so only the hidden states are kept: the
    extra memory is B x chunk x vocab instead of B x L x vocab, for one more LM-head matmul.
    `chunk=0` computes the whole sequence at once (the plain reference).
    """
    head = model.get_output_embeddings()
    h, targets = hidden[:, :-1], ids[:, 1:]
    if not chunk or targets.shape[1] == 0:
        return _piece_logprobs(head, h, targets, temperature)
    recompute = torch.is_grad_enabled()
    parts = []
    for s in range(0, targets.shape[1], chunk):
        args = (head, h[:, s:s + chunk], targets[:, s:s + chunk], temperature)
        parts.append(checkpoint(_piece_logprobs, *args, use_reentrant=False) if recompute
                     else _piece_logprobs(*args))
    return torch.cat(parts, dim=1)


def token_logprobs(model, ids, attn, temperature: float = 1.0, chunk: int = 512) -> torch.Tensor:
    """[B, L-1] next-token log-probs of a right-padded batch."""
    return logprobs_from_hidden(model, hidden_states(model, ids, attn), ids, temperature, chunk)

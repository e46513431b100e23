"""Batched forward passes over stored episodes: padding, packing, per-token log-probs, values.

Log-probs are computed from the backbone's hidden states in chunks of tokens, recomputed in
backward, so the full `tokens x vocabulary` logits never exist at once, not even as tensors
saved for backward (the memory-lean step).

Packing (`pack_rows`, `packed_hidden_states`): the episodes of a right-padded micro-batch are
concatenated into one row without padding; position ids restart at every episode and attention
runs episode by episode (the model's own attention function on each episode's slice, causal),
so no token sees another episode and no `tokens x tokens` mask is built.
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
    # deferred: importing it imports transformers (it registers the sink-aware attentions)
    from .attention import HF_NAMES

    impl = getattr(model.config, "_attn_implementation", "sdpa")
    if impl not in ("sdpa", "eager", HF_NAMES["sink_sdpa"]):
        raise ValueError(f"context windows need sdpa, sink_sdpa or eager attention, not '{impl}'")
    dtype = next(model.parameters()).dtype if impl == "eager" else None
    mask, pos = window_attention(window.to(ids.device), attn.to(ids.device), dtype)
    out = backbone(model)(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
    return out.last_hidden_state


# ------------------------------------------------------------------------------ packing
PACKED_ATTENTION = "agentrl_packed"
PACKABLE_ATTENTION = ("sdpa", "sink_fused")   # causal on their own when given no mask


def pack_rows(ids: torch.Tensor, attn: torch.Tensor):
    """A right-padded batch as one row: (ids [1, T], position ids [1, T], bounds), T the real
    tokens, position ids restarting at 0 for every row, bounds[i] = (start, end) of row i."""
    keep = attn.bool()
    flat = ids[keep][None]
    pos = (attn.long().cumsum(1) - 1)[keep][None]
    bounds, start = [], 0
    for n in attn.sum(1).tolist():
        bounds.append((start, start + int(n)))
        start += int(n)
    return flat, pos, bounds


def unpack_next(x: torch.Tensor, attn: torch.Tensor, bounds) -> torch.Tensor:
    """Per-position outputs of a packed row that concern the NEXT token ([T - 1] or [T - 1, ...]:
    entry t is about token t + 1, as `logprobs_from_hidden` and values give them) back to the
    padded layout [B, L(, ...)] (entry [i, j] about token j of row i; 0 at j = 0 and on padding).
    Entries that cross from one row into the next are dropped."""
    keep = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
    ends = torch.tensor([e - 1 for _, e in bounds[:-1]], dtype=torch.long, device=x.device)
    keep[ends] = False
    where = attn.bool().clone()
    where[:, 0] = False
    out = x.new_zeros(*attn.shape, *x.shape[1:])
    return out.masked_scatter(where.view(*where.shape, *([1] * (x.dim() - 1))).expand_as(out),
                              x[keep])


def _packed_attention(module, query, key, value, attention_mask, packed_bounds=(),
                      packed_base=None, **kwargs):
    """The model's own attention (`packed_base`) on each packed episode's slice, with no mask
    (causal); outputs [1, T, H, D] as transformers' attention functions give them."""
    parts = [packed_base(module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], None,
                         **kwargs)[0] for s, e in packed_bounds]
    return torch.cat(parts, dim=1), None


def _no_mask(*args, **kwargs):
    return None


_registered = []


def _register_packed() -> None:
    if not _registered:
        # deferred: transformers takes seconds to import
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(PACKED_ATTENTION, _packed_attention)
        AttentionMaskInterface.register(PACKED_ATTENTION, _no_mask)
        _registered.append(True)


def can_pack(model) -> bool:
    """Whether `packed_hidden_states` runs for this model: attention that is causal without a
    mask, and no activation checkpointing (its recomputation in backward would look the
    attention function up again, after the packed one is gone)."""
    impl = getattr(backbone(model).config, "_attn_implementation", None)
    name = ("is_activation_checkpointing" if hasattr(model, "is_activation_checkpointing")
            else "is_gradient_checkpointing")    # the attribute's name before transformers 5.2x
    checkpointed = bool(getattr(model, name, False))
    return impl in PACKABLE_ATTENTION and not checkpointed


def packed_hidden_states(model, flat: torch.Tensor, pos: torch.Tensor, bounds) -> torch.Tensor:
    """Last hidden states [1, T, H] of a packed row (`pack_rows`): each episode attends only
    to itself, at its own positions, exactly as in a padded batch."""
    # deferred: transformers takes seconds to import
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    _register_packed()
    dec = backbone(model)
    cfg = dec.config
    name = cfg._attn_implementation
    if name not in PACKABLE_ATTENTION:
        raise ValueError(f"packed forward passes need {' or '.join(PACKABLE_ATTENTION)} "
                         f"attention, not '{name}'")
    base = ALL_ATTENTION_FUNCTIONS[name]
    cfg._attn_implementation = PACKED_ATTENTION
    try:
        out = dec(input_ids=flat, position_ids=pos, use_cache=False, packed_bounds=bounds,
                  packed_base=base)
    finally:
        cfg._attn_implementation = name
    return out.last_hidden_state


def _piece_logprobs(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float):
    logits = head(hidden).float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)


def _piece_logprobs_entropy(head, hidden: torch.Tensor, targets: torch.Tensor,
                            temperature: float):
    """`_piece_logprobs` and the entropy of each position's (tempered) distribution."""
    logp = torch.log_softmax(head(hidden).float() / temperature, dim=-1)
    return logp.gather(-1, targets[..., None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


def _head_logits(h, weight, bias, temperature: float) -> torch.Tensor:
    logits = torch.nn.functional.linear(h, weight, bias).float()
    return logits.div_(temperature) if temperature != 1.0 else logits


class _HeadLogprobs(torch.autograd.Function):
    """log softmax(h W^T + b) / T at `targets`, over [N, H] hidden states in chunks of `chunk`
    tokens. Forward keeps one [chunk, V] logits block at a time and saves only the log-sum-exp
    per token; backward recomputes each block and forms the logits' gradient in place,
    `(onehot(target) - softmax) * g / T`: one [chunk, V] tensor, where autograd through
    `log_softmax` + `gather` makes four (the division, the log-softmax output, the gather's
    zero-filled gradient, the log-softmax gradient).

    With `entropy`, a second output: each token's entropy H = lse - E_p[logits] (0-size
    otherwise), from the same logits blocks; its gradient, -p (log p + H) per logit, is formed
    in the same recomputed block, only when the entropy is trained on (an entropy bonus)."""

    @staticmethod
    def forward(ctx, h, weight, bias, targets, temperature: float, chunk: int,
                entropy: bool = False):
        ctx.set_materialize_grads(False)
        N = h.shape[0]
        out = torch.empty(N, dtype=torch.float32, device=h.device)
        lse = torch.empty(N, dtype=torch.float32, device=h.device)
        ent = torch.empty(N if entropy else 0, dtype=torch.float32, device=h.device)
        for s in range(0, N, chunk):
            logits = _head_logits(h[s:s + chunk], weight, bias, temperature)
            lse[s:s + chunk] = torch.logsumexp(logits, dim=-1)
            out[s:s + chunk] = logits.gather(-1, targets[s:s + chunk, None]).squeeze(-1)
            if entropy:
                p = (logits - lse[s:s + chunk, None]).exp_()
                ent[s:s + chunk] = lse[s:s + chunk] - p.mul_(logits).sum(-1)
        out.sub_(lse)
        # the weights are read again in backward from ctx, not saved as tensors: they are the
        # model's parameters (no copy to keep), and an optimiser step never runs in between
        ctx.save_for_backward(h, targets, lse, ent)
        ctx.weight, ctx.bias, ctx.temperature, ctx.chunk = weight, bias, temperature, chunk
        if not entropy:
            ctx.mark_non_differentiable(ent)
        return out, ent

    @staticmethod
    def backward(ctx, grad, grad_ent):
        h, targets, lse, ent = ctx.saved_tensors
        weight, bias, temperature, chunk = ctx.weight, ctx.bias, ctx.temperature, ctx.chunk
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        gh = torch.empty_like(h) if need_h else None
        gw = torch.zeros(weight.shape, dtype=torch.float32, device=h.device) if need_w else None
        gb = (torch.zeros(bias.shape, dtype=torch.float32, device=h.device)
              if need_b and bias is not None else None)
        grad = grad.float() if grad is not None else torch.zeros_like(lse)
        for s in range(0, h.shape[0], chunk):
            g = grad[s:s + chunk, None]
            d = _head_logits(h[s:s + chunk], weight, bias, temperature)
            if grad_ent is None:
                d.sub_(lse[s:s + chunk, None]).exp_().mul_(-g)         # -softmax * g
            else:
                d = _entropy_block_grad(d, lse[s:s + chunk, None], ent[s:s + chunk, None],
                                        g, grad_ent[s:s + chunk, None].float())
            d.scatter_add_(1, targets[s:s + chunk, None], g)           # + onehot * g
            if temperature != 1.0:
                d.div_(temperature)
            d = d.to(h.dtype)
            if need_h:
                gh[s:s + chunk] = d @ weight
            if need_w:
                gw.addmm_(d.t().float(), h[s:s + chunk].float())
            if gb is not None:
                gb += d.float().sum(0)
        return (gh, gw.to(weight.dtype) if gw is not None else None,
                gb.to(bias.dtype) if gb is not None else None, None, None, None, None)


def _entropy_block_grad(logits, lse, ent, g, ge):
    """The logits' gradient of a block, without the one-hot term: -p g from the log-probs and
    -p (log p + H) ge from the entropies (p, log p: the block's softmax, log-softmax)."""
    logp = logits.sub_(lse)
    p = logp.exp()
    return logp.add_(ent).mul_(p).mul_(-ge).addcmul_(p, g, value=-1.0)


def logprobs_from_hidden(model, hidden: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0,
                         chunk: int = 512, where: torch.Tensor | None = None,
                         entropy: bool = False):
    """log p(ids[:, t+1] | prefix) for t < L-1 -> [B, L-1].

    With `chunk` > 0 the logits exist for `chunk` tokens at a time (counted over all rows), and
    under autograd each chunk is recomputed in backward, so only the hidden states are kept: the
    extra memory is chunk x vocab instead of B x L x vocab, for one more LM-head matmul.
    `chunk=0` computes the whole sequence at once (the plain reference).
    `where` ([B, L-1] bool): only these entries are needed (the trainer's: targets that are
    policy tokens, a small share of an agent's episode); the LM head runs on their hidden states
    only and every other entry is 0.
    `entropy`: -> (log-probs, entropies [B, L-1]), the entropy of each position's next-token
    distribution at `temperature`, from the same logits (no second LM-head pass), differentiable.
    """
    head = model.get_output_embeddings()
    if not chunk or hidden.shape[1] < 2:
        piece = _piece_logprobs_entropy if entropy else _piece_logprobs
        out = piece(head, hidden[:, :-1], ids[:, 1:], temperature)
        return _masked(out, where)
    B, L, H = hidden.shape
    if isinstance(head, torch.nn.Linear):
        # every position of the [B, L] grid (the last one's target is a dummy): a view of the
        # hidden states, never a copy of them
        targets = torch.cat([ids[:, 1:], ids[:, :1]], dim=1).reshape(-1)
        flat = hidden.reshape(B * L, H)
        if where is not None:          # the needed positions' hidden states only
            idx = torch.nn.functional.pad(where, (0, 1)).reshape(-1).nonzero().squeeze(1)
            flat, targets = flat.index_select(0, idx), targets.index_select(0, idx)
        outs = _HeadLogprobs.apply(flat, head.weight, head.bias, targets, float(temperature),
                                   max(1, int(chunk)), entropy)
        grid = []
        for x in outs[:2 if entropy else 1]:
            if where is not None:
                x = torch.zeros(B * L, dtype=x.dtype, device=x.device).index_copy(0, idx, x)
            grid.append(x.view(B, L)[:, :-1])
        return tuple(grid) if entropy else grid[0]
    h, targets = hidden[:, :-1], ids[:, 1:]
    recompute = torch.is_grad_enabled()
    step = max(1, int(chunk) // B)         # positions per chunk: about `chunk` tokens
    piece = _piece_logprobs_entropy if entropy else _piece_logprobs
    parts = []
    for s in range(0, targets.shape[1], step):
        args = (head, h[:, s:s + step], targets[:, s:s + step], temperature)
        parts.append(checkpoint(piece, *args, use_reentrant=False) if recompute
                     else piece(*args))
    if entropy:
        return _masked((torch.cat([p[0] for p in parts], dim=1),
                        torch.cat([p[1] for p in parts], dim=1)), where)
    return _masked(torch.cat(parts, dim=1), where)


def _masked(out, where: torch.Tensor | None):
    """Log-probs (or a tuple of log-probs and entropies) with 0 outside `where`."""
    if where is None:
        return out
    if isinstance(out, tuple):
        return tuple(x.masked_fill(~where, 0.0) for x in out)
    return out.masked_fill(~where, 0.0)


def token_logprobs(model, ids, attn, temperature: float = 1.0, chunk: int = 512) -> torch.Tensor:
    """[B, L-1] next-token log-probs of a right-padded batch."""
    return logprobs_from_hidden(model, hidden_states(model, ids, attn), ids, temperature, chunk)


# ------------------------------------------------------------------------------ tree packing
TREE_ATTENTION = ("sdpa", "eager", "sink_fused")   # take a dense [1, 1, T, T] mask as given


def tree_pack_rows(ids: torch.Tensor, attn: torch.Tensor):
    """The rows of a right-padded batch as one prefix tree: every token shared by several rows'
    prefixes (a FOCUS tree's paths, a GRPO group's prompt) appears once.

    -> (flat [T] ids of the distinct tokens, pos [T] position of each in its path, parent [T]
    flat index of the token before it (-1 for a row's first token), index [B, L] flat index of
    every real token of every row (-1 on padding)). A row shares with the earlier row that has
    the longest common prefix with it; its tokens after that prefix are new. Flat order is
    row by row, so a token's ancestors always come before it."""
    B, L = ids.shape
    lengths = attn.sum(1).tolist()
    index = torch.full((B, L), -1, dtype=torch.long)
    flat_parts, used = [], 0
    for i, n in enumerate(lengths):
        n = int(n)
        share, src = 0, -1
        if i:                                  # longest common prefix with any earlier row
            same = (ids[:i, :n] == ids[i, :n]) & attn[:i, :n].bool()
            lcp = same.long().cumprod(1).sum(1)
            share = int(lcp.max())
            src = int(lcp.argmax())
        if share:
            index[i, :share] = index[src, :share]
        index[i, share:n] = torch.arange(used, used + n - share)
        flat_parts.append(ids[i, share:n])
        used += n - share
    flat = torch.cat(flat_parts) if flat_parts else ids.new_zeros(0)
    pos = torch.empty(used, dtype=torch.long)
    parent = torch.full((used,), -1, dtype=torch.long)
    real = index >= 0
    cols = torch.arange(L).expand(B, L)
    pos[index[real]] = cols[real]
    prev = torch.full_like(index, -1)
    prev[:, 1:] = index[:, :-1]
    parent[index[real]] = prev[real]
    return flat, pos, parent, index


def tree_mask(index: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """[T, T] bool attention mask of a packed prefix tree (`tree_pack_rows`' index, the rows'
    lengths): token q attends to token k iff k is q or one of q's ancestors, i.e. k comes
    before q in some row through q."""
    T = int(index.max()) + 1 if index.numel() else 0
    mask = torch.zeros(T, T, dtype=torch.bool)
    for i, n in enumerate(lengths):
        n = int(n)
        idx = index[i, :n]
        tri = torch.ones(n, n, dtype=torch.bool).tril()
        mask[idx[:, None], idx[None, :]] |= tri
    return mask


def tree_packable(model) -> bool:
    """Whether `tree_hidden_states` runs for this model: an attention implementation that takes
    a dense mask as given, and no sliding-window layers (a dense mask would replace their
    window)."""
    cfg = backbone(model).config
    impl = getattr(cfg, "_attn_implementation", None)
    return impl in TREE_ATTENTION and not getattr(cfg, "sliding_window", None)


def tree_hidden_states(model, flat: torch.Tensor, pos: torch.Tensor,
                       mask: torch.Tensor) -> torch.Tensor:
    """Last hidden states [T, H] of a packed prefix tree (`tree_pack_rows`, `tree_mask`):
    each token attends to its own path's earlier tokens only, at its path's positions, so its
    hidden state is the one every row through it would compute."""
    impl = getattr(backbone(model).config, "_attn_implementation", "sdpa")
    m = mask[None, None]
    if impl == "eager":
        dtype = next(model.parameters()).dtype
        m = torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(
            ~m, torch.finfo(dtype).min)
    out = backbone(model)(input_ids=flat[None], attention_mask=m, position_ids=pos[None],
                          use_cache=False)
    return out.last_hidden_state[0]


def tree_next_logprobs(model, hidden: torch.Tensor, flat: torch.Tensor, parent: torch.Tensor,
                       temperature: float, chunk: int, where: torch.Tensor,
                       entropy: bool = False):
    """[T] log p(token | its ancestors) for the tree's tokens with `where` (bool [T]) and a
    parent, from the parent's hidden state (`hidden` [T, H]); 0 elsewhere. `entropy`: ->
    (log-probs, the entropies of the same next-token distributions), as `logprobs_from_hidden`."""
    need = (where & (parent >= 0)).nonzero().squeeze(1)
    out = torch.zeros(flat.shape[0], dtype=torch.float32, device=hidden.device)
    if need.numel() == 0:
        out = out + hidden.sum() * 0.0         # keeps the graph for a backward with no tokens
        return (out, out) if entropy else out
    h = hidden.index_select(0, parent[need])
    targets = flat[need]
    head = model.get_output_embeddings()
    if chunk and isinstance(head, torch.nn.Linear):
        lp, ent = _HeadLogprobs.apply(h, head.weight, head.bias, targets, float(temperature),
                                      max(1, int(chunk)), entropy)
    elif entropy:
        lp, ent = _piece_logprobs_entropy(head, h, targets, temperature)
    else:
        lp = _piece_logprobs(head, h, targets, temperature)
    if entropy:
        return out.index_copy(0, need, lp.float()), out.index_copy(0, need, ent.float())
    return out.index_copy(0, need, lp.float())

"""Sink-aware attention (docs/methods.md), registered with transformers' attention interface.

Models such as gpt-oss carry one learned **sink logit** per head: it joins the softmax
denominator but contributes no value, and some layers attend only to a sliding window of keys
(`0 <= q - k < w`). transformers' eager path keeps the sink by building the full
`[batch, heads, queries, keys + 1]` score matrix, which is what runs out of memory at long
context. Two implementations keep the sink exactly without that matrix:

- `sink_flex` (GPUs): FlexAttention with a causal / sliding-window block mask and the
  log-sum-exp returned, then `out *= sigmoid(lse - sink_h)`; this is exact because
  `exp(lse) / (exp(lse) + exp(sink)) = sigmoid(lse - sink)`. FlexAttention is compiled on CUDA;
  on CPU it runs forward only (PyTorch has no FlexAttention backward on CPU).
- `sink_sdpa` (CPU-trainable, any device): fused `scaled_dot_product_attention` with **one
  extra key** that carries the sink: queries get one extra feature equal to `sink_h`, the extra
  key is `(0, ..., 0, 1/scale)` with a zero value, real keys get a 0 in that feature (values
  get a zero feature as well: the fused kernels need equal widths). The sink's score is
  therefore exactly `sink_h`, gradients reach the sink through the query feature, and its
  value is zero. Full-attention layers run as one causal call (a zero dummy query in front
  keeps SDPA's top-left causal alignment right); sliding-window layers run over query blocks, so
  only block-local `[block, block + w]` boolean masks ever exist.

Without a sink (`s_aux=None`, e.g. the built-in Qwen3 tiny model) both behave as plain causal /
sliding-window attention. When transformers hands over a real mask (padding, a KV cache offset,
packed sequences) it is honoured: `sink_sdpa` takes transformers' dense boolean mask and adds
the sink column, `sink_flex` takes its BlockMask. In the training case (right-padded batches,
no mask, no cache) the mask builders below return None and the window is enforced in-kernel.

Importing this module registers both with transformers; `model.attention` selects one. The
transformers name of `sink_sdpa` is `sink_fused`: transformers refuses any implementation whose
name contains "sdpa" for models that declare no SDPA support, which gpt-oss does (plain SDPA
would drop its sinks). `hf_attention_name()` maps config values to registered names.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

SINK_ATTENTIONS = ("sink_sdpa", "sink_flex")
HF_NAMES = {"sink_sdpa": "sink_fused", "sink_flex": "sink_flex"}


def hf_attention_name(name: str) -> str:
    """The `attn_implementation` to give transformers for a `model.attention` value."""
    return HF_NAMES.get(name, name)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, Hkv, L, D] -> [B, Hkv * n_rep, L, D] (grouped-query heads expanded)."""
    if n_rep == 1:
        return x
    B, H, L, D = x.shape
    return x[:, :, None].expand(B, H, n_rep, L, D).reshape(B, H * n_rep, L, D)


def _plain_causal(q_length: int, kv_length: int, q_offset, kv_offset, attention_mask) -> bool:
    """True when the mask is pure causal (+ window) over aligned, unpadded sequences."""
    if not (isinstance(q_offset, int) and isinstance(kv_offset, int)):
        return False
    if q_offset != 0 or kv_offset != 0 or q_length != kv_length:
        return False
    return attention_mask is None or bool(attention_mask[:, :kv_length].all())


# ------------------------------------------------------------------------------ sink_sdpa
def _sink_features(q, k, v, sinks, scale):
    """Queries/keys with the sink feature; keys/values with the sink key prepended.

    All three get the same extra width (the fused kernels need equal q/k/v widths): one
    feature on CPU, padded with zeros to a multiple of 8 on CUDA (its fused kernels' rule).
    """
    B, H, Lq, D = q.shape
    Hk, Lk = k.shape[1], k.shape[2]
    extra = 1 if q.device.type == "cpu" else 8 - D % 8
    sink_col = sinks.to(q.dtype).view(1, H, 1, 1).expand(B, H, Lq, 1)
    q = torch.cat([q, sink_col, q.new_zeros(B, H, Lq, extra - 1)], dim=-1)
    sink_key = torch.zeros(B, Hk, 1, D + extra, dtype=k.dtype, device=k.device)
    sink_key[..., D] = 1.0 / scale
    k = torch.cat([sink_key, torch.cat([k, k.new_zeros(B, Hk, Lk, extra)], dim=-1)], dim=2)
    v = torch.cat([v, v.new_zeros(B, Hk, Lk, extra)], dim=-1)
    v = torch.cat([v.new_zeros(B, Hk, 1, D + extra), v], dim=2)
    return q, k, v


def _sdpa(q, k, v, mask, scale, dropout, causal=False):
    n_rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                          is_causal=causal, scale=scale)


def _block_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """[len(q_pos), len(k_pos)] bool: causal, and inside the window when there is one."""
    d = q_pos[:, None] - k_pos[None, :]
    allowed = d >= 0
    if window is not None:
        allowed &= d < window
    return allowed


def sink_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                        scaling: float | None = None, sliding_window: int | None = None,
                        s_aux: torch.Tensor | None = None, block_size: int | None = None,
                        **kwargs):
    """Attention with sinks through fused SDPA; same signature and output as transformers'.

    query [B, H, Lq, D], key/value [B, Hkv, Lk, D]; queries are the last Lq positions of the
    keys (bottom-right aligned) unless `attention_mask` says otherwise. Returns
    ([B, Lq, H, D], None).
    """
    B, H, Lq, D = query.shape
    Lk = key.shape[2]
    scale = scaling if scaling is not None else D ** -0.5
    has_sink = s_aux is not None
    if has_sink:
        q, k, v = _sink_features(query, key, value, s_aux, scale)
        first = 1  # key index of the first real key
    else:
        q, k, v, first = query, key, value, 0

    if attention_mask is not None:
        # transformers built an explicit mask (padding, cache offsets, packing): use it as is
        mask = attention_mask
        if has_sink:
            pad = (torch.ones if mask.dtype == torch.bool else torch.zeros)(
                *mask.shape[:-1], 1, dtype=mask.dtype, device=mask.device)
            mask = torch.cat([pad, mask], dim=-1)
        out = _sdpa(q, k, v, mask, scale, dropout)
    elif (sliding_window is None or Lk <= sliding_window) and Lq == Lk:
        if has_sink:
            # a zero dummy query in front: with keys [sink, k_0..] top-left causal alignment
            # lets query t see the sink and k_0..k_t; the dummy sees only the zero-value sink
            q = torch.cat([q.new_zeros(B, H, 1, q.shape[-1]), q], dim=2)
            out = _sdpa(q, k, v, None, scale, dropout, causal=True)[:, :, 1:]
        else:
            out = _sdpa(q, k, v, None, scale, dropout, causal=True)
    else:
        window = sliding_window if sliding_window is not None and Lk > sliding_window else None
        bq = block_size or max(128, window or 0)
        offset = Lk - Lq  # absolute position of query 0
        parts = []
        for s in range(0, Lq, bq):
            e = min(Lq, s + bq)
            k_hi = offset + e
            k_lo = max(0, offset + s - window + 1) if window is not None else 0
            q_pos = torch.arange(offset + s, k_hi, device=q.device)
            k_pos = torch.arange(k_lo, k_hi, device=q.device)
            mask = _block_mask(q_pos, k_pos, window)
            kb = k[:, :, first + k_lo:first + k_hi]
            vb = v[:, :, first + k_lo:first + k_hi]
            if has_sink:
                mask = torch.cat([mask.new_ones(mask.shape[0], 1), mask], dim=1)
                kb = torch.cat([k[:, :, :1], kb], dim=2)
                vb = torch.cat([v[:, :, :1], vb], dim=2)
            parts.append(_sdpa(q[:, :, s:e], kb, vb, mask, scale, dropout))
        out = torch.cat(parts, dim=2)
    if has_sink:
        out = out[..., :D]  # drop the values' zero features
    return out.transpose(1, 2).contiguous(), None


def sink_sdpa_mask(allow_is_causal_skip: bool = True, **kwargs):
    """None for the plain training case (the window is applied in the attention function),
    otherwise transformers' dense boolean SDPA mask."""
    # deferred: transformers takes seconds to import
    from transformers.masking_utils import sdpa_mask

    if allow_is_causal_skip and _plain_causal(kwargs["q_length"], kwargs["kv_length"],
                                              kwargs.get("q_offset", 0), kwargs.get("kv_offset", 0),
                                              kwargs.get("attention_mask")):
        return None
    return sdpa_mask(allow_is_causal_skip=False, **kwargs)


# ------------------------------------------------------------------------------ sink_flex
@functools.lru_cache(maxsize=1)
def _compiled_flex():
    # deferred: FlexAttention: newer torch only
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _flex_fn(device: torch.device):
    """Compiled FlexAttention on CUDA (fused, memory-lean); the reference one elsewhere."""
    # deferred: FlexAttention: newer torch only
    from torch.nn.attention.flex_attention import flex_attention

    return _compiled_flex() if device.type == "cuda" else flex_attention


@functools.lru_cache(maxsize=16)
def flex_block_mask(q_length: int, kv_length: int, window: int | None, device: str):
    """BlockMask for causal (bottom-right aligned) attention, windowed if `window` is set."""
    # deferred: FlexAttention: newer torch only
    from torch.nn.attention.flex_attention import create_block_mask

    offset = kv_length - q_length

    def mask_mod(b, h, q_idx, kv_idx):
        d = q_idx + offset - kv_idx
        keep = d >= 0
        if window is not None:
            keep = keep & (d < window)
        return keep

    return create_block_mask(mask_mod, None, None, q_length, kv_length, device=device,
                             _compile=torch.device(device).type == "cuda")


def _lse_kwargs():
    try:
        # deferred: FlexAttention: newer torch only
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:  # torch < 2.9
        return {"return_lse": True}
    return {"return_aux": AuxRequest(lse=True)}


def sink_flex_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                        scaling: float | None = None, sliding_window: int | None = None,
                        s_aux: torch.Tensor | None = None, **kwargs):
    """Attention with sinks through FlexAttention: block mask, LSE, `out *= sigmoid(lse - sink)`.

    Same signature and output as transformers' attention functions: ([B, Lq, H, D], None).
    """
    # deferred: FlexAttention: newer torch only
    from torch.nn.attention.flex_attention import BlockMask

    if dropout:
        raise ValueError("sink_flex attention does not support attention dropout")
    B, H, Lq, D = query.shape
    Lk = key.shape[2]
    scale = scaling if scaling is not None else D ** -0.5
    if isinstance(attention_mask, BlockMask):
        block_mask = attention_mask
    elif attention_mask is None:
        window = sliding_window if sliding_window is not None and Lk > sliding_window else None
        block_mask = flex_block_mask(Lq, Lk, window, str(query.device))
    else:
        raise TypeError("sink_flex attention expects a BlockMask or no mask, got a dense tensor")
    n_rep = H // key.shape[1]
    out, aux = _flex_fn(query.device)(query, key, value, block_mask=block_mask, scale=scale,
                                      enable_gqa=n_rep > 1, **_lse_kwargs())
    lse = aux.lse if hasattr(aux, "lse") else aux
    if s_aux is not None:
        keep = torch.sigmoid(lse.float() - s_aux.float().view(1, H, 1))  # mass left to the keys
        out = out * keep.unsqueeze(-1).to(out.dtype)
    return out.transpose(1, 2).contiguous(), None


def sink_flex_mask(allow_is_causal_skip: bool = True, **kwargs):
    """None for the plain training case (cached block masks are built in the attention
    function), otherwise transformers' BlockMask (padding, cache offsets, packing)."""
    # deferred: transformers takes seconds to import
    from transformers.masking_utils import flex_attention_mask

    if allow_is_causal_skip and _plain_causal(kwargs["q_length"], kwargs["kv_length"],
                                              kwargs.get("q_offset", 0), kwargs.get("kv_offset", 0),
                                              kwargs.get("attention_mask")):
        return None
    return flex_attention_mask(**kwargs)


def register() -> None:
    """Register both implementations (and their mask builders) under `HF_NAMES`."""
    # deferred: transformers takes seconds to import
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    for name, attn, mask in (("sink_sdpa", sink_sdpa_attention, sink_sdpa_mask),
                             ("sink_flex", sink_flex_attention, sink_flex_mask)):
        AttentionInterface.register(HF_NAMES[name], attn)
        AttentionMaskInterface.register(HF_NAMES[name], mask)


register()

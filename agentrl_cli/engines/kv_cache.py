"""The `hf` engine's KV cache: a transformers `DynamicCache` whose plain full-attention layers
keep their keys and values in preallocated buffers and grow in place (`growing_cache`), the
buffer helpers both batch layouts share (`KVBatch` in `engines/kv_batch.py`, `RaggedKVBatch` in
`engines/kv_ragged.py`), and the cache forward keyword (`cache_arg`).

Each layer's keys and values are views of buffers with spare columns (grown by a quarter, at
least 64 columns, when full), so a forward writes its new columns in place instead of
concatenating the whole cache every token; `fork` and `add_row` write a new row into a spare
row of the buffers (a quarter more rows, at least 8, when full).
"""
from __future__ import annotations

import functools
import inspect

import torch


@functools.lru_cache(maxsize=None)
def _cache_name(model_cls: type) -> str:
    params = inspect.signature(model_cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_arg(model, cache) -> dict:
    """The KV cache as a forward keyword: `cache=` in recent transformers 5.x,
    `past_key_values=` in earlier 5.x releases (which silently ignore an unknown `cache=`: each
    decode step would then see only its new token). A PEFT-wrapped model passes the keyword
    through to its base model, whose signature decides."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {_cache_name(type(base)): cache}


def reserve(layer, rows: int, width: int, like_k: torch.Tensor, like_v: torch.Tensor):
    """Make room for `width` more columns in a cache layer's keys/values [rows, H, S, D], in
    place when its buffers have room. Afterwards `layer.keys` / `layer.values` are views of the
    first S + width columns of the buffers; the new columns hold zeros (fresh buffer) or
    whatever was last written there. Returns (key buffer, value buffer, S).

    A layer whose tensors were replaced (rows appended, kept or packed) is adopted: copied
    into new buffers with spare columns (`like_k` / `like_v` give head count, head dim, dtype
    and device when the layer is still empty)."""
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    S = keys.shape[2] if keys is not None and keys.dim() == 4 else 0
    kb, vb = getattr(layer, "_kbuf", None), getattr(layer, "_vbuf", None)
    view = S > 0 and in_buffers(layer) and keys.shape[0] == rows
    if not (view and kb.shape[2] >= S + width):
        cap = with_room(S + width, 64)
        row_cap = kb.shape[0] if view else rows          # spare rows (see `_row_room`) stay
        kb = new_buffer(like_k, row_cap, cap, rows if S else 0, S)
        vb = new_buffer(like_v, row_cap, cap, rows if S else 0, S)
        if S:
            kb[:rows, :, :S] = keys
            vb[:rows, :, :S] = values
    adopt(layer, kb, vb, rows, S + width)
    return kb, vb, S


def with_room(n: int, least: int) -> int:
    """`n` plus the spare a cache buffer is given when it grows: a quarter, at least `least`."""
    return n + max(least, n // 4)


def adopt(layer, kb: torch.Tensor, vb: torch.Tensor, rows: int, cols: int) -> None:
    """Make `kb` / `vb` the layer's buffers, its keys/values their first `rows` x `cols`."""
    layer._kbuf, layer._vbuf = kb, vb
    layer.keys, layer.values = kb[:rows, :, :cols], vb[:rows, :, :cols]


def new_buffer(like: torch.Tensor, rows: int, cols: int, filled_rows: int, filled_cols: int):
    """A [rows, heads, cols, head_dim] cache buffer, uninitialised: the caller writes its first
    `filled_rows` x `filled_cols` block, and every later column or row is written before it
    counts (a forward writes its new columns for every row of the batch, holes as zeros, see
    `_forward_rows`; a new row gets its columns from `_append_rows`), so nothing is zeroed
    twice and spare room is never touched (zeroing it cost a FOCUS rollout a fifth of its CPU
    time)."""
    return like.new_empty((rows, like.shape[1], cols, like.shape[3]))


def in_buffers(layer) -> bool:
    """Whether a layer's keys/values are views of its own preallocated buffers (first rows,
    first columns)."""
    kb, vb = getattr(layer, "_kbuf", None), getattr(layer, "_vbuf", None)
    k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
    return (kb is not None and k is not None and k.dim() == 4 and k.data_ptr() == kb.data_ptr()
            and k.stride() == kb.stride() and v.data_ptr() == vb.data_ptr()
            and v.stride() == vb.stride())


@functools.lru_cache(maxsize=None)
def growing_layer_class():
    # deferred: transformers takes seconds to import
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """transformers' `DynamicLayer` with its keys/values kept in preallocated buffers
        (`reserve`): appending writes in place instead of `torch.cat` of the whole cache."""

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            kb, vb, S = reserve(self, key_states.shape[0], key_states.shape[2], key_states,
                                 value_states)
            n = key_states.shape[0]                  # the buffers may hold spare rows
            kb[:n, :, S:S + key_states.shape[2]] = key_states
            vb[:n, :, S:S + value_states.shape[2]] = value_states
            return self.keys, self.values

    return GrowingLayer


def growing_cache(config):
    """A `DynamicCache` whose plain (full-attention) layers grow in place; other layer kinds
    (sliding windows) keep transformers' own update."""
    # deferred: transformers takes seconds to import
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=config)
    for layer in cache.layers:
        if type(layer) is DynamicLayer:
            layer.__class__ = growing_layer_class()
    return cache

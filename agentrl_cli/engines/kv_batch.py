"""The `hf` engine's KV batches: batched multi-turn generation with a Hugging Face causal LM on
CPU or GPU (`KVBatch`, `RaggedKVBatch`; the engine itself: `engines/hf.py`), the cache
buffers they grow in place and the cache forward keyword (`cache_arg`).

Many episodes decode at once in one batch. Each row is one episode; its KV cache is kept
across the episode's turns: an observation is *appended* (prefilled on top of the cache),
never re-prefilled with the whole history. Explicit position ids count only real tokens, which
makes every row's logits equal to running that row alone (tested).

Two layouts share one interface. `RaggedKVBatch` (what `HFEngine.new_batch` gives for a model
of plain full-attention layers) keeps each row's tokens left-aligned in its own first columns:
no holes, nothing to pack, the mask derived from the rows' lengths; a forward of some rows
gathers only their first max(their lengths) columns, and a fork copies only its prefix.
`KVBatch` (models with sliding-window layers, whose cache transformers updates itself) appends
every forward's columns to every row: rows fed at different times hold each other's columns as
holes, which the 2-D attention mask marks and `pack` removes.

The last token a row sampled is not fed to the model until the row's next chunk arrives (it is
prepended to it), so a turn costs no forward pass after its stop token.

Forking (FOCUS): `fork(src, prefix_len)` appends a row that holds row `src`'s cache restricted
to its first `prefix_len` real tokens (the K/V are copied, not recomputed), so a continuation
from a segment-boundary state costs one token of prefill. `keep(rows)` drops rows (and the
cache columns no remaining row attends to). With `keep_hidden = True` each row's last hidden
state (after the final norm, the input of the LM head and of a value head) is kept as well.

The cache is preallocated: each layer's keys and values are views of buffers with spare
columns (grown by a quarter, at least 64 columns, when full), and a forward writes its new columns
in place instead of concatenating the whole cache every token. `fork` and `add_row` write the
new row into a spare row of the buffers (a quarter more rows, at least 8, when full).
"""
from __future__ import annotations

import functools
from typing import Sequence

import torch

from .base import SamplingParams
from .sampling import sample, sample_rows


@functools.lru_cache(maxsize=None)
def _cache_name(model_cls: type) -> str:
    import inspect

    params = inspect.signature(model_cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_arg(model, cache) -> dict:
    """The KV cache as a forward keyword: `cache=` in recent transformers 5.x,
    `past_key_values=` in earlier 5.x releases (which silently ignore an unknown `cache=`: each
    decode step would then see only its new token). A PEFT-wrapped model passes the keyword
    through to its base model, whose signature decides."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {_cache_name(type(base)): cache}



def _reserve(layer, rows: int, width: int, like_k: torch.Tensor, like_v: torch.Tensor):
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
    view = S > 0 and _in_buffers(layer) and keys.shape[0] == rows
    if not (view and kb.shape[2] >= S + width):
        cap = _with_room(S + width, 64)
        row_cap = kb.shape[0] if view else rows          # spare rows (see `_row_room`) stay
        kb = _buffer(like_k, row_cap, cap, rows if S else 0, S)
        vb = _buffer(like_v, row_cap, cap, rows if S else 0, S)
        if S:
            kb[:rows, :, :S] = keys
            vb[:rows, :, :S] = values
    _adopt(layer, kb, vb, rows, S + width)
    return kb, vb, S


def _with_room(n: int, least: int) -> int:
    """`n` plus the spare a cache buffer is given when it grows: a quarter, at least `least`."""
    return n + max(least, n // 4)


def _adopt(layer, kb: torch.Tensor, vb: torch.Tensor, rows: int, cols: int) -> None:
    """Make `kb` / `vb` the layer's buffers, its keys/values their first `rows` x `cols`."""
    layer._kbuf, layer._vbuf = kb, vb
    layer.keys, layer.values = kb[:rows, :, :cols], vb[:rows, :, :cols]


def _gather_rows(sub_layer, layer, idx: torch.Tensor, width: int) -> None:
    """Give a growing layer of a sub-batch cache the rows `idx` of `layer`'s keys/values, in
    buffers with exactly `width` free columns: one copy (the gather), and the model's forward
    then writes its new columns in place instead of concatenating the gathered cache."""
    k, v = layer.keys, layer.values
    S = k.shape[2]
    kb = k.new_empty((idx.numel(), k.shape[1], S + width, k.shape[3]))
    vb = v.new_empty((idx.numel(), v.shape[1], S + width, v.shape[3]))
    torch.index_select(k, 0, idx, out=kb[:, :, :S])
    torch.index_select(v, 0, idx, out=vb[:, :, :S])
    sub_layer.lazy_initialization(k, v)
    _adopt(sub_layer, kb, vb, idx.numel(), S)


def _buffer(like: torch.Tensor, rows: int, cols: int, filled_rows: int, filled_cols: int):
    """A [rows, heads, cols, head_dim] cache buffer, uninitialised: the caller writes its first
    `filled_rows` x `filled_cols` block, and every later column or row is written before it
    counts (a forward writes its new columns for every row of the batch, holes as zeros, see
    `_forward_rows`; a new row gets its columns from `_append_rows`), so nothing is zeroed
    twice and spare room is never touched (zeroing it cost a FOCUS rollout a fifth of its CPU
    time)."""
    return like.new_empty((rows, like.shape[1], cols, like.shape[3]))


def _move_columns(src: torch.Tensor, dst: torch.Tensor, idx: torch.Tensor, n: int) -> None:
    """`dst[r, h, j] = src[r, h, idx[r, j]]` for the first `n` rows, every head and column j of
    `idx` [n, W]; `src` and `dst` are contiguous [rows, H, cap, D] buffers, possibly the same
    one (every source value is read before any is written). Done as one
    index_select of whole head vectors (D values each) from `src` seen as a [rows x H x cap, D]
    table, then one strided copy into `dst`'s first `n` rows and `W` columns: 1.7-2.9x faster
    on a CPU than `torch.gather` over an expanded index, which picks every value separately
    (`benchmarks/bench_pack.py`)."""
    H, D, W = src.shape[1], src.shape[3], idx.shape[1]
    heads = torch.arange(H, device=idx.device)[None, :, None]
    rows = torch.arange(n, device=idx.device)[:, None, None]
    take = ((rows * H + heads) * src.shape[2] + idx[:, None, :]).reshape(-1)
    dst[:n, :, :W] = src.view(-1, D).index_select(0, take).view(n, H, W, D)


def _in_buffers(layer) -> bool:
    """Whether a layer's keys/values are views of its own preallocated buffers (first rows,
    first columns)."""
    kb, vb = getattr(layer, "_kbuf", None), getattr(layer, "_vbuf", None)
    k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
    return (kb is not None and k is not None and k.dim() == 4 and k.data_ptr() == kb.data_ptr()
            and k.stride() == kb.stride() and v.data_ptr() == vb.data_ptr()
            and v.stride() == vb.stride())


def _row_room(layer) -> tuple[torch.Tensor, torch.Tensor]:
    """Buffers of a growing layer with room for one more row after its current ones (fork and
    add_row append rows): the layer's own when they have a spare row, else new ones with a
    quarter more rows (at least 8) and spare columns, holding the current keys/values (which
    become views of them). Appending a row then writes one row instead of concatenating the
    whole cache and adopting the result into new buffers (two copies per fork)."""
    k, v = layer.keys, layer.values
    n, S = k.shape[0], k.shape[2]
    if _in_buffers(layer) and layer._kbuf.shape[0] > n:
        return layer._kbuf, layer._vbuf
    rows, cap = _with_room(n, 8) + 1, _with_room(S, 64)
    kb = _buffer(k, rows, cap, n, S)
    vb = _buffer(v, rows, cap, n, S)
    kb[:n, :, :S] = k
    vb[:n, :, :S] = v
    _adopt(layer, kb, vb, n, S)
    return kb, vb


@functools.lru_cache(maxsize=None)
def _growing_layer_class():
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """transformers' `DynamicLayer` with its keys/values kept in preallocated buffers
        (`_reserve`): appending writes in place instead of `torch.cat` of the whole cache."""

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            kb, vb, S = _reserve(self, key_states.shape[0], key_states.shape[2], key_states,
                                 value_states)
            n = key_states.shape[0]                  # the buffers may hold spare rows
            kb[:n, :, S:S + key_states.shape[2]] = key_states
            vb[:n, :, S:S + value_states.shape[2]] = value_states
            return self.keys, self.values

    return GrowingLayer


def _growing_cache(config):
    """A `DynamicCache` whose plain (full-attention) layers grow in place; other layer kinds
    (sliding windows) keep transformers' own update."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=config)
    for layer in cache.layers:
        if type(layer) is DynamicLayer:
            layer.__class__ = _growing_layer_class()
    return cache


BLOCK_SHARE = 0.6   # `RaggedKVBatch`: the share of a block of rows fed above which the block runs in place
DENSE_SHARE = 0.7   # `extend(only_fed=True)`: the share of rows decoding above which every row runs


class KVBatch:
    """`n_rows` growing token sequences sharing one KV cache; a row may sit idle. Rows fed at
    different times hold each other's columns as holes (`RaggedKVBatch` keeps none)."""

    ragged = False            # the mask is a stored array (True: derived from `lengths`)

    def __init__(self, model, n_rows: int, pad_id: int, device: torch.device | str = "cpu"):
        self.model = model
        self.n = n_rows
        self.pad_id = pad_id
        self.device = torch.device(device)
        self.cache = _growing_cache(model.config)
        if not self.ragged:
            self.mask = torch.zeros(n_rows, 0, dtype=torch.long, device=self.device)
        self.lengths = torch.zeros(n_rows, dtype=torch.long, device=self.device)  # real tokens fed
        self.pending: list[list[int]] = [[] for _ in range(n_rows)]  # sampled, not yet fed
        self.last_logits: torch.Tensor | None = None  # [n_rows, V] next-token logits per row
        self.forward_tokens = 0   # real tokens fed (prefill + decode), for throughput reports
        self.tokens: list[list[int]] = [[] for _ in range(n_rows)]  # real tokens fed, per row
        self.keep_hidden = False  # also keep each row's last hidden state (value heads)
        self.row_hint = 0         # rows the batch expects to hold at once (`RaggedKVBatch` sizes its buffers)
        self.last_hidden: torch.Tensor | None = None  # [n_rows, H] when keep_hidden

    @torch.no_grad()
    def _forward(self, chunks: list[list[int]]) -> None:
        """Feed each row its chunk (left-padded to a common length); keep last real logits."""
        width = max(len(c) for c in chunks)
        if width == 0:
            return
        # one host tensor per forward (not one per row): decoding is many small forwards
        ids = torch.tensor([[self.pad_id] * (width - len(c)) + c for c in chunks], dtype=torch.long)
        new_mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in chunks],
                                dtype=torch.long)
        ids, new_mask = ids.to(self.device), new_mask.to(self.device)
        pos = (self.lengths[:, None] + new_mask.cumsum(1) - 1).clamp(min=0)
        self.mask = torch.cat([self.mask, new_mask], dim=1)
        out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=pos,
                         **cache_arg(self.model, self.cache), use_cache=True,
                         output_hidden_states=self.keep_hidden)
        logits = out.logits[:, -1, :]
        has = new_mask[:, -1].bool()
        if self.last_logits is None:
            self.last_logits = torch.zeros_like(logits)
        if bool(has.all()):
            self.last_logits.copy_(logits)
        else:
            self.last_logits[has] = logits[has].to(self.last_logits.dtype)
        if self.keep_hidden:
            h = out.hidden_states[-1][:, -1, :]
            if self.last_hidden is None or self.last_hidden.shape[0] != self.n:
                self.last_hidden = torch.zeros_like(h)
            self.last_hidden[has] = h[has].to(self.last_hidden.dtype)
        self.lengths += new_mask.sum(1)
        self.forward_tokens += int(new_mask.sum())
        for r, c in enumerate(chunks):
            if c:
                self.tokens[r] += c

    @torch.no_grad()
    def _forward_rows(self, rows: list[int], chunks: list[list[int]]) -> None:
        """Feed only `rows` (chunks left-padded to a common length): the other rows get hole
        columns but no compute. The fed rows' cache is gathered into a sub-batch cache, and
        their new K/V are written back into the new columns."""
        width = max(len(c) for c in chunks)
        m = len(rows)
        ids = torch.full((m, width), self.pad_id, dtype=torch.long)
        new_mask = torch.zeros(m, width, dtype=torch.long)
        for j, c in enumerate(chunks):
            ids[j, width - len(c):] = torch.tensor(c, dtype=torch.long)
            new_mask[j, width - len(c):] = 1
        ids, new_mask = ids.to(self.device), new_mask.to(self.device)
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        pos = (self.lengths[idx][:, None] + new_mask.cumsum(1) - 1).clamp(min=0)
        S = self.mask.shape[1]
        sub = _growing_cache(self.model.config)
        for i, layer in enumerate(self.cache.layers):
            if getattr(layer, "keys", None) is not None and layer.keys.dim() == 4:
                if S and i < len(sub.layers) and isinstance(sub.layers[i], _growing_layer_class()):
                    _gather_rows(sub.layers[i], layer, idx, width)
                else:
                    sub.update(layer.keys[idx], layer.values[idx], i)
        out = self.model(input_ids=ids, attention_mask=torch.cat([self.mask[idx], new_mask], dim=1),
                         position_ids=pos, **cache_arg(self.model, sub), use_cache=True,
                         logits_to_keep=1, output_hidden_states=self.keep_hidden)
        while len(self.cache.layers) < len(sub.layers):  # a cache that never saw a forward
            self.cache.layers.append(type(sub.layers[len(self.cache.layers)])())
        for layer, sl in zip(self.cache.layers, sub.layers):
            nk, nv = sl.keys[:, :, S:], sl.values[:, :, S:]
            if getattr(layer, "keys", None) is None or layer.keys.dim() != 4:
                layer.lazy_initialization(nk, nv)
                layer.keys = nk.new_zeros((self.n, nk.shape[1], 0, nk.shape[3]))
                layer.values = nv.new_zeros((self.n, nv.shape[1], 0, nv.shape[3]))
            # the full cache lives in buffers with spare columns, so adding columns does not
            # copy the whole cache every forward; the other rows' new columns are holes (zeros:
            # a buffer column is written once, by the forward that adds it)
            kb, vb, _ = _reserve(layer, self.n, width, nk, nv)
            kb[:self.n, :, S:S + width].zero_()       # the other rows' holes
            vb[:self.n, :, S:S + width].zero_()
            kb[idx, :, S:S + width] = nk
            vb[idx, :, S:S + width] = nv
        mask = torch.cat([self.mask, self.mask.new_zeros((self.n, width))], dim=1)
        mask[idx, S:] = new_mask
        self.mask = mask
        logits = out.logits[:, -1, :]
        if self.last_logits is None:
            self.last_logits = torch.full((self.n, logits.shape[-1]), float("nan"), dtype=logits.dtype,
                                          device=self.device)
        self.last_logits[idx] = logits.to(self.last_logits.dtype)
        if self.keep_hidden:
            h = out.hidden_states[-1][:, -1, :]
            if self.last_hidden is None or self.last_hidden.shape[0] != self.n:
                self.last_hidden = torch.full((self.n, h.shape[-1]), float("nan"), dtype=h.dtype,
                                              device=self.device)
            self.last_hidden[idx] = h.to(self.last_hidden.dtype)
        self.lengths[idx] += new_mask.sum(1)
        self.forward_tokens += int(new_mask.sum())
        for r, c in zip(rows, chunks):
            self.tokens[r] += c

    def extend(self, chunks: list[list[int] | None], only_fed: bool = False) -> None:
        """Append tokens to rows (None or [] = nothing). A row's pending sampled token goes first.

        `only_fed=True` computes only the rows that get tokens, in at most two forwards (rows
        fed one token, rows fed more), instead of one forward over every row padded to the
        longest chunk: what continuous batching needs, where one row's observation prefill
        would otherwise be padded into every other row (and parked rows cost nothing).
        """
        full = []
        for r, c in enumerate(chunks):
            if c is None:
                full.append([])
            else:
                full.append(self.pending[r] + list(c))
                self.pending[r] = []
        if not only_fed:
            self._forward(full)
            return
        ones = [r for r, c in enumerate(full) if len(c) == 1]
        more = [r for r, c in enumerate(full) if len(c) > 1]
        if ones and len(ones) >= DENSE_SHARE * self.n:
            # most rows decode: one forward over every row in place (the idle ones fed
            # nothing) costs less than gathering the fed rows' cache into a sub-batch
            self._forward([full[r] if len(full[r]) == 1 else [] for r in range(self.n)])
            ones = []
        for group in (ones, more):
            if group:
                self._forward_rows(group, [full[r] for r in group])

    # ------------------------------------------------------------------ rows: fork, add, keep

    def _append_rows(self, keys_values: list[tuple[torch.Tensor, torch.Tensor]] | None,
                     mask_row: torch.Tensor) -> int:
        """Append one row: per-layer (keys [1,H,S,D], values) or None for zeros, and its mask."""
        for i, layer in enumerate(self.cache.layers):
            if getattr(layer, "keys", None) is None:
                continue
            if isinstance(layer, _growing_layer_class()) and layer.keys.dim() == 4:
                n, S = layer.keys.shape[0], layer.keys.shape[2]
                kb, vb = _row_room(layer)
                if keys_values is None:
                    kb[n, :, :S] = 0
                    vb[n, :, :S] = 0
                else:                       # views of the source row: different rows, no overlap
                    kb[n, :, :S] = keys_values[i][0][0]
                    vb[n, :, :S] = keys_values[i][1][0]
                _adopt(layer, kb, vb, n + 1, S)
                continue
            if keys_values is None:
                k = layer.keys.new_zeros((1, *layer.keys.shape[1:]))
                v = layer.values.new_zeros((1, *layer.values.shape[1:]))
            else:
                k, v = keys_values[i]
            layer.keys = torch.cat([layer.keys, k], dim=0)
            layer.values = torch.cat([layer.values, v], dim=0)
        self.mask = torch.cat([self.mask, mask_row[None]], dim=0)
        self.lengths = torch.cat([self.lengths, self.lengths.new_zeros(1)])
        self.pending.append([])
        self.tokens.append([])
        if self.last_logits is not None:
            self.last_logits = torch.cat([self.last_logits,
                                          self.last_logits.new_full((1, self.last_logits.shape[1]), float("nan"))])
        if self.last_hidden is not None:
            self.last_hidden = torch.cat([self.last_hidden,
                                          self.last_hidden.new_full((1, self.last_hidden.shape[1]), float("nan"))])
        self.n += 1
        return self.n - 1

    def add_row(self) -> int:
        """Append an empty row (no tokens); returns its index. Feed it with `extend`."""
        return self._append_rows(None, self.mask.new_zeros(self.mask.shape[1]))

    def fork(self, src_row: int, prefix_len: int) -> int:
        """Append a row whose context is row `src_row`'s first `prefix_len` real tokens.

        The K/V of the first `prefix_len - 1` tokens are copied from `src_row` (every layer, along
        the batch dim) and the mask columns of its later tokens are zeroed; the prefix's last token
        becomes the new row's `pending` token. Its next-token logits (`last_logits`, NaN until
        then) and hidden state are therefore produced by the next `extend` that feeds the row
        (`extend` with `[]` or with more tokens), batched with the other rows' work: the exact
        logits after the prefix at the cost of one token, with no per-row logits stored.
        Returns the new row's index. `prefix_len` must not exceed the row's fed tokens.
        """
        n_fed = int(self.lengths[src_row])
        if not 0 <= prefix_len <= n_fed:
            raise ValueError(f"fork: prefix_len {prefix_len} outside [0, {n_fed}] for row {src_row}")
        if prefix_len == 0:
            return self.add_row()
        keep = prefix_len - 1
        new = self._forked_row(src_row, keep)
        self.lengths[new] = keep
        self.tokens[new] = list(self.tokens[src_row][:keep])
        self.pending[new] = [self.tokens[src_row][keep]]
        return new

    def _forked_row(self, src_row: int, keep: int) -> int:
        """Append a row holding `src_row`'s cache and mask up to its `keep`-th real token."""
        row_mask = self.mask[src_row].clone()
        row_mask[row_mask.cumsum(0) > keep] = 0
        kv = [(layer.keys[src_row:src_row + 1], layer.values[src_row:src_row + 1])
              if getattr(layer, "keys", None) is not None else None for layer in self.cache.layers]
        return self._append_rows(kv, row_mask)

    def truncate(self, row: int, prefix_len: int) -> None:
        """Cut row `row` back to its first `prefix_len` real tokens, in place (a context reset:
        `context/`). Like `fork` without the copy: the mask columns of its later tokens become
        holes, the prefix's last token becomes `pending`, and positions continue from
        `prefix_len`, so the row then equals a fresh row prefilled with that prefix."""
        n_fed = int(self.lengths[row])
        if not 1 <= prefix_len <= n_fed:
            raise ValueError(f"truncate: prefix_len {prefix_len} outside [1, {n_fed}] for row {row}")
        keep = prefix_len - 1
        if not self.ragged:                 # a ragged batch's mask follows its lengths
            row_mask = self.mask[row].clone()
            row_mask[row_mask.cumsum(0) > keep] = 0
            self.mask[row] = row_mask
        self.lengths[row] = keep
        self.pending[row] = [self.tokens[row][keep]]
        self.tokens[row] = self.tokens[row][:keep]
        if self.last_logits is not None:
            self.last_logits[row] = float("nan")
        if self.last_hidden is not None:
            self.last_hidden[row] = float("nan")
        self._views()

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (renumbered 0.. in the given order) and drop the cache columns that no
        kept row attends to. Explicit position ids make the removal exact."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        mask = self.mask[idx]
        cols = mask.bool().any(0)
        all_cols = bool(cols.all())
        col_idx = cols.nonzero().squeeze(-1)
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is None:
                continue
            k, v = layer.keys[idx], layer.values[idx]
            if not all_cols:
                k, v = k[:, :, col_idx], v[:, :, col_idx]
            layer.keys, layer.values = k.contiguous(), v.contiguous()
        self.mask = mask if all_cols else mask[:, col_idx]
        self._keep_rows(rows, idx)

    def _views(self) -> None:
        """Re-point the cache layers at the batch's rows and width (`RaggedKVBatch`; here the
        layers are the cache itself)."""

    def _keep_rows(self, rows: list[int], idx: torch.Tensor) -> None:
        """The per-row state of `keep`: lengths, pending and fed tokens, last logits and hidden
        states of `rows` (`idx` on the device), renumbered 0.. in order."""
        self.lengths = self.lengths[idx]
        self.pending = [self.pending[r] for r in rows]
        self.tokens = [self.tokens[r] for r in rows]
        if self.last_logits is not None:
            self.last_logits = self.last_logits[idx]
        if self.last_hidden is not None:
            self.last_hidden = self.last_hidden[idx]
        self.n = len(rows)

    def pack(self) -> None:
        """Defragment: move every row's real tokens to the right end of a cache exactly as wide
        as the longest row. Rows that are fed at different times (continuous batching) each add
        columns that every other row holds as holes, so the cache would grow with the sum of
        the rows' lengths instead of the longest; keys are stored after RoPE and positions are
        explicit, so moving columns is exact."""
        width = int(self.lengths.max()) if self.n else 0
        if self.mask.shape[1] <= width:
            return
        S = self.mask.shape[1]
        real = self.mask.bool()
        # for each row: its real columns in order, left-padded with column indices of holes
        order = torch.argsort(real.to(torch.int8), dim=1, stable=True)  # holes first, then reals
        idx = order[:, S - width:]
        self.mask = torch.gather(self.mask, 1, idx)
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is None:
                continue
            g = idx[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            if isinstance(layer, _growing_layer_class()):
                # into buffers with spare rows and columns: no intermediate copy for the next
                # forward to adopt. They keep at least the old buffers' room: the rows grow back
                # after a pack, and a buffer sized to the packed width had to be regrown (one
                # more copy of the whole cache) within a few dozen tokens. When the old buffers
                # are that room the move stays in them (it reads every source before it writes),
                # so no fresh buffers are allocated and first touched
                k, v = layer.keys, layer.values
                old_rows, old_cols = ((layer._kbuf.shape[0], layer._kbuf.shape[2])
                                      if _in_buffers(layer) else (0, 0))
                rows = max(_with_room(k.shape[0], 8), old_rows)
                cap = max(_with_room(width, 64), old_cols)
                if (rows, cap) == (old_rows, old_cols):
                    kb, vb = layer._kbuf, layer._vbuf
                else:
                    kb = _buffer(k, rows, cap, self.n, width)
                    vb = _buffer(v, rows, cap, self.n, width)
                if _in_buffers(layer):
                    _move_columns(layer._kbuf, kb, idx, self.n)
                    _move_columns(layer._vbuf, vb, idx, self.n)
                else:
                    torch.gather(k, 2, g, out=kb[:self.n, :, :width])
                    torch.gather(v, 2, g, out=vb[:self.n, :, :width])
                _adopt(layer, kb, vb, self.n, width)
                continue
            layer.keys = torch.gather(layer.keys, 2, g)
            layer.values = torch.gather(layer.values, 2, g)

    def generate(self, rows: list[int], params: SamplingParams, stop_ids: tuple[int, ...],
                 generator: torch.Generator | Sequence[torch.Generator] | None = None,
                 ) -> tuple[list[list[int]], list[list[float]]]:
        """Decode one assistant message for each row in `rows` (others idle).

        `generator` is one generator for the batch or a sequence of per-row generators
        (indexed by row; see `sample_rows`).
        Returns the generated ids (stop token included when produced) and their log-probs.
        """
        out_ids: dict[int, list[int]] = {r: [] for r in rows}
        out_lp: dict[int, list[float]] = {r: [] for r in rows}
        active = list(rows)
        stop = set(stop_ids)
        while active:
            idx = torch.tensor(active, dtype=torch.long, device=self.device)
            if isinstance(generator, (list, tuple)):
                tok, lp = sample_rows(self.last_logits[idx], params, [generator[r] for r in active])
            else:
                tok, lp = sample(self.last_logits[idx], params, generator)
            tok, lp = tok.tolist(), lp.tolist()
            feed: list[list[int] | None] = [None] * self.n
            still = []
            for j, r in enumerate(active):
                t = tok[j]
                out_ids[r].append(t)
                out_lp[r].append(lp[j])
                if t in stop or len(out_ids[r]) >= params.max_new_tokens:
                    self.pending[r] = [t]
                else:
                    feed[r] = [t]
                    still.append(r)
            if still:
                self._forward([c or [] for c in feed])
            active = still
        return [out_ids[r] for r in rows], [out_lp[r] for r in rows]


def _place(dst: torch.Tensor, dst_rows: torch.Tensor, at: torch.Tensor, src: torch.Tensor,
           src_rows: torch.Tensor, end: int, counts: torch.Tensor) -> None:
    """`dst[dst_rows[j], :, at[j] + t] = src[src_rows[j], :, end - counts[j] + t]` for
    t < counts[j]: each row's last `counts[j]` columns before `end` of `src` (the real new tokens
    of a left-padded chunk), written from column `at[j]` of its row of `dst` (the row's length:
    `RaggedKVBatch`). All source values are read before any is written."""
    if bool((counts == 1).all()):           # decoding: one column per row
        dst[dst_rows, :, at] = src[src_rows, :, end - 1]
        return
    total = int(counts.sum())
    if total == 0:
        return
    j = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)
    t = torch.arange(total, device=counts.device) - torch.repeat_interleave(
        counts.cumsum(0) - counts, counts)
    vals = src[src_rows[j], :, end - counts[j] + t]          # [total, H, D], a copy
    dst[dst_rows[j], :, at[j] + t] = vals


class RaggedKVBatch(KVBatch):
    """A `KVBatch` whose rows are left-aligned: row r's tokens sit in columns
    `[0, lengths[r])` of every layer's buffers, so there are no holes, no pack, and the mask is
    derived from the lengths (`mask`). A forward of some rows gathers their first
    max(their lengths) columns only; a fork copies its prefix's columns only.

    A forward works on a view of the rows' columns (all rows: the buffers themselves; some
    rows: a gathered sub-batch cache) with the new tokens appended after the widest row, as
    transformers' cache expects; each row's real new tokens are then moved to the columns right
    after its own tokens (`_place`). Columns past a row's length are never attended (masked),
    but a masked column must hold finite values (0 x NaN is NaN in the attention's product):
    every row's columns below the batch's width are written before they count (a forward over
    all rows writes the new columns of every row; a forward of some rows that widens the batch
    zeroes the others' new columns; `fork` and `add_row` write the new row's). Needs a cache of
    plain full-attention layers (`HFEngine.new_batch` checks)."""

    ragged = True

    @property
    def width(self) -> int:
        """The longest row: the columns a forward over every row attends."""
        return int(self.lengths.max()) if self.n else 0

    @property
    def mask(self) -> torch.Tensor:
        """[n, width] 1 for each row's tokens (derived from `lengths`)."""
        cols = torch.arange(self.width, device=self.device)
        return (cols[None, :] < self.lengths[:, None]).long()

    def _layers(self):
        """The cache layers that hold buffers."""
        return [layer for layer in self.cache.layers
                if getattr(layer, "_kbuf", None) is not None and layer.keys is not None]

    def _views(self) -> None:
        """Every layer's keys/values: views of its buffers' first n rows and `width` columns."""
        W = self.width
        for layer in self._layers():
            _adopt(layer, layer._kbuf, layer._vbuf, self.n, W)

    def _room(self, rows: int, cols: int) -> None:
        """Buffers with at least `rows` rows and `cols` columns (rows grown by half, at least
        8: a tree rollout adds a row per continuation; columns by a quarter, at least 64), the
        first n rows' first `width` columns kept."""
        grown = [layer for layer in self._layers()
                 if layer._kbuf.shape[0] < rows or layer._kbuf.shape[2] < cols]
        if not grown:                         # the views already point at these buffers
            return
        n, W = self.n, self.width
        for layer in grown:
            kb, vb = layer._kbuf, layer._vbuf
            r = kb.shape[0] if kb.shape[0] >= rows else max(rows + max(8, rows // 2), self.row_hint)
            c = kb.shape[2] if kb.shape[2] >= cols else _with_room(cols, 64)
            nk, nv = _buffer(kb, r, c, n, W), _buffer(vb, r, c, n, W)
            nk[:n, :, :W] = kb[:n, :, :W]
            nv[:n, :, :W] = vb[:n, :, :W]
            layer._kbuf, layer._vbuf = nk, nv
        self._views()

    @torch.no_grad()
    def _forward(self, chunks: list[list[int]]) -> None:
        """Every row, in place: the new columns go after the widest row, then each row's real
        new tokens move to its own end."""
        if max(len(c) for c in chunks) == 0:
            return
        ids, new_mask = self._left_padded(chunks)
        width, W = ids.shape[1], self.width
        self._room(self.n, W + width)         # transformers writes [W, W + width) in place
        out = self._model(ids, new_mask, self.lengths, W, self.cache)
        counts = new_mask.sum(1)
        rows = torch.arange(self.n, device=self.device)
        for layer in self._layers():
            _place(layer._kbuf, rows, self.lengths, layer._kbuf, rows, W + width, counts)
            _place(layer._vbuf, rows, self.lengths, layer._vbuf, rows, W + width, counts)
        self._keep_outputs(out, rows, new_mask[:, -1].bool())
        self._fed(rows, counts, range(self.n), chunks)

    @torch.no_grad()
    def _forward_rows(self, rows: list[int], chunks: list[list[int]]) -> None:
        """Only `rows`: their first max(their lengths) columns gathered into a sub-batch cache,
        their new tokens placed at their own ends in the batch's buffers. Rows that fill most
        of the block of rows they span (`BLOCK_SHARE`) run as that block instead, in place
        (`_forward_block`: no gather)."""
        a, b = min(rows), max(rows) + 1
        if (len(rows) >= BLOCK_SHARE * (b - a) and self._layers()
                and int(self.lengths[a:b].max()) > 0):
            self._forward_block(a, b, rows, chunks)
            return
        ids, new_mask = self._left_padded(chunks)
        width, m = ids.shape[1], len(rows)
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        lens = self.lengths[idx]
        Wr = int(lens.max())
        sub = self._gathered(idx, Wr, width)
        out = self._model(ids, new_mask, lens, Wr, sub)
        counts = new_mask.sum(1)
        W, W_new = self.width, max(self.width, int((lens + counts).max()))
        self._first_buffers(sub, W_new)
        self._room(self.n, W_new)
        sub_rows = torch.arange(m, device=self.device)
        for layer, sl in zip(self.cache.layers, sub.layers):
            if W_new > W:                      # the batch widens: the other rows' new columns
                layer._kbuf[:self.n, :, W:W_new].zero_()
                layer._vbuf[:self.n, :, W:W_new].zero_()
            _place(layer._kbuf, idx, lens, sl.keys, sub_rows, Wr + width, counts)
            _place(layer._vbuf, idx, lens, sl.values, sub_rows, Wr + width, counts)
        self._keep_outputs(out, idx, None)
        self._fed(idx, counts, rows, chunks)

    def _model(self, ids: torch.Tensor, new_mask: torch.Tensor, lens: torch.Tensor, cached: int,
               cache):
        """The model over `cache` (rows of lengths `lens`, `cached` columns) and the new chunks,
        positions after each row's length; the last position's logits."""
        pos = (lens[:, None] + new_mask.cumsum(1) - 1).clamp(min=0)
        old = (torch.arange(cached, device=self.device)[None, :] < lens[:, None]).long()
        return self.model(input_ids=ids, attention_mask=_attention_mask(self.model, old, new_mask),
                          position_ids=pos, **cache_arg(self.model, cache), use_cache=True,
                          logits_to_keep=1, output_hidden_states=self.keep_hidden)

    def _left_padded(self, chunks: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, mask) [m, longest chunk]: the chunks left-padded, 1 on their real tokens."""
        width = max(len(c) for c in chunks)
        ids = torch.tensor([[self.pad_id] * (width - len(c)) + c for c in chunks], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in chunks], dtype=torch.long)
        return ids.to(self.device), mask.to(self.device)

    def _gathered(self, idx: torch.Tensor, Wr: int, width: int):
        """A cache of rows `idx`' first `Wr` columns, with room for `width` new ones."""
        sub = _growing_cache(self.model.config)
        for layer, sl in zip(self.cache.layers, sub.layers):
            if Wr and getattr(layer, "_kbuf", None) is not None:
                kb, vb = layer._kbuf, layer._vbuf
                sk = kb.new_empty((idx.numel(), kb.shape[1], Wr + width, kb.shape[3]))
                sv = vb.new_empty((idx.numel(), vb.shape[1], Wr + width, vb.shape[3]))
                torch.index_select(kb[:, :, :Wr], 0, idx, out=sk[:, :, :Wr])
                torch.index_select(vb[:, :, :Wr], 0, idx, out=sv[:, :, :Wr])
                sl.lazy_initialization(layer.keys, layer.values)
                _adopt(sl, sk, sv, idx.numel(), Wr)
        return sub

    def _first_buffers(self, sub, cols: int) -> None:
        """Buffers for the layers of a cache that never saw a forward (like `sub`'s layers, with
        room for `cols` columns; its rows' first `width` columns zeroed)."""
        W = self.width
        while len(self.cache.layers) < len(sub.layers):
            self.cache.layers.append(type(sub.layers[len(self.cache.layers)])())
        for layer, sl in zip(self.cache.layers, sub.layers):
            if getattr(layer, "_kbuf", None) is None or layer.keys is None:
                layer.lazy_initialization(sl.keys, sl.values)
                kb = _buffer(sl.keys, _with_room(self.n, 8), _with_room(cols, 64), 0, 0)
                vb = _buffer(sl.values, kb.shape[0], kb.shape[2], 0, 0)
                kb[:self.n, :, :W].zero_()
                vb[:self.n, :, :W].zero_()
                _adopt(layer, kb, vb, self.n, W)

    def _fed(self, idx: torch.Tensor, counts: torch.Tensor, rows, chunks) -> None:
        """Book a forward: rows `idx` got `counts` tokens (`chunks`, fed to `rows`)."""
        self.lengths[idx] += counts
        self.forward_tokens += int(counts.sum())
        for r, c in zip(rows, chunks):
            if c:
                self.tokens[r] += c
        self._views()

    @torch.no_grad()
    def _forward_block(self, a: int, b: int, rows: list[int], chunks: list[list[int]]) -> None:
        """Rows `a..b-1` in place, `rows` fed their chunks and the others nothing (computed,
        not kept): the block's cache is a view of the batch's buffers, so nothing is gathered;
        transformers writes the new columns after the block's widest row, and each fed row's
        real new tokens are then placed at its own end."""
        span = b - a
        feed = [[] for _ in range(span)]
        for r, c in zip(rows, chunks):
            feed[r - a] = c
        ids, new_mask = self._left_padded(feed)
        width = ids.shape[1]
        lens = self.lengths[a:b].clone()
        Wb = int(lens.max())
        self._room(self.n, Wb + width)
        sub = getattr(self, "_block_cache", None)
        if sub is None:                       # one cache object for every block (views only)
            sub = self._block_cache = _growing_cache(self.model.config)
        for layer, sl in zip(self.cache.layers, sub.layers):
            if not sl.is_initialized:
                sl.lazy_initialization(layer.keys, layer.values)
            _adopt(sl, layer._kbuf[a:b], layer._vbuf[a:b], span, Wb)   # views: written in place
        out = self._model(ids, new_mask, lens, Wb, sub)
        counts = new_mask.sum(1)
        W, W_new = self.width, max(self.width, int((lens + counts).max()))
        block = torch.arange(a, b, device=self.device)
        for layer in self._layers():
            for buf in (layer._kbuf, layer._vbuf):
                if W_new > W:          # the batch widens: the other rows' new columns
                    buf[:a, :, W:W_new].zero_()
                    buf[b:self.n, :, W:W_new].zero_()
                _place(buf, block, lens, buf, block, Wb + width, counts)
        self._keep_outputs(out, block, new_mask[:, -1].bool())
        self._fed(block, counts, rows, chunks)

    def swap(self, i: int, j: int) -> None:
        """Exchange rows i and j (tokens, cache, pending token, last logits and hidden state):
        a driver keeps its running rows together so that their forwards run as a block."""
        if i == j:
            return
        L = max(int(self.lengths[i]), int(self.lengths[j]))
        for layer in self._layers():
            for buf in (layer._kbuf, layer._vbuf):
                tmp = buf[i, :, :L].clone()
                buf[i, :, :L] = buf[j, :, :L]
                buf[j, :, :L] = tmp
        self.lengths[[i, j]] = self.lengths[[j, i]]
        self.pending[i], self.pending[j] = self.pending[j], self.pending[i]
        self.tokens[i], self.tokens[j] = self.tokens[j], self.tokens[i]
        for t in (self.last_logits, self.last_hidden):
            if t is not None:
                t[[i, j]] = t[[j, i]]

    def _keep_outputs(self, out, rows: torch.Tensor, has: torch.Tensor | None) -> None:
        """Keep the last real logits (and hidden states) of `rows` (`has`: which of them got a
        real last token; None: all)."""
        outputs = [("last_logits", out.logits[:, -1, :])]
        if self.keep_hidden:
            outputs.append(("last_hidden", out.hidden_states[-1][:, -1, :]))
        for name, vals in outputs:
            if has is not None:
                vals = vals[has]
            kept = getattr(self, name)    # n rows once it exists (`_new_row`, `keep`)
            if kept is None:              # NaN until a row's first forward
                kept = torch.full((self.n, vals.shape[-1]), float("nan"), dtype=vals.dtype,
                                  device=self.device)
                setattr(self, name, kept)
            kept[rows if has is None else rows[has]] = vals.to(kept.dtype)

    # ------------------------------------------------------------------ rows: fork, add, keep

    def _new_row(self, src: int | None, cols: int) -> int:
        """Append a row holding `src`'s first `cols` columns (None: no tokens); its other
        columns below the width are zeroed (finite: see the class docstring)."""
        n, W = self.n, self.width
        self._room(n + 1, W)
        for layer in self._layers():
            for buf in (layer._kbuf, layer._vbuf):
                if src is not None and cols:
                    buf[n, :, :cols] = buf[src, :, :cols]
                buf[n, :, cols:W] = 0
        self.lengths = torch.cat([self.lengths, self.lengths.new_zeros(1)])
        self.pending.append([])
        self.tokens.append([])
        self.last_logits = _one_more_row(self.last_logits)
        self.last_hidden = _one_more_row(self.last_hidden)
        self.n += 1
        self._views()
        return n

    def add_row(self) -> int:
        return self._new_row(None, 0)

    def _forked_row(self, src_row: int, keep: int) -> int:
        return self._new_row(src_row, keep)

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (renumbered 0.. in the given order), in the same buffers."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        W = int(self.lengths[idx].max()) if rows else 0
        for layer in self._layers():
            for buf in (layer._kbuf, layer._vbuf):
                buf[:len(rows), :, :W] = buf[idx, :, :W]      # the right side is a copy
        self._keep_rows(rows, idx)
        self._views()

    def pack(self) -> None:
        """Nothing to defragment: rows are left-aligned."""


def _attention_mask(model, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """The mask of a forward over cached columns `old` [m, W] (1: a real token) and new chunks
    `new` [m, w] (left-padded): 2-D for transformers to expand, or, for `sdpa` attention, the
    4-D boolean mask [m, 1, w, W + w] itself (transformers uses a 4-D mask as given, which saves
    building it every forward): every query sees the real cached tokens and the real new ones up
    to itself, and itself (a pad query then attends something, so its outputs and the K/V it
    leaves in a masked column stay finite)."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return torch.cat([old, new], dim=1)
    m, w = new.shape
    seen = new.bool()[:, None, :] & torch.ones(w, w, dtype=torch.bool, device=new.device).tril()
    seen |= torch.eye(w, dtype=torch.bool, device=new.device)
    return torch.cat([old.bool()[:, None, :].expand(m, w, old.shape[1]), seen], dim=2)[:, None]


def _one_more_row(t: torch.Tensor | None) -> torch.Tensor | None:
    """`t` [n, X] with one more row of NaN, as a view of a buffer with spare rows (a half more,
    at least 8), so adding a row does not copy the others (a fork per continuation)."""
    if t is None:
        return None
    n = t.shape[0]
    base = t._base if t._base is not None and t._base.dim() == 2 else None
    if base is None or base.shape[0] <= n or base.data_ptr() != t.data_ptr():
        base = t.new_empty((n + 1 + max(8, n // 2), t.shape[1]))
        base[:n] = t
    base[n] = float("nan")
    return base[:n + 1]


def ragged_layout_fits(config) -> bool:
    """Whether `RaggedKVBatch` can hold the model's cache: every layer is a plain
    full-attention layer (sliding windows keep transformers' own cache update, and the holes
    layout of `KVBatch`)."""
    return all(isinstance(layer, _growing_layer_class()) for layer in _growing_cache(config).layers)

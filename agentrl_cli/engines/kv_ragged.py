"""`RaggedKVBatch`: the `hf` engine's KV batch with left-aligned rows (the interface and the
layout with holes: `KVBatch` in `engines/kv_batch.py`).

What `HFEngine.new_batch` gives for a model of plain full-attention layers
(`ragged_layout_fits`): each row's tokens sit in its own first columns, so there are no holes,
nothing to pack, and the mask is derived from the rows' lengths; a forward of some rows
gathers only their first max(their lengths) columns, and a fork copies only its prefix.
"""
from __future__ import annotations

import torch

from .kv_batch import KVBatch
from .kv_cache import adopt, cache_arg, growing_cache, growing_layer_class, new_buffer, with_room


BLOCK_SHARE = 0.6   # the share of a block of rows fed above which the block runs in place


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
            adopt(layer, layer._kbuf, layer._vbuf, self.n, W)

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
            c = kb.shape[2] if kb.shape[2] >= cols else with_room(cols, 64)
            nk, nv = new_buffer(kb, r, c, n, W), new_buffer(vb, r, c, n, W)
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
        sub = growing_cache(self.model.config)
        for layer, sl in zip(self.cache.layers, sub.layers):
            if Wr and getattr(layer, "_kbuf", None) is not None:
                kb, vb = layer._kbuf, layer._vbuf
                sk = kb.new_empty((idx.numel(), kb.shape[1], Wr + width, kb.shape[3]))
                sv = vb.new_empty((idx.numel(), vb.shape[1], Wr + width, vb.shape[3]))
                torch.index_select(kb[:, :, :Wr], 0, idx, out=sk[:, :, :Wr])
                torch.index_select(vb[:, :, :Wr], 0, idx, out=sv[:, :, :Wr])
                sl.lazy_initialization(layer.keys, layer.values)
                adopt(sl, sk, sv, idx.numel(), Wr)
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
                kb = new_buffer(sl.keys, with_room(self.n, 8), with_room(cols, 64), 0, 0)
                vb = new_buffer(sl.values, kb.shape[0], kb.shape[2], 0, 0)
                kb[:self.n, :, :W].zero_()
                vb[:self.n, :, :W].zero_()
                adopt(layer, kb, vb, self.n, W)

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
            sub = self._block_cache = growing_cache(self.model.config)
        for layer, sl in zip(self.cache.layers, sub.layers):
            if not sl.is_initialized:
                sl.lazy_initialization(layer.keys, layer.values)
            adopt(sl, layer._kbuf[a:b], layer._vbuf[a:b], span, Wb)   # views: written in place
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
    return all(isinstance(layer, growing_layer_class()) for layer in growing_cache(config).layers)

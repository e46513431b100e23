"""The `hf` engine's KV batches: batched multi-turn generation with a Hugging Face causal LM on
CPU or GPU (the engine itself: `engines/hf.py`). `KVBatch` here is the interface and the layout
with holes; `RaggedKVBatch` (`engines/kv_ragged.py`) the left-aligned layout; the cache they
grow in place: `engines/kv_cache.py`.

Many episodes decode at once in one batch. Each row is one episode; its KV cache is kept
across the episode's turns: an observation is *appended* (prefilled on top of the cache),
never re-prefilled with the whole history. Explicit position ids count only real tokens, which
makes every row's logits equal to running that row alone (tested).

Two layouts share one interface. `RaggedKVBatch` (what `HFEngine.new_batch` gives for a model
of plain full-attention layers) keeps each row's tokens left-aligned in its own first columns.
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
"""
from __future__ import annotations

from typing import Sequence

import torch

from .base import SamplingParams
from .kv_cache import (adopt, cache_arg, growing_cache, growing_layer_class, in_buffers,
                       new_buffer, reserve, with_room)
from .sampling import sample, sample_rows


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
    adopt(sub_layer, kb, vb, idx.numel(), S)


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


def _row_room(layer) -> tuple[torch.Tensor, torch.Tensor]:
    """Buffers of a growing layer with room for one more row after its current ones (fork and
    add_row append rows): the layer's own when they have a spare row, else new ones with a
    quarter more rows (at least 8) and spare columns, holding the current keys/values (which
    become views of them). Appending a row then writes one row instead of concatenating the
    whole cache and adopting the result into new buffers (two copies per fork)."""
    k, v = layer.keys, layer.values
    n, S = k.shape[0], k.shape[2]
    if in_buffers(layer) and layer._kbuf.shape[0] > n:
        return layer._kbuf, layer._vbuf
    rows, cap = with_room(n, 8) + 1, with_room(S, 64)
    kb = new_buffer(k, rows, cap, n, S)
    vb = new_buffer(v, rows, cap, n, S)
    kb[:n, :, :S] = k
    vb[:n, :, :S] = v
    adopt(layer, kb, vb, n, S)
    return kb, vb


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
        self.cache = growing_cache(model.config)
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
        sub = growing_cache(self.model.config)
        for i, layer in enumerate(self.cache.layers):
            if getattr(layer, "keys", None) is not None and layer.keys.dim() == 4:
                if S and i < len(sub.layers) and isinstance(sub.layers[i], growing_layer_class()):
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
            kb, vb, _ = reserve(layer, self.n, width, nk, nv)
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
            if isinstance(layer, growing_layer_class()) and layer.keys.dim() == 4:
                n, S = layer.keys.shape[0], layer.keys.shape[2]
                kb, vb = _row_room(layer)
                if keys_values is None:
                    kb[n, :, :S] = 0
                    vb[n, :, :S] = 0
                else:                       # views of the source row: different rows, no overlap
                    kb[n, :, :S] = keys_values[i][0][0]
                    vb[n, :, :S] = keys_values[i][1][0]
                adopt(layer, kb, vb, n + 1, S)
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
            if isinstance(layer, growing_layer_class()):
                # into buffers with spare rows and columns: no intermediate copy for the next
                # forward to adopt. They keep at least the old buffers' room: the rows grow back
                # after a pack, and a buffer sized to the packed width had to be regrown (one
                # more copy of the whole cache) within a few dozen tokens. When the old buffers
                # are that room the move stays in them (it reads every source before it writes),
                # so no fresh buffers are allocated and first touched
                k, v = layer.keys, layer.values
                old_rows, old_cols = ((layer._kbuf.shape[0], layer._kbuf.shape[2])
                                      if in_buffers(layer) else (0, 0))
                rows = max(with_room(k.shape[0], 8), old_rows)
                cap = max(with_room(width, 64), old_cols)
                if (rows, cap) == (old_rows, old_cols):
                    kb, vb = layer._kbuf, layer._vbuf
                else:
                    kb = new_buffer(k, rows, cap, self.n, width)
                    vb = new_buffer(v, rows, cap, self.n, width)
                if in_buffers(layer):
                    _move_columns(layer._kbuf, kb, idx, self.n)
                    _move_columns(layer._vbuf, vb, idx, self.n)
                else:
                    torch.gather(k, 2, g, out=kb[:self.n, :, :width])
                    torch.gather(v, 2, g, out=vb[:self.n, :, :width])
                adopt(layer, kb, vb, self.n, width)
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

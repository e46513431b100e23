"""The `hf` engine: batched multi-turn generation with a Hugging Face causal LM on CPU or GPU.

Many episodes decode at once in one `KVBatch`. Each row is one episode; its KV cache is kept
across the episode's turns: an observation is *appended* (prefilled on top of the cache),
never re-prefilled with the whole history. Rows grow by different amounts, so the batch's cache
has holes; the 2-D attention mask marks them and explicit position ids count only real tokens,
which makes every row's logits equal to running that row alone (tested).

The last token a row sampled is not fed to the model until the row's next chunk arrives (it is
prepended to it), so a turn costs no forward pass after its stop token.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..registry import Registry


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0      # logits are divided by it; log-probs are of that distribution
    top_p: float = 1.0            # nucleus filter applied when sampling (log-probs ignore it)
    max_new_tokens: int = 40      # most tokens in one assistant message
    greedy: bool = False          # argmax instead of sampling


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None):
    """logits [R, V] -> (tokens [R], logprobs [R]) under softmax(logits / temperature)."""
    logits = logits.float()
    if params.greedy:
        logp = torch.log_softmax(logits, dim=-1)
        tok = logp.argmax(-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits / params.temperature, dim=-1)
    probs = logp.exp()
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        keep = (sorted_p.cumsum(-1) - sorted_p) < params.top_p
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


class KVBatch:
    """`n_rows` growing token sequences sharing one KV cache; a row may sit idle."""

    def __init__(self, model, n_rows: int, pad_id: int, device: torch.device | str = "cpu"):
        from transformers import DynamicCache

        self.model = model
        self.n = n_rows
        self.pad_id = pad_id
        self.device = torch.device(device)
        self.cache = DynamicCache(config=model.config)
        self.mask = torch.zeros(n_rows, 0, dtype=torch.long, device=self.device)
        self.lengths = torch.zeros(n_rows, dtype=torch.long, device=self.device)  # real tokens fed
        self.pending: list[list[int]] = [[] for _ in range(n_rows)]  # sampled, not yet fed
        self.last_logits: torch.Tensor | None = None  # [n_rows, V] next-token logits per row
        self.forward_tokens = 0   # real tokens fed (prefill + decode), for throughput reports

    @torch.no_grad()
    def _forward(self, chunks: list[list[int]]) -> None:
        """Feed each row its chunk (left-padded to a common length); keep last real logits."""
        width = max(len(c) for c in chunks)
        if width == 0:
            return
        ids = torch.full((self.n, width), self.pad_id, dtype=torch.long)
        new_mask = torch.zeros(self.n, width, dtype=torch.long)
        for r, c in enumerate(chunks):
            if c:
                ids[r, width - len(c):] = torch.tensor(c, dtype=torch.long)
                new_mask[r, width - len(c):] = 1
        ids, new_mask = ids.to(self.device), new_mask.to(self.device)
        pos = (self.lengths[:, None] + new_mask.cumsum(1) - 1).clamp(min=0)
        self.mask = torch.cat([self.mask, new_mask], dim=1)
        out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=pos,
                         cache=self.cache, use_cache=True)
        logits = out.logits[:, -1, :]
        has = new_mask[:, -1].bool()
        if self.last_logits is None:
            self.last_logits = torch.zeros_like(logits)
        self.last_logits[has] = logits[has].to(self.last_logits.dtype)
        self.lengths += new_mask.sum(1)
        self.forward_tokens += int(new_mask.sum())

    def extend(self, chunks: list[list[int] | None]) -> None:
        """Append tokens to rows (None or [] = nothing). A row's pending sampled token goes first."""
        full = []
        for r, c in enumerate(chunks):
            if c is None:
                full.append([])
            else:
                full.append(self.pending[r] + list(c))
                self.pending[r] = []
        self._forward(full)

    def generate(self, rows: list[int], params: SamplingParams, stop_ids: tuple[int, ...],
                 generator: torch.Generator | None = None) -> tuple[list[list[int]], list[list[float]]]:
        """Decode one assistant message for each row in `rows` (others idle).

        Returns the generated ids (stop token included when produced) and their log-probs.
        """
        out_ids: dict[int, list[int]] = {r: [] for r in rows}
        out_lp: dict[int, list[float]] = {r: [] for r in rows}
        active = list(rows)
        stop = torch.tensor(stop_ids, dtype=torch.long)
        while active:
            idx = torch.tensor(active, dtype=torch.long, device=self.device)
            tok, lp = sample(self.last_logits[idx], params, generator)
            tok, lp = tok.cpu(), lp.cpu()
            feed: list[list[int] | None] = [None] * self.n
            still = []
            for j, r in enumerate(active):
                t = int(tok[j])
                out_ids[r].append(t)
                out_lp[r].append(float(lp[j]))
                if bool((stop == t).any()) or len(out_ids[r]) >= params.max_new_tokens:
                    self.pending[r] = [t]
                else:
                    feed[r] = [t]
                    still.append(r)
            if still:
                self._forward([c or [] for c in feed])
            active = still
        return [out_ids[r] for r in rows], [out_lp[r] for r in rows]


class HFEngine:
    """Wraps a policy model for the rollout runner (`new_batch` makes a KVBatch)."""

    name = "hf"

    def __init__(self, model, pad_id: int, device: torch.device | str = "cpu"):
        self.model = model
        self.pad_id = pad_id
        self.device = torch.device(device)

    def new_batch(self, n_rows: int) -> KVBatch:
        return KVBatch(self.model, n_rows, self.pad_id, self.device)


ENGINES: Registry[type] = Registry("engine")
ENGINES.register("hf", HFEngine)

"""The Engine protocol: what the rollout code may ask of a generation engine, and `ENGINES`.

An engine turns token ids into sampled token ids and their log-probs. `new_batch(n)` gives `n`
rows (one per episode) that grow by `extend` (prompt, observations) and `generate` (one
assistant message per row, with the log-prob of every sampled token under
softmax(logits / temperature): the distribution the trainer scores).

What else an engine can do is declared, never probed:
- `token_level = True` (`hf`): its batch is a `ForkableBatch`: the rows share a KV cache that
  can be forked at a prefix (FOCUS continuations), cut back (context resets), compacted, and
  expose next-token logits. `False` (`vllm`): whole turns only; the path scheduler drives it
  one request per turn (`sampling`, `add_request`, `step`, `abort`: `rollout/vllm_paths.py`).
- `load_weights(weights)` puts the trainer's new weights into the engine after an update;
  `release()` frees the engine's memory for the update (a no-op unless the engine holds any).
- `check_available()` fails fast (one-line `ConfigError`) when the engine cannot run here;
  `from_config(cfg, model, fmt)` builds it for a run (`engines.build_engine` calls it).

The built-in engines register in `engines/__init__.py`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from ..registry import Registry


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0      # logits are divided by it; log-probs are of that distribution
    top_p: float = 1.0            # nucleus filter applied when sampling (log-probs ignore it)
    max_new_tokens: int = 40      # most tokens in one assistant message
    greedy: bool = False          # argmax instead of sampling


class EngineBatch(Protocol):
    """Rows of token sequences an engine decodes together (one row = one episode)."""

    n: int                          # rows
    tokens: list[list[int]]         # every row's tokens so far
    forward_tokens: int             # tokens processed (prefill + decode), for throughput reports
    keep_hidden: bool               # also keep each row's last hidden state (token-level only)

    def extend(self, chunks: list[list[int] | None], only_fed: bool = False) -> None:
        """Append `chunks[r]` to row r (None or [] = nothing)."""

    def generate(self, rows: list[int], params: SamplingParams, stop_ids: tuple[int, ...],
                 generator=None) -> tuple[list[list[int]], list[list[float]]]:
        """One assistant message for each row in `rows` -> (token ids, their log-probs) per row;
        `generator`: one torch generator, or one per row."""


class ForkableBatch(EngineBatch, Protocol):
    """The batch of a `token_level` engine: a shared KV cache with per-row next-token logits."""

    last_logits: torch.Tensor | None   # [n, V] next-token logits per row
    lengths: torch.Tensor              # [n] real tokens fed per row

    def add_row(self) -> int:
        """Append an empty row; returns its index."""

    def fork(self, src_row: int, prefix_len: int) -> int:
        """Append a row holding row `src_row`'s first `prefix_len` tokens (cache copied)."""

    def truncate(self, row: int, prefix_len: int) -> None:
        """Cut row `row` back to its first `prefix_len` tokens, in place."""

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (renumbered 0.. in the given order)."""

    def pack(self) -> None:
        """Defragment the cache (rows keep their tokens)."""


class Engine:
    """The base of every engine: the capabilities it declares and the defaults of the optional
    operations (see the module docstring)."""

    name: ClassVar[str] = ""
    token_level: ClassVar[bool] = True   # new_batch gives a ForkableBatch

    @staticmethod
    def check_available() -> None:
        """Raise a one-line ConfigError when this engine cannot run here (nothing by default)."""

    @classmethod
    def from_config(cls, cfg, model, fmt) -> "Engine":
        """The engine of a run's config for `model` (on the model's device by default)."""
        return cls(model, fmt.pad_id, next(model.parameters()).device)

    def new_batch(self, n_rows: int) -> EngineBatch:
        raise NotImplementedError

    def load_weights(self, weights) -> None:
        """New policy weights (a module or a state dict) into the engine."""
        raise NotImplementedError

    def release(self) -> None:
        """Free the engine's memory for the trainer's update (nothing by default)."""


ENGINES: Registry[type[Engine]] = Registry("engine")

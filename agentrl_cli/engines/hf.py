"""The `hf` engine: batched multi-turn generation with a Hugging Face causal LM on CPU or GPU.

`HFEngine` wraps the policy model; its batches are the KV-batch layouts
(`engines/kv_ragged.py`'s `RaggedKVBatch` for a model of plain full-attention layers, else
`engines/kv_batch.py`'s `KVBatch`), which sample with `engines/sampling.py`.
"""
from __future__ import annotations

import torch

from .base import Engine
from .kv_batch import KVBatch
from .kv_ragged import RaggedKVBatch, ragged_layout_fits


class HFEngine(Engine):
    """Wraps a policy model for the rollout runner (`new_batch` makes a KVBatch)."""

    name = "hf"
    token_level = True

    def __init__(self, model, pad_id: int, device: torch.device | str = "cpu"):
        self.model = model
        self.pad_id = pad_id
        self.device = torch.device(device)
        self.ragged: bool | None = None      # the batch layout (None: chosen at the first batch)

    def new_batch(self, n_rows: int) -> KVBatch:
        """A `RaggedKVBatch` when the model's cache layers allow it, else a `KVBatch`."""
        if self.ragged is None:
            self.ragged = ragged_layout_fits(self.model.config)
        cls = RaggedKVBatch if self.ragged else KVBatch
        return cls(self.model, n_rows, self.pad_id, self.device)

    def load_weights(self, weights) -> None:
        """The trainer's model itself (an engine in the trainer's process shares it): nothing to
        do; another module or a state dict (a rollout worker's copy): loaded into the model."""
        if weights is self.model:
            return
        state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
        self.model.load_state_dict(state, strict=False)

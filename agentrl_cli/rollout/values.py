"""Critic values V(s) at token positions: the one implementation the FOCUS drivers (in process
and the path scheduler) and the diagnostics read.

The state before token `p` of a sequence is its tokens `[0, p)`, in the context windows the
engine generated them in (`context.windows`); its value is the critic on the hidden state of
token `p - 1`: the policy's last hidden state for a value head (`models.critic`), the separate
critic's own model's for a separate critic. The trainer's forward pass (`train.batch.forward`)
places the same value at position `p` of its [B, L] value tensor.

- `critic_values`: one forward over right-padded sequences, the critic on the gathered rows.
- `head_values`: the critic on hidden states already at hand (the in-process FOCUS runner
  reads its KV batch's last hidden states, so a value head costs no extra forward).
- `CriticValues`: `critic_values` with a model and critic bound (the path scheduler's).

Without a critic every value is 0.5, what an untrained value head outputs (its bias).
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..context.windows import window_index
from ..models.critic import critic_hidden, is_separate
from ..models.sequences import hidden_states
from ..types import Episode

NO_CRITIC = 0.5  # V(s) without a critic: the untrained value head's output


@torch.no_grad()
def head_values(critic: torch.nn.Module, h: torch.Tensor) -> list[float]:
    """The critic's values of hidden states `h` [N, H] (the hidden states it reads)."""
    return critic(h.float()).squeeze(-1).float().tolist()


def _padded(seqs: list[list[int]], windows: list[list[int]] | None):
    """Right-padded ids [B, L] (pad 0), attention mask [B, L], and the window index [B, L]
    (None when no sequence's context was reset)."""
    n = torch.tensor([len(s) for s in seqs])
    ids = torch.zeros(len(seqs), int(n.max()), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
    attn = (torch.arange(ids.shape[1])[None] < n[:, None]).long()
    win = None
    if windows is not None and any(windows):
        win = torch.zeros_like(ids)
        for i, w in enumerate(windows):
            if w:
                win[i, :len(w)] = torch.tensor(w, dtype=torch.long)
    return ids, attn, win


def _hidden(model, critic, ids: torch.Tensor, attn: torch.Tensor, win) -> torch.Tensor:
    """The hidden states the critic reads (a value head: the policy's, in eval mode)."""
    if is_separate(critic):
        dev = next(critic.parameters()).device
        return critic_hidden(critic, None, ids.to(dev), attn.to(dev),
                             None if win is None else win.to(dev))
    dev = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        return hidden_states(model, ids.to(dev), attn.to(dev), None if win is None else win.to(dev))
    finally:
        model.train(was_training)


@torch.no_grad()
def critic_values(model, critic, seqs: Sequence[Episode | list[int]],
                  positions: list[list[int]]) -> list[list[float]]:
    """Per sequence, V of the state before each of its `positions` (1 <= p <= len). `seqs`:
    episodes (their context windows apply) or plain token ids (one window). `model`: the
    policy, whose hidden states a value head reads (unused for a separate critic). One forward
    over the sequences that have positions; the critic runs once on all the gathered rows."""
    if critic is None:
        return [[NO_CRITIC] * len(p) for p in positions]
    out: list[list[float]] = [[] for _ in seqs]
    todo = [i for i, p in enumerate(positions) if p]
    if not todo:
        return out
    ids = [seqs[i].token_ids if isinstance(seqs[i], Episode) else list(seqs[i]) for i in todo]
    for i, s in zip(todo, ids):
        if not all(1 <= p <= len(s) for p in positions[i]):
            raise ValueError(f"positions must lie in [1, {len(s)}], got {positions[i]}")
    windows = [window_index(seqs[i]) if isinstance(seqs[i], Episode) else [] for i in todo]
    h = _hidden(model, critic, *_padded(ids, windows))
    rows = torch.tensor([j for j, i in enumerate(todo) for _ in positions[i]], device=h.device)
    cols = torch.tensor([p - 1 for i in todo for p in positions[i]], device=h.device)
    vals = head_values(critic, h[rows, cols])
    k = 0
    for i in todo:
        out[i], k = vals[k:k + len(positions[i])], k + len(positions[i])
    return out


class CriticValues:
    """`critic_values` with the trainer's model and critic bound: the path scheduler's V(s) of
    FOCUS nodes, one forward over the finished episodes (a node at position p: its context is
    the episode's first p tokens)."""

    def __init__(self, model, critic):
        self.model, self.critic = model, critic

    def __call__(self, episodes: list[Episode], positions: list[list[int]]) -> list[list[float]]:
        return critic_values(self.model, self.critic, episodes, positions)

"""TRACE's preparer: the frozen reference model's confidence in the gold answer after every
tool-call boundary (docs/methods.md), batched.

For episode b with turns 0..T_b (the last turn is the final answer, or the turn at which a limit
cut the episode), the boundary states are `S_k = token_ids[:turns[k].start]`, `k = 0..T_b`:
`S_0` is the task prompt, `S_k` ends with the assistant header that follows the k-th
observation, and `S_{T_b}` is the state the final turn was generated from. Under a context
operator `S_k` is the context the policy saw there (prompt + current window, `visible_ids`). After each `S_k` the
gold answer is teacher-forced as the policy would write it: `algo.trace_answer` with
`{answer}` replaced by `Episode.answer` (default `answer({answer})`, the search env's final
call), tokenised by the chat format (`fmt.encode`), without the stop token. The "format" tokens
`answer(` are part of y*: how ready the reference is to answer with the gold entity is the
signal. `l_k` is the mean log-prob of those tokens at temperature 1 (the reference's own
distribution, not the sampling temperature).

Batching: all `sum_b (T_b + 1)` rows `[S_k + y*]` of a step are sorted by length, right-padded
and run through the reference in micro-batches of at most `train.max_tokens_per_microbatch`
padded tokens. (Prefixes of one episode share most of their tokens; reusing their KV cache
would save compute and is left for later.)

Adds to the batch's payload a `credit.estimators.TraceReference`: `mean_logprobs`
[B, max T_b + 1] (0 beyond T_b) and `num_turns` [B] long (= number of turns, T_b + 1).
"""
from __future__ import annotations

import torch

from ...credit.estimators import TraceReference
from ...errors import ConfigError
from ...context.windows import visible_ids
from ...models.sequences import hidden_states, logprobs_from_hidden
from ...types import Episode
from .base import PREPARERS


def boundary_rows(episodes: list[Episode], answer_ids: list[list[int]]) -> list[tuple[int, int, list[int], int]]:
    """(episode, k, ids of S_k + y*, len(S_k)) for every boundary of every episode."""
    rows = []
    for b, ep in enumerate(episodes):
        for k, turn in enumerate(ep.turns):
            prefix = visible_ids(ep, turn.start)
            rows.append((b, k, prefix + answer_ids[b], len(prefix)))
    return rows


@torch.no_grad()
def answer_mean_logprobs(model, rows: list[list[int]], starts: list[int], pad_id: int,
                         max_tokens: int) -> list[float]:
    """Mean log-prob of `row[start:]` given `row[:start]` for each row, in length-sorted,
    right-padded micro-batches of at most `max_tokens` padded tokens (one row at least)."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    out = [0.0] * len(rows)
    i = 0
    while i < len(order):
        j = i + 1
        while j < len(order) and len(rows[order[j]]) * (j + 1 - i) <= max_tokens:
            j += 1
        chunk = order[i:j]
        width = len(rows[chunk[-1]])
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        attn = torch.zeros(len(chunk), width, dtype=torch.long)
        for r, idx in enumerate(chunk):
            ids[r, :len(rows[idx])] = torch.tensor(rows[idx])
            attn[r, :len(rows[idx])] = 1
        dev = next(model.parameters()).device
        lp = logprobs_from_hidden(model, hidden_states(model, ids.to(dev), attn.to(dev)),
                                  ids.to(dev), 1.0).float().cpu()  # [b, width-1]: token t+1
        for r, idx in enumerate(chunk):
            s, n = starts[idx], len(rows[idx])
            out[idx] = float(lp[r, s - 1:n - 1].mean())
        i = j
    return out


@PREPARERS.register("trace", reads=("algo.trace_answer",))
def prepare_trace(learner, batch, episodes: list[Episode], fmt, cfg) -> None:
    """Fill TRACE's reference log-probs (see the module docstring)."""
    model = learner.reference
    if model is None:
        raise ConfigError("estimator 'trace' needs a frozen reference model: use --method trace")
    template = cfg.algo.trace_answer
    answers = [fmt.encode(template.replace("{answer}", ep.answer)) for ep in episodes]
    if any(not a for a in answers):
        raise ConfigError("estimator 'trace' needs a non-empty gold answer for every task")
    rows = boundary_rows(episodes, answers)
    means = answer_mean_logprobs(model, [r[2] for r in rows], [r[3] for r in rows], fmt.pad_id,
                                 cfg.train.max_tokens_per_microbatch)
    num_turns = torch.tensor([ep.num_turns for ep in episodes], dtype=torch.long)
    table = torch.zeros(len(episodes), max(int(num_turns.max()), 1))
    for (b, k, _, _), m in zip(rows, means):
        table[b, k] = m
    batch.payload.add(TraceReference(table, num_turns))

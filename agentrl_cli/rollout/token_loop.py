"""The per-token loop of path rollouts on the `hf` engine, shared by the in-process FOCUS runner
(`rollout.focus.FocusRunner`) and the path executor of the path scheduler
(`rollout.executors.HFPathExecutor`, in process or on Ray workers), so both get the same engine
work and the same context operators.

Continuous batching over one growing `KVBatch`: each tick feeds every running path its next
input (a decode token, an observation, a prompt, a refed prefix token) in at most two forwards
(`extend(only_fed=True)`), then samples one token per running path from the path's own
generator. A path whose turn ends is stepped in its env through `runner.advance`, which lets the
env's context operator (if any) decide what comes next; on a context reset the row is cut back
to the task prompt (`KVBatch.truncate`). A path starts from a stored context by forking a row
that still holds it (`KVBatch.fork`: K/V copied, one token refed), else by prefilling its
visible context (prompt + current window). Finished rows stay parked as fork sources until the
batch holds more than twice `share` rows (`planner.compact_rows`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..context.episode import LiveEpisode, append_turn
from ..context.windows import visible_ids, visible_len
from ..engines.base import SamplingParams
from ..engines.sampling import sample_rows
from ..models.chat import ChatFormat
from ..types import Episode
from .planner import compact_rows
from .runner import advance


@dataclass
class LoopPath:
    """A path's engine state: its live episode, generator, KV row and the turn in progress."""

    live: LiveEpisode
    gen: torch.Generator
    row: int | None = None          # KVBatch row (None: not in the batch)
    feed: list[int] | None = None   # input of the next tick
    turn_ids: list[int] = field(default_factory=list)
    turn_lps: list[float] = field(default_factory=list)


@dataclass
class TurnEnd:
    """A path's turn ended this tick: `finished`, or it goes on with its observation fed next
    tick; `boundary`: its context now ends at a new segment-boundary state (a tree node)."""

    path: LoopPath
    finished: bool
    boundary: bool


def holds_context(other: Episode, ep: Episode) -> bool:
    """The row of `other` (a path through the state `ep` resumes from) still holds `ep`'s visible
    context: `other` has not reset its context since (a reset keeps the prompt only)."""
    return (len(other.window_starts) == len(ep.window_starts)
            or visible_len(ep) <= ep.window_prefix)


class TokenLoop:
    """Paths on one `KVBatch` (module docstring). Drivers `start` paths, call `tick` while any
    run, and `park` finished ones."""

    def __init__(self, engine, fmt: ChatFormat, params: SamplingParams, max_tokens: int,
                 share: int, keep_hidden: bool = False):
        self.engine, self.fmt, self.params, self.max_tokens = engine, fmt, params, max_tokens
        self.share = max(1, share)
        self.stop = set(fmt.stop_ids)
        self.kv = engine.new_batch(0)
        self.kv.keep_hidden = keep_hidden
        self.kv.row_hint = 2 * self.share + 1     # running and parked rows (`compact_rows`)
        self.parked: list[LoopPath] = []
        # a ragged batch keeps the running paths' rows together, in rows [0, front), so that
        # their forwards run as one block in place instead of gathering their cache: a started
        # path takes the lowest row a finished one left inside the block (`idle`), else the
        # row after it; the block shrinks when its last row finishes
        self.together = bool(getattr(self.kv, "ragged", False))
        self.owner: list[LoopPath | None] = []   # row -> its path
        self.front = 0
        self.idle: set[int] = set()              # rows < front that hold parked paths
        # continuations started (paths given `sources`): by a fork, or by prefilling the prefix
        # because no source row held it any more; and the tokens those prefills fed
        self.forked, self.refilled, self.refill_tokens = 0, 0, 0

    def start(self, path: LoopPath, sources: list[LoopPath] = ()) -> None:
        """Give `path` a row for its episode's visible context: a fork of the first of
        `sources` (paths through the same state) whose row still holds it, else a new row
        that prefills it."""
        ep = path.live.ep
        n = visible_len(ep)
        src = next((q.row for q in sources if q.row is not None
                    and holds_context(q.live.ep, ep) and int(self.kv.lengths[q.row]) >= n), None)
        if src is not None:
            path.row, path.feed = self.kv.fork(src, n), []   # refeeds the prefix's last token
            self.forked += 1
        else:
            path.row, path.feed = self.kv.add_row(), visible_ids(ep)
            if sources:
                self.refilled += 1
                self.refill_tokens += n
        if self.together:
            self.owner.append(path)
            if self.idle:
                slot = min(self.idle)
                self.idle.remove(slot)
            else:
                slot, self.front = self.front, self.front + 1
            self._swap(path.row, slot)

    def _swap(self, i: int, j: int) -> None:
        """Exchange two rows of the batch and of the paths that own them."""
        if i == j:
            return
        self.kv.swap(i, j)
        pi, pj = self.owner[i], self.owner[j]
        self.owner[i], self.owner[j] = pj, pi
        for p, row in ((pi, j), (pj, i)):
            if p is not None:
                p.row = row

    def tick(self, running: list[LoopPath],
             after_feed: Callable[[], None] | None = None) -> list[TurnEnd]:
        """Feed every running path its input, call `after_feed` (the rows' last hidden states
        are then current: node values), sample one token per path; -> the turns that ended."""
        kv = self.kv
        chunks: list[list[int] | None] = [None] * kv.n
        for p in running:
            chunks[p.row], p.feed = p.feed, None
        kv.extend(chunks, only_fed=True)
        if after_feed is not None:
            after_feed()
        idx = torch.tensor([p.row for p in running], dtype=torch.long)
        tok, lp = sample_rows(kv.last_logits[idx], self.params, [p.gen for p in running])
        ends = []
        for p, t, l in zip(running, tok.tolist(), lp.tolist()):
            p.turn_ids.append(t)
            p.turn_lps.append(l)
            if t not in self.stop and len(p.turn_ids) < self.params.max_new_tokens:
                p.feed = [t]
                continue
            kv.pending[p.row] = [t]
            ends.append(self._end_turn(p))
        return ends

    def _end_turn(self, p: LoopPath) -> TurnEnd:
        ids, lps, p.turn_ids, p.turn_lps = p.turn_ids, p.turn_lps, [], []
        turn = append_turn(p.live.ep, ids, lps, self.fmt.decode_action(ids))
        obs, boundary, reset = advance(p.live, self.fmt, turn, self.max_tokens,
                                       self.params.max_new_tokens)
        if reset:
            self.kv.truncate(p.row, p.live.ep.window_prefix)
        p.feed = obs
        return TurnEnd(p, obs is None, obs is not None and boundary)

    def park(self, p: LoopPath) -> None:
        """A finished path: its row stays as a fork source until compaction drops it."""
        self.parked.append(p)
        if self.together:
            self.idle.add(p.row)
            while self.front and self.front - 1 in self.idle:
                self.front -= 1
                self.idle.remove(self.front)

    def compact(self, running: list[LoopPath]) -> None:
        n = self.kv.n
        self.parked = compact_rows(self.kv, running, self.parked, self.share)
        if self.together and self.kv.n != n:     # rows dropped and renumbered (order kept)
            self.owner = [None] * self.kv.n
            for q in running + self.parked:
                if q.row is not None:
                    self.owner[q.row] = q
            self.front = 1 + max((q.row for q in running), default=-1)
            self.idle = {q.row for q in self.parked if q.row is not None and q.row < self.front}

"""Context windows of a stored episode: what the policy saw when it generated each token.

An episode under a context operator is still ONE token sequence (token-in, token-out): every
token generated or fed is stored in order. A context reset starts a new *window* at
`Episode.window_starts[w - 1]`; a token of window `w` was generated (or fed) with only the
shared prefix (`Episode.window_prefix` tokens: the task prompt) and the earlier tokens of
window `w` in context, at positions that continue from the prefix. Window 0 starts right after
the prefix. An episode without resets is one window: everything is visible, as without an
operator.
"""
from __future__ import annotations

import bisect

from ..types import Episode


def window_of(ep: Episode, position: int) -> int:
    """Window number of the token at `position` (the number of resets at or before it)."""
    return bisect.bisect_right(ep.window_starts, position)


def visible_ids(ep: Episode, end: int | None = None) -> list[int]:
    """The context the policy conditions on when generating the token at `end` (default: the
    next token): the prefix plus the tokens of `end`'s window before `end`."""
    end = len(ep.token_ids) if end is None else end
    w = window_of(ep, end)
    if w == 0:
        return ep.token_ids[:end]
    return ep.token_ids[:ep.window_prefix] + ep.token_ids[ep.window_starts[w - 1]:end]


def visible_len(ep: Episode, end: int | None = None) -> int:
    """`len(visible_ids(ep, end))` without building the list."""
    end = len(ep.token_ids) if end is None else end
    w = window_of(ep, end)
    if w == 0:
        return end
    return ep.window_prefix + end - ep.window_starts[w - 1]


def window_index(ep: Episode) -> list[int]:
    """Per token: -1 on the shared prefix, else its window number; [] for a one-window episode
    (the plain causal forward is then exact)."""
    if not ep.window_starts:
        return []
    out = [-1] * ep.window_prefix + [0] * (len(ep.token_ids) - ep.window_prefix)
    for w, s in enumerate(ep.window_starts, start=1):
        out[s:] = [w] * (len(ep.token_ids) - s)
    return out


def inherit_windows(ep: Episode, src: Episode, position: int) -> None:
    """`ep` stores `src.token_ids[:position]` and `src`'s turns before it: give it `src`'s
    context bookkeeping up to there (resets and summary turns before `position` only)."""
    if not src.context:
        return
    ep.context, ep.window_prefix = src.context, src.window_prefix
    ep.window_starts = [s for s in src.window_starts if s < position]
    ep.meta.context_resets = len(ep.window_starts)
    if src.meta.summary_turns is not None:
        ep.meta.summary_turns = [k for k in src.meta.summary_turns if k < ep.num_turns]


def resume_from_visible(ep: Episode, src: Episode) -> None:
    """`ep` stores only `visible_ids(src, position)` (e.g. a value continuation, never trained):
    one window holding the same context, with `src`'s prefix (a later reset keeps only that)."""
    ep.context, ep.window_prefix, ep.window_starts = src.context, src.window_prefix, []

"""The context operators (docs/methods.md): what happens after each policy turn once the visible
context passes `context.threshold_tokens`.

Both operators shorten the context the same way, by a *reset*: a new window starts (see
`context.windows`) whose visible context is the task prompt, a copy of the policy's last
message (its stop token included) and one env message. The copy and the message are harness
tokens (response_mask 0), stored after everything else (token-in, token-out); the engine row is
cut back to the prompt (`KVBatch.truncate`) and fed them, so their KV is computed under the new
context. Segments follow windows under either operator: a reset is a segment boundary (FOCUS
nodes, vine states, `segment_index`), and nothing else is. The trigger compares the visible
context plus the next observation with the threshold; `rollout.max_tokens` still bounds the
whole stored episode.

- `compaction`: the observation that crosses the threshold is followed (in the same env message)
  by a request to summarise, free-form or in four sections (`context.style`). The policy's next
  message is the summary: an ordinary policy turn (trained, its own turn and segment index;
  `turn.tool` None, and the env does not see it; `Episode.meta.summary_turns`). Then the context is
  reset with the summary as the carried message and a short note.
- `workspace`: the env also offers put/get/scan/delete over an in-memory store
  (`context.workspace`). When the observation would cross the threshold, the context is reset
  right away: the carried message is the policy's last call, and the env message tells it that
  older turns were removed, lists the workspace keys, and holds the call's observation. What the
  agent wants to keep must be in the workspace; no summary is written.
"""
from __future__ import annotations

from ..types import Turn
from .envs import ContextEnv
from .episode import append_observation, step_env
from .windows import visible_len
from .workspace import WorkspaceEnv

FREE = ("Your context is almost full. Summarize what you need to finish the task: what you "
        "found and what to do next. Earlier turns will be replaced by your summary.")
STRUCTURED = ("Your context is almost full. Summarize in four sections, one line each:\n"
              "Goal: ...\nFacts found: ...\nOpen leads: ...\nNext step: ...\n"
              "Earlier turns will be replaced by your summary.")
AFTER_SUMMARY = "Earlier turns were removed; your summary above replaces them. Continue."
AFTER_RESET = "Earlier turns were removed to free context."
STYLES = {"free": FREE, "structured": STRUCTURED}


class ContextOperator:
    """Decides, after each policy turn, what the episode's engine row is fed next.

    `advance(live, fmt, turn, max_tokens, max_new_tokens)` returns
    `(chunk or None when the episode ended, boundary, reset)` like `rollout.runner.advance`.
    Stateless: per-episode state lives on the `LiveEpisode` (`summarizing`) and on the env.
    """

    name = ""

    def __init__(self, threshold_tokens: int, style: str = "free"):
        if threshold_tokens < 1:
            raise ValueError(f"threshold_tokens must be >= 1, got {threshold_tokens}")
        self.threshold = int(threshold_tokens)
        self.style = style

    def make_env(self, inner):
        """The env an episode runs in (the wrapper carries this operator)."""
        return ContextEnv(inner, self)

    def crosses(self, live, obs_ids: list[int]) -> bool:
        """The visible context plus `obs_ids` would pass the threshold."""
        return visible_len(live.ep) + len(obs_ids) > self.threshold

    def advance(self, live, fmt, turn: Turn, max_tokens: int, max_new_tokens: int):
        raise NotImplementedError


def _fits(live, n_new: int, max_tokens: int, max_new_tokens: int) -> bool:
    """`n_new` more tokens and one more turn fit in `max_tokens`; else the episode ends there."""
    if len(live.ep.token_ids) + n_new + max_new_tokens > max_tokens:
        live.done, live.ep.finish = True, "max_tokens"
        return False
    return True


def reset_context(live, fmt, turn: Turn, message: str, text: str, max_tokens: int,
                  max_new_tokens: int) -> list[int] | None:
    """Start a new window after `turn`: returns its first chunk (a copy of `turn`'s ids, a stop
    token added if it was cut, then the env message `message`), stored as harness tokens and
    recorded as the turn's observation (`text`); None when it does not fit (`max_tokens`)."""
    ep = live.ep
    copy = ep.token_ids[turn.start:turn.end]
    if copy[-1] not in fmt.stop_ids:
        copy = copy + [fmt.stop_ids[0]]
    chunk = copy + fmt.observation_ids(message)
    if not _fits(live, len(chunk), max_tokens, max_new_tokens):
        return None
    ep.window_starts.append(len(ep.token_ids))
    append_observation(ep, turn, chunk, text)
    ep.meta.context_resets = (ep.meta.context_resets or 0) + 1
    return chunk


class Compaction(ContextOperator):
    """The policy summarises, the summary replaces the history (module docstring)."""

    name = "compaction"

    def __init__(self, threshold_tokens: int, style: str = "free"):
        if style not in STYLES:
            raise ValueError(f"unknown compaction style '{style}'; valid: {', '.join(STYLES)}")
        super().__init__(threshold_tokens, style)
        self.request = STYLES[style]

    def advance(self, live, fmt, turn: Turn, max_tokens: int, max_new_tokens: int):
        ep = live.ep
        if live.summarizing:          # `turn` is the summary: not an action for the env
            live.summarizing = False
            ep.meta.summary_turns = [*(ep.meta.summary_turns or []), ep.num_turns - 1]
            chunk = reset_context(live, fmt, turn, AFTER_SUMMARY, AFTER_SUMMARY, max_tokens,
                                  max_new_tokens)
            return chunk, chunk is not None, chunk is not None
        res = step_env(live, turn)
        if res is None:
            return None, False, False
        obs_ids = fmt.observation_ids(res.observation)
        ask = self.crosses(live, obs_ids)
        if ask:
            obs_ids = fmt.observation_ids(res.observation + "\n\n" + self.request)
        if not _fits(live, len(obs_ids), max_tokens, max_new_tokens):
            return None, False, False
        append_observation(ep, turn, obs_ids, res.observation)
        live.summarizing = ask
        return obs_ids, False, False


class Workspace(ContextOperator):
    """Workspace tools; the context is reset at the threshold (module docstring)."""

    name = "workspace"

    def make_env(self, inner):
        return WorkspaceEnv(inner, self)

    def advance(self, live, fmt, turn: Turn, max_tokens: int, max_new_tokens: int):
        res = step_env(live, turn)
        if res is None:
            return None, False, False
        obs_ids = fmt.observation_ids(res.observation)
        if self.crosses(live, obs_ids):
            keys = ", ".join(sorted(live.env.store)) or "(none)"
            message = f"{AFTER_RESET} Workspace keys: {keys}.\n\n{res.observation}"
            chunk = reset_context(live, fmt, turn, message, res.observation, max_tokens,
                                  max_new_tokens)
            return chunk, chunk is not None, chunk is not None
        if not _fits(live, len(obs_ids), max_tokens, max_new_tokens):
            return None, False, False
        append_observation(live.ep, turn, obs_ids, res.observation)
        return obs_ids, False, False

"""The batched multi-episode runner: many episodes, one engine batch, turn by turn.

It owns the token bookkeeping (token-in, token-out): the ids the engine generated and the ids
of each observation are appended to the episode exactly as they were fed to the model.
Env errors become failed episodes; malformed actions are the env's business (error
observations), so a policy emitting garbage never crashes a rollout.

Context operators (`context/`) ride on the env (`env.context_operator`, set by
`context.wrap_spec`): after each turn `advance` lets the operator decide what comes next; when
it resets the context, the engine row is truncated to the task prompt (`KVBatch.truncate`)
before the new window's first tokens are fed. Without an operator nothing changes.
"""
from __future__ import annotations

import random
from typing import Callable

import torch

from ..context.episode import LiveEpisode, append_turn, apply_step, new_episode, start_context
from ..engines.base import SamplingParams
from ..envs.base import EnvSpec, Task, TextEnv
from ..models.chat import ChatFormat
from ..types import Episode, Turn


def advance(live: LiveEpisode, fmt: ChatFormat, turn: Turn, max_tokens: int,
            max_new_tokens: int) -> tuple[list[int] | None, bool, bool]:
    """After a policy turn: (the row's next chunk or None when the episode is done, whether the
    context now ends at a new segment-boundary state, whether the context was reset).

    Without a context operator this is `apply_step`, and every observation starts a segment.
    With one, the operator decides (`context.operators`); on a reset the caller must truncate
    the engine row to `ep.window_prefix` tokens before feeding the chunk.
    """
    op = getattr(live.env, "context_operator", None)
    if op is None:
        chunk = apply_step(live, fmt, turn, max_tokens, max_new_tokens)
        return chunk, chunk is not None, False
    return op.advance(live, fmt, turn, max_tokens, max_new_tokens)


def run_episodes(engine, fmt: ChatFormat, spec: EnvSpec, tasks: list[tuple[Task, int]],
                 params: SamplingParams, max_tokens: int, batch_size: int,
                 generator: torch.Generator | None = None,
                 on_state: Callable[[Episode, TextEnv], None] | None = None) -> list[Episode]:
    """Roll out one episode per (task, group) pair with the engine's model, `batch_size` at a time.

    `on_state(episode, env)`, if given, is called at every segment-boundary state the policy is
    about to act from (after reset, and after each observation is appended, or under a context
    operator after each context reset), e.g. to snapshot
    the env for forking (the vine controller). It must not modify either argument.
    """
    episodes: list[Episode] = []
    for b in range(0, len(tasks), batch_size):
        episodes += _run_batch(engine, fmt, spec, tasks[b:b + batch_size], params, max_tokens,
                               generator, on_state)
    return episodes


def _run_batch(engine, fmt, spec, tasks, params, max_tokens, generator,
               on_state=None) -> list[Episode]:
    lives: list[LiveEpisode] = []
    chunks: list[list[int] | None] = []
    for task, group in tasks:
        env = spec.make()
        user = env.reset(task)
        prompt = fmt.prompt_ids(env.system_prompt, user, getattr(env, "tool_schemas", None))
        lives.append(LiveEpisode(new_episode(task, group, prompt), env))
        start_context(lives[-1].ep, env)
        chunks.append(prompt)
        if on_state is not None:
            on_state(lives[-1].ep, env)
    return drive_batch(engine, fmt, lives, chunks, params, max_tokens, generator, on_state)


def drive_batch(engine, fmt: ChatFormat, lives: list[LiveEpisode], chunks: list[list[int] | None],
                params: SamplingParams, max_tokens: int, generator: torch.Generator | None,
                on_state: Callable[[Episode, TextEnv], None] | None = None) -> list[Episode]:
    """Decode live episodes turn by turn until all are done; `chunks[r]` is row r's first input
    (its prompt, or a whole stored prefix when resuming from a forked state)."""
    kv = engine.new_batch(len(lives))
    while True:
        rows = [r for r, lv in enumerate(lives) if not lv.done]
        if not rows:
            break
        kv.extend(chunks)
        chunks = [None] * len(lives)
        ids, lps = kv.generate(rows, params, fmt.stop_ids, generator)
        for r, g_ids, g_lps in zip(rows, ids, lps):
            lv = lives[r]
            turn = append_turn(lv.ep, g_ids, g_lps, fmt.decode_action(g_ids))
            chunks[r], boundary, reset = advance(lv, fmt, turn, max_tokens, params.max_new_tokens)
            if reset:
                kv.truncate(r, lv.ep.window_prefix)
            if on_state is not None and boundary:
                on_state(lv.ep, lv.env)
    return [lv.ep for lv in lives]


def run_expert(fmt: ChatFormat, spec: EnvSpec, tasks: list[tuple[Task, int]], max_tokens: int,
               seed: int = 0, error_rate: float = 0.0) -> list[Episode]:
    """Roll out the env's scripted expert, rendered with the same chat format as the model."""
    rng = random.Random(seed)
    episodes = []
    for task, group in tasks:
        env = spec.make()
        user = env.reset(task)
        prompt = fmt.prompt_ids(env.system_prompt, user, getattr(env, "tool_schemas", None))
        live = LiveEpisode(new_episode(task, group, prompt), env)
        while not live.done:
            action = spec.expert(env, rng, error_rate)
            ids = fmt.encode(action) + [fmt.stop_ids[0]]
            turn = append_turn(live.ep, ids, [0.0] * len(ids), action)
            if apply_step(live, fmt, turn, max_tokens, 0) is None and not live.done:
                break
        episodes.append(live.ep)
    return episodes

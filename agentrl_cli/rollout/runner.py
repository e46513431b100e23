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
from dataclasses import dataclass
from typing import Callable

import torch

from ..engines.hf import SamplingParams
from ..envs.base import EnvSpec, StepResult, Task, TextEnv
from ..models.chat import ChatFormat
from ..types import Episode, Turn


@dataclass
class _Live:
    """An episode being built (one engine row)."""

    ep: Episode
    env: TextEnv
    done: bool = False
    summarizing: bool = False     # a context operator asked for a summary: the next turn is it


def new_episode(task: Task, group: int, prompt_ids: list[int]) -> Episode:
    n = len(prompt_ids)
    return Episode(task_id=task.task_id, group=group, token_ids=list(prompt_ids),
                   response_mask=[0] * n, logprobs=[0.0] * n, turn_index=[-1] * n,
                   segment_starts=[], segment_index=[-1] * n, answer=task.answer,
                   question=task.prompt,
                   meta={"hops": task.meta.get("hops")} if "hops" in task.meta else {})


def start_context(ep: Episode, env: TextEnv) -> None:
    """Mark a fresh episode (its tokens so far = the task prompt) as managed by the env's
    context operator, if it has one: segments then follow context windows."""
    op = getattr(env, "context_operator", None)
    if op is not None:
        ep.context, ep.window_prefix = op.name, len(ep.token_ids)


def append_turn(ep: Episode, ids: list[int], lps: list[float], action: str) -> Turn:
    """Append one assistant message (policy tokens). Its segment is its turn number, or under a
    context operator its context window (a segment starts at the window's first turn)."""
    k = ep.num_turns
    seg = len(ep.window_starts) if ep.context else k
    start = len(ep.token_ids)
    if len(ep.segment_starts) <= seg:
        ep.segment_starts.append(start)
    ep.token_ids += ids
    ep.response_mask += [1] * len(ids)
    ep.logprobs += lps
    ep.turn_index += [k] * len(ids)
    ep.segment_index += [seg] * len(ids)
    ep.generated_tokens += len(ids)
    turn = Turn(start=start, end=len(ep.token_ids), action=action, observation="", tool=None)
    ep.turns.append(turn)
    return turn


def append_observation(ep: Episode, turn: Turn, obs_ids: list[int], text: str) -> None:
    turn.observation = text
    turn.obs_start = len(ep.token_ids)
    ep.token_ids += obs_ids
    ep.response_mask += [0] * len(obs_ids)
    ep.logprobs += [0.0] * len(obs_ids)
    ep.turn_index += [-1] * len(obs_ids)
    ep.segment_index += [-1] * len(obs_ids)
    turn.obs_end = len(ep.token_ids)


def step_env(live: _Live, turn: Turn) -> StepResult | None:
    """Step the env with the turn's action; None (the episode is finished) when it ended."""
    ep = live.ep
    try:
        res = live.env.step(turn.action)
    except Exception as e:  # an env bug must not kill the whole batch
        live.done, ep.finish, ep.reward, ep.success = True, "env_error", 0.0, False
        ep.meta["env_error"] = f"{type(e).__name__}: {e}"
        return None
    turn.tool = res.info.get("tool")
    if turn.tool and turn.tool != "answer" and not res.info.get("error"):
        ep.num_tool_calls += 1
    if res.terminated or res.truncated:
        live.done = True
        ep.reward = float(res.reward)
        ep.success = bool(res.info.get("success", res.reward > 0))
        ep.finish = "answer" if res.terminated else "max_turns"
        if res.terminated:   # the env's reading of the final answer, else the message itself
            ep.model_answer = str(res.info.get("answer", turn.action))
        return None
    return res


def apply_step(live: _Live, fmt: ChatFormat, turn: Turn, max_tokens: int,
               max_new_tokens: int) -> list[int] | None:
    """Step the env with the turn's action; returns the next chunk of ids, or None when done."""
    ep = live.ep
    res = step_env(live, turn)
    if res is None:
        return None
    obs_ids = fmt.observation_ids(res.observation)
    if len(ep.token_ids) + len(obs_ids) + max_new_tokens > max_tokens:
        live.done, ep.finish = True, "max_tokens"
        return None
    append_observation(ep, turn, obs_ids, res.observation)
    return obs_ids


def advance(live: _Live, fmt: ChatFormat, turn: Turn, max_tokens: int,
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
    lives: list[_Live] = []
    chunks: list[list[int] | None] = []
    for task, group in tasks:
        env = spec.make()
        user = env.reset(task)
        prompt = fmt.prompt_ids(env.system_prompt, user)
        lives.append(_Live(new_episode(task, group, prompt), env))
        start_context(lives[-1].ep, env)
        chunks.append(prompt)
        if on_state is not None:
            on_state(lives[-1].ep, env)
    return drive_batch(engine, fmt, lives, chunks, params, max_tokens, generator, on_state)


def drive_batch(engine, fmt: ChatFormat, lives: list[_Live], chunks: list[list[int] | None],
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
        live = _Live(new_episode(task, group, fmt.prompt_ids(env.system_prompt, user)), env)
        while not live.done:
            action = spec.expert(env, rng, error_rate)
            ids = fmt.encode(action) + [fmt.stop_ids[0]]
            turn = append_turn(live.ep, ids, [0.0] * len(ids), action)
            if apply_step(live, fmt, turn, max_tokens, 0) is None and not live.done:
                break
        episodes.append(live.ep)
    return episodes

"""Monte-Carlo values of segment-boundary states on a real env, and critic values on episodes.

Shared by the diagnostics that need a policy: the audit tree on a checkpoint, critic ranking
and the variance decomposition.

- `load_checkpoint_policy`: the policy of a checkpoint (or of `cfg.model`) with its value head
  (the critic stored in `trainer_state.pt`, None for a critic-free method), opened by
  `train.checkpoint.open_checkpoint`.
- `sample_episodes`: episodes with the env snapshotted at every segment-boundary state `s_k`
  (the runner's `on_state` hook): the context before segment k, which starts at
  `segment_starts[k]` (one segment per turn; per context window under a context operator).
- `continue_from`: fresh on-policy continuations from stored states: a new env restored from the
  snapshot, the exact visible context at `s_k` as the prompt (token-in, token-out; under a context
  operator the prompt + the current window, as the vine controller resumes), the batched runner.
- `critic_at_states`, `critic_at_tokens`: value-head outputs at `s_k` / at every policy token
  (`V_{t,i}` = the value of the state before token i of turn t), by `rollout.values` (the values
  of the trainer's forward pass, window masks included).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from ..config import RunConfig
from ..context.episode import LiveEpisode, new_episode
from ..context.windows import resume_from_visible, visible_ids
from ..envs.base import Task
from ..rollout.controllers import rollout_context, shape_rewards
from ..rollout.runner import drive_batch, run_episodes
from ..rollout.runtime import build_runtime
from ..rollout.values import critic_values
from ..train.batch import collate, microbatches
from ..train.checkpoint import open_checkpoint
from ..types import Episode


@dataclass
class Policy:
    cfg: RunConfig
    model: Any
    fmt: Any
    spec: Any                      # EnvSpec
    engine: Any
    params: Any                    # SamplingParams
    critic: torch.nn.Module | None
    name: str                      # what was loaded (checkpoint folder or model name)


def load_checkpoint_policy(cfg: RunConfig, ckpt: str | Path | None = None) -> Policy:
    """The policy (and critic) of checkpoint `ckpt` (a checkpoint folder, or a run folder: its
    latest checkpoint; `train.checkpoint.open_checkpoint`), or of `cfg.model` when `ckpt` is
    None (no critic then)."""
    if ckpt is None:
        rt, critic, name = build_runtime(cfg, log=lambda s: None), None, None
    else:
        opened = open_checkpoint(ckpt, cfg, log=lambda s: None)
        rt, critic, name = opened.runtime, opened.critic, opened.path
    return Policy(rt.cfg, rt.model, rt.fmt, rt.spec, rt.engine, rt.params, critic,
                  str(name or rt.model_path))


@dataclass
class BoundaryState:
    """State s_k of an episode: the context before its segment k."""

    episode: int                  # index of the episode it was recorded on
    k: int
    task: Task
    group: int
    prefix: list[int]             # the visible context at segment_starts[k]
    snapshot: Any                 # env snapshot at that state
    source: Episode               # the episode (its context-operator bookkeeping)


def sample_episodes(pol: Policy, pairs: list[tuple[Task, int]], seed: int
                    ) -> tuple[list[Episode], list[list[BoundaryState]]]:
    """One episode per (task, group) pair, and per episode its states s_0..s_{K-1}."""
    snaps: dict[int, list[tuple[int, Any]]] = {}

    def record(ep, env):
        snaps.setdefault(id(ep), []).append((len(ep.token_ids), env.snapshot()))

    c = pol.cfg.rollout
    eps = run_episodes(pol.engine, pol.fmt, pol.spec, pairs, pol.params, c.max_tokens,
                       c.batch_size, torch.Generator().manual_seed(seed), on_state=record)
    shape_rewards(eps, rollout_context(pol, None, group_size=1))
    states: list[list[BoundaryState]] = []
    for b, (ep, (task, group)) in enumerate(zip(eps, pairs)):
        row = []
        recorded = snaps.get(id(ep), [])
        for k, start in enumerate(ep.segment_starts):
            length, snap = recorded[k]
            if length != start:
                raise RuntimeError(f"state {k} of episode {b} is at token {length}, segment starts at {start}")
            row.append(BoundaryState(b, k, task, group, visible_ids(ep, start), snap, ep))
        states.append(row)
    return eps, states


def continue_from(pol: Policy, states: list[BoundaryState], n: int, seed: int) -> list[list[Episode]]:
    """`n` fresh continuations from each state (batched `rollout.batch_size` at a time)."""
    jobs = [i for i in range(len(states)) for _ in range(n)]
    out: list[list[Episode]] = [[] for _ in states]
    gen = torch.Generator().manual_seed(seed)
    c = pol.cfg.rollout
    for b in range(0, len(jobs), c.batch_size):
        lives, chunks, which = [], [], []
        for i in jobs[b:b + c.batch_size]:
            st = states[i]
            env = pol.spec.make()
            env.restore(st.snapshot)
            ep = new_episode(st.task, st.group, st.prefix)
            resume_from_visible(ep, st.source)
            lives.append(LiveEpisode(ep, env))
            chunks.append(list(st.prefix))
            which.append(i)
        done = drive_batch(pol.engine, pol.fmt, lives, chunks, pol.params, c.max_tokens, gen)
        for i, ep in zip(which, done):
            out[i].append(ep)
    ctx = rollout_context(pol, gen, group_size=1)
    for eps in out:  # the reward the trainer would see (DAPO overlong shaping, when on)
        shape_rewards(eps, ctx)
    return out


def _values_at(pol: Policy, episodes: list[Episode], positions: list[list[int]]) -> list[list[float]]:
    """Per episode, V of the state before each of its `positions` (`rollout.values`), in
    micro-batches of at most `train.max_tokens_per_microbatch` padded tokens."""
    if pol.critic is None:
        raise ConfigError(f"{pol.name} has no critic (value head); use a checkpoint of a method "
                          "that trains one (ppo, mpo, focus)")
    out: list[list[float]] = [[] for _ in episodes]
    for rows in microbatches(collate(episodes, pol.fmt.pad_id), pol.cfg.train.max_tokens_per_microbatch):
        vals = critic_values(pol.model, pol.critic, [episodes[i] for i in rows],
                             [positions[i] for i in rows])
        for i, v in zip(rows, vals):
            out[i] = v
    return out


def critic_at_states(pol: Policy, episodes: list[Episode], first: int = 0) -> list[list[float]]:
    """Per episode [V(s_k) for k = first..K-1], V(s_k) at the start of segment k."""
    if not episodes:
        return []
    return _values_at(pol, episodes, [ep.segment_starts[first:] for ep in episodes])


def critic_at_tokens(pol: Policy, episodes: list[Episode]) -> list[list[list[float]]]:
    """Per episode, per turn, V_{t,i} at each of the turn's policy tokens."""
    vals = _values_at(pol, episodes, [[i for t in ep.turns for i in range(t.start, t.end)]
                                      for ep in episodes])
    out = []
    for ep, v in zip(episodes, vals):
        k, row = 0, []
        for t in ep.turns:
            row.append(v[k:k + t.end - t.start])
            k += t.end - t.start
        out.append(row)
    return out

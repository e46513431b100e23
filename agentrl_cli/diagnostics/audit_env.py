"""The audit tree on a real env: a checkpoint's root episodes, with values from continuations.

`EnvWorld` samples `roots` episodes per held-out task with the policy; their segment-boundary
states are the audit states. From each audit state `samples` fresh continuations are run once
(`diagnostics.mc.continue_from`); their mean reward is the state's true value, and they form
the state's pool: a continuation in the simulation draws one of them uniformly (with
replacement), so the simulated outcomes have exactly that mean [our choice: one shared pool
keeps every allocator, critic and seed on the same data and costs one batch of generation].
The intermediate states of pooled continuations are not resumable (their continuations were not
generated), so only audit states are candidates, as in the synthetic world's default.
Each state carries the checkpoint's critic value (`critic = "trained"`) when it has a value head.
All seeds share the one audit tree; they differ in the draws from the pools, the random critic
and the random allocator.
"""
from __future__ import annotations

import random

from .audit import PathDraw, State
from .mc import Policy, continue_from, critic_at_states, sample_episodes


class EnvWorld:
    def __init__(self, pol: Policy, n_tasks: int, roots: int, samples: int, seed: int = 0):
        tasks = pol.spec.tasks("eval", n_tasks)
        pairs = [(t, g) for g, t in enumerate(tasks) for _ in range(roots)]
        eps, states = sample_episodes(pol, pairs, seed)
        self.n_tasks, self.roots = len(tasks), roots
        self.episodes = eps
        head = pol.critic is not None
        vals = critic_at_states(pol, eps) if head else [[None] * len(e.segment_starts) for e in eps]
        # distinct audit states: one shared s_0 per task, then every episode's s_1..s_{K-1}
        audit: list = []
        self.critic: list[float | None] = []
        self.root_key: list[int] = []
        self.path_keys: list[list[list[int]]] = [[] for _ in tasks]
        self.rewards: list[list[float]] = [[] for _ in tasks]
        for b, row in enumerate(states):
            g = eps[b].group
            if len(self.root_key) == g:
                self.root_key.append(len(audit))
                audit.append(row[0])
                self.critic.append(vals[b][0])
            keys = []
            for st in row[1:]:
                keys.append(len(audit))
                audit.append(st)
                self.critic.append(vals[b][st.k])
            self.path_keys[g].append(keys)
            self.rewards[g].append(eps[b].reward)
        conts = continue_from(pol, audit, samples, seed + 1)
        flat = [e for c in conts for e in c]
        fvals = critic_at_states(pol, flat, first=1) if head else [
            [None] * (len(e.segment_starts) - 1) for e in flat]
        cvals, i = [], 0
        for c in conts:
            cvals.append(fvals[i:i + len(c)])
            i += len(c)
        self.truth = [sum(e.reward for e in c) / len(c) for c in conts]
        self.pool = [[PathDraw([State(critic=v, resumable=False) for v in vs], e.reward)
                      for e, vs in zip(c, cv)] for c, cv in zip(conts, cvals)]
        self.n_states = len(audit)
        self.n_continuations = sum(len(c) for c in conts)

    def _state(self, key: int) -> State:
        return State(truth=self.truth[key], critic=self.critic[key], key=key)

    def root_state(self, task: int) -> State:
        return self._state(self.root_key[task])

    def root_path(self, task: int, j: int, rng: random.Random) -> PathDraw:
        keys = self.path_keys[task][j]
        return PathDraw([self._state(k) for k in keys], self.rewards[task][j])

    def continuation(self, task: int, state: State, rng: random.Random) -> PathDraw:
        return rng.choice(self.pool[state.key])

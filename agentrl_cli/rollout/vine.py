"""The VinePPO controller: Monte-Carlo values of segment-boundary states (docs/methods.md).

1. Sample `G` episodes per task exactly like `linear`, snapshotting the env at every
   segment-boundary state `s_k` (the runner's `on_state` hook; `s_k` = the episode's tokens up to
   the start of segment k, `k = 0..K-1`: one segment per turn, or per context window under a
   context operator).
2. From each `s_k`, run `algo.vine_k` extra continuations with the current policy: a fresh env is
   restored from the snapshot and the continuation's prompt is the context the policy saw at
   `s_k`, exact token ids (the episode's token prefix; under a context operator its visible
   part, prompt + current window). `V(s_k)` = the mean reward of its continuations.
   `s_0` (the task prompt) is the same state for every episode of a group, so its continuations
   are run once per group and shared.
3. The step's payload for the estimator (`RolloutResult.payload`) is a
   `credit.estimators.SegmentValues`: `values[b]` = [V(s_0), ..., V(s_{K_b-1})] of episode b
   (NaN for a state that got no continuation), and how many continuations each averages; the
   "vine" estimator turns them into segment advantages.

Continuations are only used for values, never trained on (`RolloutResult.continuations`, each
noting its state, source episode and boundary in `Episode.meta`); their generated tokens are
counted in `RolloutResult.extra_tokens` (so `rollout/tokens` is the step's full generation
cost).
The paper uses K = 9; the default `algo.vine_k = 3` keeps CPU runs short.

Cost: every continuation re-prefills its whole prefix. Reusing the episode's KV prefix when
forking is left for the FOCUS engine.

Budget (`rollout.budget_tokens > 0`) [our choice]: the budget is *reserved* for the values.
Main groups are launched in waves (at most `batch_size` episodes, whole groups); after each
wave the step's projected cost is what the main episodes generated plus `algo.vine_k`
continuations from each of their boundary states, each priced at what its source episode
generated from that state on. No new wave starts once the projection reaches the budget, so
VinePPO trains on fewer groups than GRPO at the same budget but every state gets its K
continuations (launching main groups like `linear` would spend the whole budget on episodes
and leave the values unestimated: VinePPO would silently degrade to a critic-free baseline).
Continuations are queued round-robin over states (every state gets its first continuation before
any state gets a second) and launched in waves of at most `batch_size`; a continuation is
launched only if the tokens spent so far plus the wave's estimated cost fit within the budget,
each continuation priced at what its source episode generated from that state on. The queue
stops at the first continuation that does not fit. The estimate can be wrong, so the last wave
may overshoot by its estimation error; the trainer logs the true `rollout/tokens`. What a step
leaves unspent (a whole group rarely fits the rest) or overspends carries to the next step's
limit (`controllers.spend_limit`, as GRPO's and FOCUS's steps), so the run's mean is the budget.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..credit.estimators import SegmentValues
from ..types import Episode, Payload
from .controllers import (RolloutContext, RolloutResult, record_spend, run_groups, shape_rewards,
                          spend_limit)
from ..context.windows import resume_from_visible, visible_ids
from ..context.episode import LiveEpisode, new_episode
from .runner import drive_batch


@dataclass
class _State:
    """One segment-boundary state to estimate."""

    source: int                   # index of the episode it was recorded on
    boundary: int                 # k: the state before segment k
    prefix: list[int]             # the context at segment_starts[k] (visible ids)
    snapshot: object              # env snapshot at that state
    cost: int                     # tokens the source episode generated from this state on


def boundary_states(eps: list[Episode], snaps: dict[int, list[tuple[int, object]]]) -> tuple[
        list[_State], list[list[int]]]:
    """The distinct states to estimate and, per episode, the state index of each of its turns."""
    states: list[_State] = []
    index: list[list[int]] = []
    root: dict[int, int] = {}
    for b, ep in enumerate(eps):
        recorded = snaps.get(id(ep), [])
        if len(recorded) < len(ep.segment_starts):
            raise RuntimeError(f"vine: episode {b} has {len(ep.segment_starts)} segments but "
                               f"{len(recorded)} recorded states")
        row = []
        for k, start in enumerate(ep.segment_starts):
            length, snap = recorded[k]
            if length != start:
                raise RuntimeError(f"vine: state {k} of episode {b} is at token {length}, "
                                   f"segment starts at {start}")
            if k == 0 and ep.group in root:
                row.append(root[ep.group])
                continue
            cost = sum(ep.response_mask[start:])
            states.append(_State(b, k, visible_ids(ep, start), snap, cost))
            if k == 0:
                root[ep.group] = len(states) - 1
            row.append(len(states) - 1)
        index.append(row)
    return states, index


def _plan_waves(ctx: RolloutContext, states: list[_State], spent: int,
                limit: float | None) -> list[list[int]]:
    """Queue of state indices (round-robin over states, K rounds) cut into waves within the
    step's `limit` (`spend_limit`; None without a budget)."""
    queue = [s for _ in range(ctx.algo.vine_k) for s in range(len(states))]
    waves: list[list[int]] = []
    planned = spent
    for s in queue:
        if ctx.budget_tokens > 0 and planned + states[s].cost > limit:
            break
        planned += states[s].cost
        if not waves or len(waves[-1]) >= ctx.batch_size:
            waves.append([])
        waves[-1].append(s)
    return waves


def projected_cost(eps: list[Episode], states: list[_State], k: int) -> int:
    """Main tokens plus `k` continuations from every distinct boundary state (`boundary_states`
    of `eps`), each priced at what its episode generated from the state on."""
    return sum(e.generated_tokens for e in eps) + k * sum(s.cost for s in states)


def _reserved_groups(ctx: RolloutContext, tasks, record, snaps, limit: float) -> list[Episode]:
    """Main groups in waves until main + planned continuations reach the budget.

    The first wave is one group (its cost is unknown before it runs); each later wave takes as
    many groups as the remaining budget affords at the projected cost per group so far (at
    most `batch_size` episodes). A first wave of `batch_size` episodes could spend the whole
    budget on main episodes when the step has no more than that (measured: at GRPO's one-step
    spend every step got 0 continuations and VinePPO trained on zero advantages). `limit`: the
    step's (`spend_limit`)."""
    per_wave = max(1, ctx.batch_size // ctx.group_size)
    eps: list[Episode] = []
    start, n = 0, 1
    while start < len(tasks) and n > 0:
        eps += run_groups(ctx, tasks[start:start + n], first_group=start, on_state=record)
        start += n
        cost = projected_cost(eps, boundary_states(eps, snaps)[0], ctx.algo.vine_k)
        n = min(per_wave, int((limit - cost) // max(cost / start, 1.0)))
    return eps


VINE_READS = ("algo.vine_k", "algo.overlong_shaping", "algo.overlong_cache", "algo.rewards",
              "algo.reward_mode")


def vine(ctx: RolloutContext, tasks) -> RolloutResult:
    """G episodes per task plus `algo.vine_k` value continuations from every boundary state."""
    snaps: dict[int, list[tuple[int, object]]] = {}

    def record(ep, env):
        snaps.setdefault(id(ep), []).append((len(ep.token_ids), env.snapshot()))

    if ctx.budget_tokens > 0:
        limit = spend_limit(ctx, "vine_spend")
        eps = _reserved_groups(ctx, tasks, record, snaps, limit)
    else:
        limit = None
        eps = run_groups(ctx, tasks, on_state=record)
    states, index = boundary_states(eps, snaps)
    spent = sum(e.generated_tokens for e in eps)
    rewards: list[list[float]] = [[] for _ in states]
    conts: list[Episode] = []
    for wave in _plan_waves(ctx, states, spent, limit):
        lives, chunks = [], []
        for s in wave:
            st = states[s]
            src = eps[st.source]
            env = ctx.spec.make()
            env.restore(st.snapshot)
            ep = new_episode(tasks[src.group], src.group, st.prefix)
            resume_from_visible(ep, src)
            ep.meta.vine_state, ep.meta.source, ep.meta.boundary = s, st.source, st.boundary
            lives.append(LiveEpisode(ep, env))
            chunks.append(list(st.prefix))
        done = drive_batch(ctx.engine, ctx.fmt, lives, chunks, ctx.params, ctx.max_tokens,
                           ctx.generator)
        shape_rewards(done, ctx)
        for s, ep in zip(wave, done):
            rewards[s].append(ep.reward)
        conts += done
    extra = sum(c.generated_tokens for c in conts)
    if limit is not None:
        record_spend(ctx, "vine_spend", spent + extra)
    values = [sum(r) / len(r) if r else math.nan for r in rewards]
    seg = SegmentValues([[values[s] for s in row] for row in index],
                        [[len(rewards[s]) for s in row] for row in index])
    return RolloutResult(eps, extra_tokens=extra, payload=Payload(seg), continuations=conts,
                         counters={"vine/states": len(states), "vine/continuations": len(conts)})

"""Rollout controllers: how a step's generation budget becomes episodes (and trees).

`controller(ctx, tasks) -> RolloutResult`; `ctx` carries the engine, chat format, env spec,
sampling parameters, the step's generator and the algorithm config (for controller options
such as DAPO's dynamic sampling). The trainer never branches on the name.

Matched budgets: `ctx.budget_tokens > 0` is the generated tokens per step, averaged over the
run, for every controller that launches work against it (`linear`, `focus`; VinePPO reserves
its own share for values, `rollout.vine`). A step's limit is the budget plus what the run's
earlier steps left unspent, less what they overspent (`spend_limit`, kept in `ctx.carry`), so a
run's total spend meets its total budget. The linear controller launches whole groups: as many
as the limit affords at the run's measured cost of a group (the first step, with no cost yet
measured, launches them all), in waves of at most `batch_size` episodes, never fewer than one
group a step; when a step's tasks are spent and its limit still affords a group, it draws more
training tasks (uniformly with the step's generator, never one already used this step), so a
linear method whose episodes get shorter still generates its budget (before, it stopped at
`rollout.tasks_per_step` groups and fell short of the methods it was compared with). With no
budget, all episodes go to the engine in one call (exactly as without this feature).

The reward functions of `algo.rewards` (`rollout.rewards`) and DAPO's overlong shaping are
applied here, to `Episode.reward`, right after each episode is generated and before dynamic
sampling and the estimator see it (`reward/mean` in the metrics is therefore the shaped reward;
`success` is the verifier's verdict).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..config import AlgoConfig
from ..engines.base import SamplingParams
from ..envs.base import EnvSpec, Task
from ..models.chat import ChatFormat
from ..registry import Registry
from ..types import Episode, Payload
from ..envs.guard import user_timeout
from .rewards import apply_rewards, load_rewards
from .runner import run_episodes
from .tree import Tree


@dataclass
class RolloutContext:
    engine: object
    fmt: ChatFormat
    spec: EnvSpec
    params: SamplingParams
    group_size: int
    max_tokens: int
    batch_size: int
    budget_tokens: int            # 0 = no cap
    generator: torch.Generator
    algo: AlgoConfig = field(default_factory=AlgoConfig)  # controller options (vine_k, DAPO knobs)
    critic: object = None         # the critic (models/critic.py): FOCUS node values; or None
    # what a controller keeps from one step to the next (the trainer passes the same dict every
    # step and checkpoints it): FOCUS's record of its spend against its launch limits
    carry: dict = field(default_factory=dict)


def rollout_context(rt, generator: torch.Generator | None, budget: int = 0,
                    group_size: int | None = None, critic=None, carry: dict | None = None
                    ) -> RolloutContext:
    """The one way a `RolloutContext` is built: from a runtime (anything with `cfg`, `engine`,
    `fmt`, `spec` and `params`, e.g. `rollout.runtime.Runtime`), its config's group size (or
    `group_size`), generation limits and `algo`, and the step's budget, generator, critic and
    carry."""
    r = rt.cfg.rollout
    return RolloutContext(rt.engine, rt.fmt, rt.spec, rt.params,
                          r.group_size if group_size is None else group_size, r.max_tokens,
                          r.batch_size, budget, generator, algo=rt.cfg.algo, critic=critic,
                          carry={} if carry is None else carry)


@dataclass
class StepTiming:
    """Where a tree step's wall time went (benchmarks read it; not logged)."""

    wall_seconds: float
    bookkeeping_seconds: float    # the planner's own work: gains, allocation, tree updates


@dataclass
class RolloutResult:
    """A step's rollout, as credit and the trainer read it: every field named and typed."""

    episodes: list[Episode]               # trainable episodes
    extra_tokens: int = 0                 # generated tokens spent on value estimation only
    metrics: dict[str, float] = field(default_factory=dict)  # logged in the step's row
    # what the controller hands the method's estimator beside the episodes, typed by what it
    # makes (FOCUS: `credit.focus_credit.FocusTrees`; VinePPO: `credit.estimators.
    # SegmentValues`); the trainer passes it on as `Batch.payload` without reading it
    payload: Payload = field(default_factory=Payload)
    # tree controllers (`Controller.trees`): the step's search trees (`rollout.tree.Tree`), for
    # traces and `agentrl rollout`
    trees: list[Tree] = field(default_factory=list)
    # episodes generated for the estimator's inputs only, never trained on (VinePPO's value
    # continuations); their tokens are in `extra_tokens`
    continuations: list[Episode] = field(default_factory=list)
    # counters a controller reports beside its metrics, not logged (DAPO's refill rounds,
    # VinePPO's states): tests and benchmarks read them
    counters: dict[str, int] = field(default_factory=dict)
    timing: StepTiming | None = None      # tree controllers: the step's wall and bookkeeping time

    @property
    def tokens(self) -> int:
        return sum(e.generated_tokens for e in self.episodes) + self.extra_tokens


@dataclass(frozen=True)
class Controller:
    """A rollout controller and what it can do; registered once, by name, in `CONTROLLERS`
    (the package's `__init__`), and read by every driver: the trainer's in-process rollouts
    and the path scheduler (`rollout.rollouts`), the preflight checks, `agentrl rollout`."""

    run: Callable[[RolloutContext, list[Task]], RolloutResult]   # in process, on one engine
    # on the path scheduler (`rollout.scheduler`: Ray workers, turn-level engines); None: in
    # process only
    # (called with the context, the tasks and a `scheduler.PathRunner`)
    run_paths: Callable[..., RolloutResult] | None = None
    forks: bool = False           # restores env snapshots into fresh envs (a user env must pass
                                  # check-env's fork check first)
    trees: bool = False           # its step is a set of search trees (`RolloutResult.trees`)


CONTROLLERS: Registry[Controller] = Registry("controller")


# ----------------------------------------------------------------------------- DAPO knobs


def overlong_penalty(length: int, max_tokens: int, cache: int, cut: bool = False) -> float:
    """DAPO's soft overlong punishment of an episode of `length` tokens (prompt included).

    0 up to `max_tokens - cache`, then linear down to -1 at `max_tokens`; -1 beyond, and -1 for
    an episode the runner cut because its next turn would not fit (`cut`: it would have gone
    beyond L_max had it been allowed to continue).
    """
    if cut or length > max_tokens:
        return -1.0
    start = max_tokens - cache
    if length <= start:
        return 0.0
    return (start - length) / cache


def shape_rewards(episodes: list[Episode], ctx: RolloutContext) -> None:
    """Each finished episode's reward as the estimators read it: the env's, with the reward
    functions of `algo.rewards` added (or in its place, `algo.reward_mode`), then the overlong
    penalty when `algo.overlong_shaping` is on. Each episode is shaped once (what shaping notes
    is `EpisodeMeta.SHAPED`: a continuation from a finished path's prefix leaves it out, to be
    shaped itself)."""
    if ctx.algo.rewards:
        fns = load_rewards(ctx.algo.rewards)
        timeout_s = user_timeout(ctx.spec)
        for ep in episodes:
            apply_rewards(ep, fns, ctx.algo.reward_mode, timeout_s)
    if not ctx.algo.overlong_shaping:
        return
    for ep in episodes:
        if ep.meta.reward_raw is not None:
            continue
        pen = overlong_penalty(len(ep.token_ids), ctx.max_tokens, ctx.algo.overlong_cache,
                               cut=ep.finish == "max_tokens")
        ep.meta.reward_raw, ep.meta.overlong_penalty = ep.reward, pen
        ep.reward = ep.reward + pen


def is_informative(group: list[Episode]) -> bool:
    """A group whose rewards are not all equal (its outcome advantages are not all zero)."""
    return len(group) > 1 and max(e.reward for e in group) > min(e.reward for e in group)


# ----------------------------------------------------------------------------- linear


def spend_limit(ctx: RolloutContext, key: str) -> float:
    """This step's generated-token limit under `ctx.budget_tokens`: the budget plus what the
    run's earlier steps left unspent, less what they overspent (`ctx.carry[key]` = [tokens
    generated, budgets] over the run's steps), within [0, 2 x budget]."""
    spend, budgets = ctx.carry.get(key, (0.0, 0.0))
    return min(2.0 * ctx.budget_tokens, max(0.0, ctx.budget_tokens + budgets - spend))


def record_spend(ctx: RolloutContext, key: str, tokens: float) -> None:
    """Add a step's generated tokens and its budget to the run's record (`spend_limit`)."""
    spend, budgets = ctx.carry.get(key, (0.0, 0.0))
    ctx.carry[key] = [spend + tokens, budgets + ctx.budget_tokens]


def run_groups(ctx: RolloutContext, tasks: list[Task], first_group: int = 0,
               spent: int = 0, limit: float | None = None, extend: bool = False,
               **kw) -> list[Episode]:
    """`ctx.group_size` episodes for each task (groups numbered from `first_group`), shaped.

    With a budget, groups are launched in waves of at most `batch_size` episodes while `spent`
    plus what this call has generated stays under `limit` (default `ctx.budget_tokens`): each
    wave takes as many groups as the rest affords at the cost of a group (this call's mean so
    far, else `ctx.carry["group_tokens"]`, the run's last measured one; unknown: every group
    the wave holds), at least one group in all. With `extend`, once `tasks` are spent, further
    waves draw fresh training tasks (`fresh_tasks`) while the rest still affords a group. `kw`
    goes to `run_episodes` (e.g. `on_state`).
    """
    G = ctx.group_size

    def launch(wave: list[Task], g: int) -> list[Episode]:
        pairs = [(t, first_group + g + i) for i, t in enumerate(wave) for _ in range(G)]
        return run_episodes(ctx.engine, ctx.fmt, ctx.spec, pairs, ctx.params, ctx.max_tokens,
                            ctx.batch_size, ctx.generator, **kw)

    if ctx.budget_tokens <= 0:
        eps = launch(list(tasks), 0)
    else:
        limit = ctx.budget_tokens if limit is None else limit
        eps = budget_waves(ctx, list(tasks), launch, limit - spent, extend)
    shape_rewards(eps, ctx)
    return eps


def budget_waves(ctx: RolloutContext, tasks: list[Task],
                 launch: Callable[[list[Task], int], list[Episode]], limit: float,
                 extend: bool) -> list[Episode]:
    """The linear wave loop under a token budget, for every driver: `launch(wave, g)` runs the
    groups of `wave` (numbered from `g` within the step) and returns their episodes; waves go
    while what they generated stays under `limit`, each as many groups as the rest affords
    (`budget_wave`). With `extend`, `tasks` (a list the loop extends in place) grows by fresh
    training tasks once its own are spent. Remembers the step's cost of a group."""
    used = {t.task_id for t in tasks}
    eps: list[Episode] = []
    g = 0
    while True:
        n = budget_wave(ctx, eps, limit - sum(e.generated_tokens for e in eps), tasks, g, used, extend)
        if n <= 0:
            break
        eps += launch(tasks[g:g + n], g)
        g += n
    remember_group_cost(ctx, eps)
    return eps


def budget_wave(ctx: RolloutContext, eps: list[Episode], left: float, tasks: list[Task],
                g: int, used: set, extend: bool) -> int:
    """Groups the next budgeted wave launches from `tasks[g:]` (`next_wave`, given the step's
    episodes `eps` and the tokens `left`); with `extend`, once `tasks` are spent, the wave's
    fresh training tasks (`fresh_tasks`) are appended to `tasks` first. 0: stop."""
    remaining = len(tasks) - g
    if remaining <= 0:
        if not extend:
            return 0
        remaining = max(1, ctx.batch_size // ctx.group_size)
    n = next_wave(ctx, eps, left, remaining)
    if n > 0 and g + n > len(tasks):
        tasks += fresh_tasks(ctx, used, g + n - len(tasks))
        n = min(n, len(tasks) - g)
    return max(n, 0)


def fresh_tasks(ctx: RolloutContext, used: set, n: int) -> list[Task]:
    """Up to `n` training tasks drawn uniformly with `ctx.generator`, none of them in `used`
    (task ids, updated in place): what a budgeted step runs beyond its own tasks."""
    pool = ctx.spec.tasks("train")
    order = torch.randperm(len(pool), generator=ctx.generator).tolist()
    out = [pool[i] for i in order if pool[i].task_id not in used][:n]
    used |= {t.task_id for t in out}
    return out


def _group_cost(ctx: RolloutContext, eps: list[Episode]) -> float:
    """Mean generated tokens of one group of `eps`."""
    return sum(e.generated_tokens for e in eps) / (len(eps) / ctx.group_size)


def next_wave(ctx: RolloutContext, eps: list[Episode], left: float, remaining: int) -> int:
    """Groups the next budgeted wave launches, given the step's episodes `eps` so far, the
    tokens `left` of its limit and the `remaining` groups: as many as `left` affords at the cost
    of a group (this step's mean so far, else `ctx.carry["group_tokens"]`, the run's last
    measured one; unknown: a full wave), at most one wave of `batch_size` episodes, at least one
    group in a step that has none yet (0: stop)."""
    per_wave = max(1, ctx.batch_size // ctx.group_size)
    cost = _group_cost(ctx, eps) if eps else ctx.carry.get("group_tokens")
    n = per_wave if cost is None else int(round(left / max(cost, 1.0)))
    return min(per_wave, remaining, max(n, 0 if eps else 1))


def remember_group_cost(ctx: RolloutContext, eps: list[Episode]) -> None:
    """Keep the step's mean cost of a group for the next step's first wave (`next_wave`)."""
    if eps:
        ctx.carry["group_tokens"] = _group_cost(ctx, eps)


def _groups(eps: list[Episode]) -> dict[int, list[Episode]]:
    out: dict[int, list[Episode]] = {}
    for e in eps:
        out.setdefault(e.group, []).append(e)
    return out


def dynamic_sampling(ctx: RolloutContext, tasks: list[Task], first: list[Episode],
                     limit: float | None = None) -> RolloutResult:
    """DAPO dynamic sampling on top of a linear rollout `first` of `tasks`.

    Groups whose (shaped) rewards are all equal are dropped; each refill round samples as many
    new training tasks (uniformly, with `ctx.generator`, never a task already used this step)
    as groups are missing, for at most `algo.dynamic_rounds` rounds or until the budget is
    spent; under a budget a round launches only as many groups as fit in what is left at the
    step's mean cost per episode so far, so refills never overshoot it by more than that
    estimate's error (`limit`: the step's, `spend_limit`; default the budget). The kept groups (at most `len(tasks)`) are renumbered 0..n-1. If no group at all is
    informative, the first round's groups are returned unchanged (the batch is then a no-op for
    outcome advantages, but the trainer still gets its step). Tokens of dropped groups count as
    `extra_tokens` (generated, not trained on).
    """
    target = len(tasks)
    limit = ctx.budget_tokens if limit is None else limit
    spent = sum(e.generated_tokens for e in first)
    generated = len(first)                # episodes so far: the refills' cost estimate
    kept = [g for g in _groups(first).values() if is_informative(g)][:target]
    used = {t.task_id for t in tasks}
    next_group = target
    rounds = 0
    while len(kept) < target and rounds < ctx.algo.dynamic_rounds:
        if ctx.budget_tokens > 0 and spent >= limit:
            break
        want = target - len(kept)
        if ctx.budget_tokens > 0:     # refill only the groups whose expected cost fits
            per_group = spent / max(1, generated) * ctx.group_size
            want = min(want, int((limit - spent) // max(per_group, 1.0)))
            if want <= 0:
                break
        rounds += 1
        fresh = fresh_tasks(ctx, used, want)
        if not fresh:
            break
        eps = run_groups(ctx, fresh, first_group=next_group, spent=spent, limit=limit)
        next_group += len(fresh)
        spent += sum(e.generated_tokens for e in eps)
        generated += len(eps)
        kept += [g for g in _groups(eps).values() if is_informative(g)][:target - len(kept)]
    if not kept:
        kept = list(_groups(first).values())
    episodes = []
    for g, group in enumerate(kept):
        for e in group:
            e.group = g
            episodes.append(e)
    trained = sum(e.generated_tokens for e in episodes)
    return RolloutResult(episodes, extra_tokens=spent - trained,
                         counters={"dynamic/rounds": rounds, "dynamic/kept_groups": len(kept)})


LINEAR_READS = ("algo.dynamic_sampling", "algo.dynamic_rounds", "algo.overlong_shaping",
                "algo.overlong_cache", "algo.rewards", "algo.reward_mode")


def linear(ctx: RolloutContext, tasks: list[Task]) -> RolloutResult:
    """G independent episodes per task (GRPO-style groups); DAPO dynamic sampling when
    `algo.dynamic_sampling` is on."""
    limit = spend_limit(ctx, "linear_spend") if ctx.budget_tokens > 0 else None
    # dynamic sampling refills with fresh tasks itself; plain GRPO draws them to meet its budget
    eps = run_groups(ctx, tasks, limit=limit, extend=not ctx.algo.dynamic_sampling)
    if ctx.algo.dynamic_sampling:
        res = dynamic_sampling(ctx, tasks, eps, limit)
    else:
        res = RolloutResult(eps, metrics={"rollout/drawn_groups": max(0, len(_groups(eps)) - len(tasks))})
    if ctx.budget_tokens > 0:
        record_spend(ctx, "linear_spend", res.tokens)
    return res


"""The matched generation budget's one home (docs/methods.md, "Budget"; docs/architecture.md):
what one linear (GRPO-style) step generates, measured once with the initial policy.

`resolve_budget` is the one rule that picks a run's budget (explicit, else recorded, else
measured), `matched_budget` the one measurement, `linear_step_tokens` that measurement on a
run's step-1 tasks, `step_budget` the trainer's call of the rule, `matched_tasks` /
`linear_step_tasks` the distinct tasks a linear step draws under that budget
(`rollout.focus_tasks=match`). The trainer measures at step 0 (`rollout.budget_match`) and keeps
the number in its checkpoints; `agentrl ablate` measures once for every cell of a sweep and
hands each run the number as `rollout.budget_tokens`; `agentrl rollout --method focus` measures
on the tasks its trees grow on (`app.rollout.collect_trees`, one episode per task). The number
goes down from there into the controllers; nothing below reads it back.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..config import RunConfig, step_seed
from ..envs.base import Task
from .controllers import rollout_context, run_groups
from .runner import run_episodes
from .runtime import Runtime
from .tasks import TaskSampler


def resolve_budget(explicit: int, match: bool, recorded: int | None,
                   measure: Callable[[], int]) -> int:
    """Generated tokens per step, by the rule every user follows (the trainer, `agentrl
    rollout`'s trees, `agentrl ablate`): an explicit budget (`rollout.budget_tokens` > 0) wins;
    else without matching (`rollout.budget_match` off) there is no cap (0); else the budget
    recorded before (a resumed run's checkpoint, a rerun sweep's ablation.json); else
    `measure()` (a linear step of the base policy, `matched_budget`)."""
    if explicit > 0 or not match:
        return max(explicit, 0)
    if recorded:
        return int(recorded)
    return measure()


def matched_budget(rt: Runtime, tasks: list[Task], group_size: int, seed: int,
                   sampled_per_task: int | None = None) -> int:
    """Generated tokens of one linear step on `tasks` with `group_size` episodes per task, from
    `rt`'s policy, engine and sampling parameters (generator seeded with `seed`).

    By default `group_size` episodes per task are sampled and the budget is exactly the tokens
    they generated. With `sampled_per_task` given, that many are sampled per task (fewer: a
    cheaper estimate) and the budget is `len(tasks) x group_size x` their mean tokens per
    episode, rounded (at least 1)."""
    per_task = group_size if sampled_per_task is None else sampled_per_task
    pairs = [(t, g) for g, t in enumerate(tasks) for _ in range(per_task)]
    r = rt.cfg.rollout
    eps = run_episodes(rt.engine, rt.fmt, rt.spec, pairs, rt.params, r.max_tokens, r.batch_size,
                       torch.Generator().manual_seed(seed))
    tokens = sum(e.generated_tokens for e in eps)
    if sampled_per_task is None:
        return tokens
    return max(1, round(len(tasks) * group_size * (tokens / max(1, len(eps)))))


def matched_tasks(rt: Runtime, tasks: list[Task], budget: int, seed: int) -> int:
    """Distinct tasks one linear (GRPO) step of `rt`'s policy draws under `budget` generated
    tokens, starting from `tasks` (step 1's) and drawing fresh training tasks while the budget
    still affords a group, as the linear controller does (generator seeded with `seed`).
    Without a budget (0) a linear step runs `tasks` only."""
    if budget <= 0:
        return len(tasks)
    ctx = rollout_context(rt, torch.Generator().manual_seed(seed), budget=budget)
    eps = run_groups(ctx, list(tasks), extend=True)
    return len({e.task_id for e in eps})


def step_budget(cfg: RunConfig, base: dict) -> int:
    """Generated-token cap per step: `rollout.budget_tokens`, else with `rollout.budget_match`
    what one linear (GRPO) step of the base policy generated on step 1's tasks
    (`base["linear_step_tokens"]`, measured once at step 0 and kept in the checkpoints, so a
    resumed run keeps it; a run saved before it was recorded predicts it as tasks x group x the
    base check's tokens per question), else 0 (no cap)."""
    r = cfg.rollout
    return resolve_budget(r.budget_tokens, r.budget_match, base.get("linear_step_tokens"),
                          lambda: max(1, round(r.tasks_per_step * r.group_size * base["tokens_per_question"])))


def linear_step_tokens(rt: Runtime) -> int:
    """The matched budget of a run of `rt.cfg` (`rollout.matched_budget`): the tokens one linear
    step generates with the runtime's current (initial) policy on step 1's tasks x
    `rollout.group_size`, sampled with step 1's seed. Wherever one is needed
    (`rollout.budget_match`, `agentrl ablate`)."""
    cfg = rt.cfg
    tasks = TaskSampler(rt.spec.tasks("train"), cfg.seed, cfg.rollout.tasks_per_step, cfg.env.name).for_step(1)
    return matched_budget(rt, tasks, cfg.rollout.group_size, step_seed(cfg.seed, 1))


def linear_step_tasks(rt: Runtime, budget: int) -> int:
    """The distinct tasks one linear step of `rt`'s current (initial) policy draws under
    `budget`, from step 1's tasks with step 1's seed (`rollout.matched_budget.matched_tasks`):
    the task count of `rollout.focus_tasks=match`."""
    cfg = rt.cfg
    tasks = TaskSampler(rt.spec.tasks("train"), cfg.seed, cfg.rollout.tasks_per_step).for_step(1)
    return matched_tasks(rt, tasks, budget, step_seed(cfg.seed, 1))

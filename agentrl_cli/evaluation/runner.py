"""Evaluation: n samples per held-out task -> pass@k, pass^k, mean@1 (with its standard error),
tokens per question."""
from __future__ import annotations

import math
from typing import Callable

import torch

from ..engines.base import SamplingParams
from ..envs.base import EnvSpec, Task
from ..metrics import aggregate_pass
from ..models.chat import ChatFormat
from ..rollout.runner import run_episodes
from ..rollout.runtime import build_runtime


def ks_up_to(k_max: int) -> list[int]:
    ks, k = [], 1
    while k <= k_max:
        ks.append(k)
        k *= 2
    if ks[-1] != k_max:
        ks.append(k_max)
    return ks


def task_clustered_se(task_means: list[float]) -> float | None:
    """Standard error of the mean success over held-out tasks, clustered by task: the sample
    std (n - 1) over tasks of each task's mean success, divided by sqrt(number of tasks).

    A check's samples of one task are not independent (they share the task's difficulty), so
    the tasks are the units: with `n` samples per task this is the standard error of `mean@1`
    as an estimate of the success rate on tasks like these. It is larger than the naive
    sqrt(p(1-p)/(tasks x n)) when tasks differ in difficulty. None with fewer than 2 tasks."""
    k = len(task_means)
    if k < 2:
        return None
    m = sum(task_means) / k
    return math.sqrt(sum((x - m) ** 2 for x in task_means) / (k - 1) / k)


def evaluate(engine, fmt: ChatFormat, spec: EnvSpec, tasks: list[Task], n: int,
             params: SamplingParams, max_tokens: int, batch_size: int, seed: int,
             k_max: int = 1, progress: Callable[[int, int], None] | None = None) -> dict:
    """Roll out `n` samples for each task; metrics are averaged over tasks, and `mean@1_se` is
    `mean@1`'s task-clustered standard error (`task_clustered_se`). `progress(done,
    total)` is called after each batch of episodes (the batches `run_episodes` would make, with
    the same generator, so the episodes do not depend on it)."""
    gen = torch.Generator().manual_seed(seed)
    pairs = [(t, i) for i, t in enumerate(tasks) for _ in range(n)]
    eps = []
    for b in range(0, len(pairs), max(1, batch_size)):
        eps += run_episodes(engine, fmt, spec, pairs[b:b + batch_size], params, max_tokens,
                            batch_size, gen)
        if progress is not None:
            progress(len(eps), len(pairs))
    counts = [(n, sum(e.success for e in eps if e.group == i)) for i in range(len(tasks))]
    ks = ks_up_to(min(k_max, n))
    agg = aggregate_pass(counts, ks)
    return {
        "pass@k": {str(k): agg[f"pass@{k}"] for k in ks},
        "pass^k": {str(k): agg[f"pass^{k}"] for k in ks},
        "mean@1": sum(e.success for e in eps) / len(eps),
        "mean@1_se": task_clustered_se([c / n for n, c in counts]),
        "tokens_per_question": sum(e.generated_tokens for e in eps) / len(eps),
        "tool_calls": sum(e.num_tool_calls for e in eps) / len(eps),
        "n": n,
        "tasks": len(tasks),
    }


def run_eval(cfg, n: int, k_max: int, n_tasks: int, greedy: bool = False,
             seed: int | None = None, progress: Callable[[int, int], None] | None = None,
             rt=None) -> dict:
    """`agentrl eval`'s library function: evaluate the policy on the first `n_tasks` held-out
    tasks, `n` samples each (sampling seed: `seed`, else cfg.seed). `rt`: the runtime to
    evaluate (a checkpoint's, opened by the caller: `train.checkpoint.open_checkpoint`), else
    the policy is loaded from config (`rollout.runtime.build_runtime`, `greedy` decoding)."""
    if rt is None:
        rt = build_runtime(cfg, greedy=greedy)
    return evaluate(rt.engine, rt.fmt, rt.spec, rt.spec.tasks("eval", n_tasks), n, rt.params,
                    cfg.rollout.max_tokens, cfg.rollout.batch_size,
                    seed=cfg.seed if seed is None else seed, k_max=k_max, progress=progress)

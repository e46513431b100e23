"""How much a FOCUS tree's states say about their paths' outcomes, beyond the task (`agentrl
diagnose tree-info`): the ceiling on what per-state credit (a critic, refined values) can add
over a per-task baseline (GRPO's group mean), read from the trees a run saved
(`<run>/traces/step-*.json`).

Every pair of finished paths of one task tree shares a prefix: the root, and possibly more
states down to the deepest state both passed through. A continuation launched from state s is
an independent draw of the rest of the episode from s, so two paths whose deepest shared state
is s covary, within their task, by Var(V(s) | task): as much as the state decides the outcome.
Pairs sharing only the root carry none of it. Per bucket of shared depth (0 = the root only,
1-3, 4-6, 7+): the pairs' covariance of outcomes centred on their tree's mean, and that
covariance less the root-only pairs' (which cancels the centring's bias), divided by the
within-task variance of outcomes: the share of a path's within-task outcome variance that
knowing its state at that depth explains (0: the state says nothing the task does not; 1: it
decides the outcome). Beside it, the share of the run's continuations launched from states of
that depth (`focus/launch_share_depthK`, averaged over the run's steps).

Caveat: the allocator chose where to branch after seeing the first path's outcome, so the
pairs are not a random sample of states; the shares are estimates, read together over seeds."""
from __future__ import annotations

import statistics
from pathlib import Path

from ...errors import ConfigError
from ...reporting.run_reader import RunFolder, read_run

BUCKETS = ((0, 0, "0 (root only)"), (1, 3, "1-3"), (4, 6, "4-6"), (7, 10**9, "7+"))


def bucket_of(depth: int) -> int:
    return next(i for i, (lo, hi, _) in enumerate(BUCKETS) if lo <= depth <= hi)


def tree_pairs(tree: dict) -> tuple[list[tuple[int, float]], float | None]:
    """-> ([(bucket of the deepest shared state, centred product of outcomes)] over the tree's
    pairs of finished paths, the tree's within-task variance of outcomes (None under 2 paths))."""
    nodes = {n["id"]: n for n in tree["nodes"]}
    paths = {int(p): ids for p, ids in tree["paths"].items()}
    reward = {p: float(nodes[ids[-1]]["reward"]) for p, ids in paths.items()}
    if len(reward) < 2:
        return [], None
    mean = statistics.fmean(reward.values())
    var = statistics.fmean((r - mean) ** 2 for r in reward.values())
    keys = sorted(paths)
    out = []
    for a, i in enumerate(keys):
        inner = set(paths[i][:-1])
        for j in keys[a + 1:]:
            depth = max(nodes[n]["depth"] for n in paths[j][:-1] if n in inner)
            out.append((bucket_of(depth), (reward[i] - mean) * (reward[j] - mean)))
    return out, var


def launch_shares(run: RunFolder) -> list[float]:
    """The run's mean share of continuations launched per depth bucket (0 where not logged)."""
    share = [0.0] * len(BUCKETS)
    steps = run.steps("focus/continuations")
    for r in steps:
        for k, v in r.items():
            if k.startswith("focus/launch_share_depth"):
                share[bucket_of(int(k.rsplit("depth", 1)[1]))] += v / len(steps)
    return share


def run_info(path: Path) -> dict:
    """One run's per-bucket pairs, covariance, state share and launch share."""
    run = read_run(path, finished=False)
    prods: list[list[float]] = [[] for _ in BUCKETS]
    variances = []
    for trace in run.traces():
        for tree in trace["trees"]:
            pairs, var = tree_pairs(tree)
            if var is None:
                continue
            variances.append(var)
            for b, x in pairs:
                prods[b].append(x)
    if not variances or not prods[0]:
        raise ConfigError(f"{path}: no saved trees with two or more finished paths")
    within = statistics.fmean(variances)
    cov = [statistics.fmean(p) if p else None for p in prods]
    share = [None if c is None else (c - cov[0]) / within for c in cov]
    return {"run": str(path), "trees": len(variances), "within_task_var": within,
            "pairs": [len(p) for p in prods], "cov": cov, "state_share": share,
            "launch_share": launch_shares(run)}


def _fmt(x: float | None, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def report(infos: list[dict]) -> list[str]:
    """The table (one row per run and bucket), then each bucket's state share over the runs."""
    lines = ["| run | trees | within-task var | shared depth | pairs | centred cov "
             "| state share of within-task var | launch share |",
             "|---|---|---|---|---|---|---|---|"]
    for info in infos:
        for b, (_, _, name) in enumerate(BUCKETS):
            lines.append(
                f"| {Path(info['run']).parent.name}/{Path(info['run']).name} | {info['trees']} "
                f"| {info['within_task_var']:.3f} | {name} | {info['pairs'][b]} "
                f"| {_fmt(info['cov'][b], '+.4f')} | {_fmt(info['state_share'][b], '+.2f')} "
                f"| {info['launch_share'][b]:.2f} |")
    for b, (_, _, name) in enumerate(BUCKETS):
        vals = [i["state_share"][b] for i in infos if i["state_share"][b] is not None]
        if len(vals) > 1:
            lines.append(
                f"state share at shared depth {name}: {statistics.fmean(vals):+.2f} ± "
                f"{statistics.stdev(vals) / len(vals) ** 0.5:.2f} over {len(vals)} runs; launch "
                f"share {statistics.fmean(i['launch_share'][b] for i in infos):.2f}")
    return lines

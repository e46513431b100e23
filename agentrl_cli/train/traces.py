"""Traces: a bounded sample of a training step's episodes and FOCUS trees, kept in the run
folder for `agentrl view` (`<run>/traces/step-NNNNNN.json`, the schema in docs/traces.md).

A step is traced at step 1, every `train.trace_every` steps and at the last step (0: never),
by the main rank, after credit is computed and before the update. What is kept:

- the first `MAX_TREES` trees of the step (every node: `Tree.to_json` plus the text of the turn
  that led to it, the observation that followed, the mean advantage its segment trained on and
  the launch order of the continuations started from it) and where the budget went by depth;
- up to `MAX_EPISODES` episodes of those trees' tasks (round robin over the tasks), each with
  every token's text, response mask and advantage (at most `MAX_EPISODE_TOKENS` tokens);
- the critic's values against outcomes: every inner node of every tree (v against the mean
  reward of the leaves below it), or with a token critic and no trees the value before each
  turn against the episode's reward (at most `MAX_CRITIC_POINTS`).

A trace file is at most `TRACE_CAP` bytes: episodes, then trees, are left out from the end
until it fits, and the file says how many (`left_out`).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from ..credit.focus_credit import tree_values
from ..reporting.traces import TRACE_CAP, trace_path
from .run_folder import atomic_write_text

MAX_TREES = 4
MAX_EPISODES = 12
MAX_EPISODE_TOKENS = 4096
MAX_CRITIC_POINTS = 4000
FORMAT = 1


def trace_due(step: int, every: int, last: int) -> bool:
    """Whether step `step` of a run of `last` steps is traced (`train.trace_every` = `every`)."""
    return every > 0 and (step == 1 or step % every == 0 or step == last)


def write_trace(out: Path, step: int, eps: list, batch, trees, fmt, method: str = "",
                algo=None) -> Path:
    """Write the trace of step `step` (module docstring): `eps` the step's episodes, `batch`
    their collated batch with advantages, `trees` the FOCUS trees (None for other
    controllers), `fmt` the chat format (its tokenizer decodes each token), `algo` the run's
    settings the trees' refined values are computed with (`credit.focus_credit.tree_values`;
    None: left out)."""
    trees = list(trees or [])
    rows = _rows_by_path(eps)
    picked_trees = trees[:MAX_TREES]
    groups = [t.group for t in picked_trees] or sorted({e.group for e in eps})[:MAX_TREES]
    picked = _sample_rows(eps, groups)
    text = _token_text(fmt, [eps[i] for i in picked])
    # a continuation's episode starts from its source's tokens, not its task's text
    asked = {e.group: e.question for e in reversed(eps) if e.question}
    data = {
        "format": FORMAT, "step": step, "method": method,
        "episodes_in_step": len(eps), "trees_in_step": len(trees),
        "trees": [tree_json(t, eps, batch, rows, algo) for t in picked_trees],
        "episodes": [episode_json(eps[i], i, batch, text, asked.get(eps[i].group, ""))
                     for i in picked],
        "critic": critic_points(trees, eps, batch),
        "budget_by_depth": budget_by_depth(trees, eps, rows),
    }
    path = trace_path(out, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, fit(data, TRACE_CAP))
    return path


def fit(data: dict, cap: int) -> str:
    """`data` as JSON within `cap` bytes: episodes, then trees, left out from the end."""
    parts = {k: [len(json.dumps(x)) + 2 for x in data[k]] for k in ("episodes", "trees")}
    rest = len(json.dumps({**data, "episodes": [], "trees": []})) + 64
    left = {"episodes": 0, "trees": 0}
    for key in ("episodes", "trees"):
        while data[key] and rest + sum(parts["episodes"]) + sum(parts["trees"]) > cap:
            data[key] = data[key][:-1]
            parts[key].pop()
            left[key] += 1
    data["left_out"] = left
    return json.dumps(data, separators=(",", ":"))


def _rows_by_path(eps: list) -> dict[int, int]:
    """FOCUS path id -> the episode's row in the step's batch."""
    return {int(e.meta.focus_path): i for i, e in enumerate(eps) if e.meta.focus_path is not None}


def _sample_rows(eps: list, groups: list[int]) -> list[int]:
    """Up to MAX_EPISODES rows of the tasks `groups`, round robin over them (rows in order)."""
    per = {g: [i for i, e in enumerate(eps) if e.group == g] for g in groups}
    out: list[int] = []
    while len(out) < MAX_EPISODES and any(per.values()):
        for g in groups:
            if per[g] and len(out) < MAX_EPISODES:
                out.append(per[g].pop(0))
    return sorted(out)


def _token_text(fmt, eps: list) -> dict[int, str]:
    """Each distinct token id of `eps` -> its text (special tokens kept)."""
    ids = sorted({i for e in eps for i in e.token_ids[:MAX_EPISODE_TOKENS]})
    tok = fmt.tokenizer
    return dict(zip(ids, tok.batch_decode([[i] for i in ids], skip_special_tokens=False)))


def _num(x, digits: int = 4):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return round(float(x), digits)


def episode_json(ep, row: int, batch, text: dict[int, str], question: str = "") -> dict:
    """One traced episode (docs/traces.md, "episode"); `question`: the task's, where the
    episode does not hold it."""
    n = min(len(ep.token_ids), MAX_EPISODE_TOKENS)
    adv = batch.advantages[row, :n].tolist() if batch.advantages is not None else [0.0] * n
    mask = [int(m) for m in ep.response_mask[:n]]
    return {
        "row": row, "task_id": ep.task_id, "group": ep.group, "question": ep.question or question,
        "gold_answer": ep.answer, "model_answer": ep.model_answer, "reward": _num(ep.reward),
        "success": bool(ep.success), "finish": ep.finish, "num_tool_calls": ep.num_tool_calls,
        "generated_tokens": ep.generated_tokens, "trained_tokens": sum(mask),
        "path": ep.meta.focus_path, "origin": ep.meta.focus_origin,
        "turns": [{"start": t.start, "end": t.end, "action": t.action,
                   "observation": t.observation, "tool": t.tool, "advantage": _turn_adv(batch, row, t)}
                  for t in ep.turns],
        "tokens": [text.get(i, "") for i in ep.token_ids[:n]],
        "response_mask": mask,
        "advantages": [_num(a) if m else 0 for a, m in zip(adv, mask)],
        "tokens_left_out": len(ep.token_ids) - n,
    }


def _turn_adv(batch, row: int, turn) -> float | None:
    """Mean advantage over the turn's trained tokens in row `row` (None: none trained there)."""
    if batch.advantages is None:
        return None
    m = batch.response_mask[row, turn.start:turn.end]
    if float(m.sum()) == 0:
        return None
    return _num(float((batch.advantages[row, turn.start:turn.end] * m).sum() / m.sum()))


def tree_json(tree, eps: list, batch, rows: dict[int, int], algo=None) -> dict:
    """One traced tree (docs/traces.md, "tree"): `Tree.to_json` with its refined values (from
    `algo`, as credit computed them) and each node's text."""
    data = tree.to_json(tree_values(tree.arrays(), algo) if algo is not None else None)
    order = _launch_order(tree)
    first = eps[rows[tree.nodes[0].path]] if tree.nodes and tree.nodes[0].path in rows else None
    for nd, js in zip(tree.nodes, data["nodes"]):
        row = rows.get(nd.path)
        ep = eps[row] if row is not None else None
        turn = ep.turns[nd.depth - 1] if ep is not None and 0 < nd.depth <= len(ep.turns) else None
        js["action"] = turn.action if turn else None
        js["observation"] = turn.observation if turn else None
        js["advantage"] = _turn_adv(batch, row, turn) if turn else None
        js["launch_order"] = order.get(nd.id, [])
        if nd.terminal and ep is not None:
            js["model_answer"] = ep.model_answer
        js["row"] = row
    data["question"] = first.question if first else None
    data["gold_answer"] = first.answer if first else None
    data["budget_by_depth"] = budget_by_depth([tree], eps, rows)
    return data


def continuations(tree) -> dict[int, int]:
    """Continuation path id -> the node it was launched from. Paths from a node, in path id
    order, are its root paths (the root only: roots are launched before any continuation) and
    then its `launched` continuations."""
    starts: dict[int, list[int]] = {}
    for pid, ids in sorted(tree.paths.items()):
        starts.setdefault(_origin(tree, pid, ids), []).append(pid)
    return {pid: nid for nid, pids in starts.items()
            for pid in pids[len(pids) - tree.nodes[nid].launched:] if tree.nodes[nid].launched}


def _launch_order(tree) -> dict[int, list[int]]:
    """Node id -> the ranks (1, 2, ...) in the tree's launch order (path id order) of the
    continuations started from it."""
    conts = continuations(tree)
    out: dict[int, list[int]] = {}
    for rank, pid in enumerate(sorted(conts), 1):
        out.setdefault(conts[pid], []).append(rank)
    return out


def _origin(tree, pid: int, ids: list[int]) -> int:
    """The node path `pid` was launched from: the deepest of its nodes it did not create."""
    origin = 0
    for i in ids:
        if tree.nodes[i].path != pid:
            origin = i
    return origin


def budget_by_depth(trees: list, eps: list, rows: dict[int, int]) -> list[dict]:
    """Paths and the tokens they generated by the depth of the node they were launched from:
    root paths first (depth None), then continuations per depth."""
    by: dict = {}
    for tree in trees:
        conts = continuations(tree)
        for pid in tree.paths:
            depth = tree.nodes[conts[pid]].depth if pid in conts else None
            row = rows.get(pid)
            d = by.setdefault(depth, {"depth": depth, "paths": 0, "tokens": 0})
            d["paths"] += 1
            d["tokens"] += eps[row].generated_tokens if row is not None else 0
    return sorted(by.values(), key=lambda d: -1 if d["depth"] is None else d["depth"])


def critic_points(trees: list, eps: list, batch) -> dict:
    """The critic's values against outcomes (module docstring), as parallel lists."""
    out = {"source": None, "v": [], "outcome": [], "leaves": [], "depth": []}
    if trees:
        out["source"] = "tree nodes"
        for tree in trees:
            for nd in tree.nodes:
                leaves = _leaf_rewards(tree, nd.id)
                if nd.terminal or nd.v is None or not leaves:
                    continue
                _point(out, nd.v, sum(leaves) / len(leaves), len(leaves), nd.depth)
    elif batch.old_values is not None:
        out["source"] = "turn values"
        for row, ep in enumerate(eps):
            for k, t in enumerate(ep.turns):
                _point(out, float(batch.old_values[row, t.start]), ep.reward, 1, k)
    if len(out["v"]) > MAX_CRITIC_POINTS:
        for key in ("v", "outcome", "leaves", "depth"):
            out[key] = out[key][:MAX_CRITIC_POINTS]
    return out


def _point(out: dict, v: float, outcome: float, leaves: int, depth: int) -> None:
    out["v"].append(_num(v))
    out["outcome"].append(_num(outcome))
    out["leaves"].append(leaves)
    out["depth"].append(depth)


def _leaf_rewards(tree, nid: int) -> list[float]:
    """Rewards of the leaves below node `nid`."""
    stack, out = [nid], []
    while stack:
        nd = tree.nodes[stack.pop()]
        if nd.terminal:
            out.append(float(nd.reward))
        stack.extend(nd.children)
    return out

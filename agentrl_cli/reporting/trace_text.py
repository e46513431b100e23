"""`agentrl view RUN --text`: a traced step, one of its FOCUS trees or one of its episodes as
plain text (the trace schema: docs/traces.md), each followed by a legend of its symbols and
columns (the definitions: docs/methods.md, focus; `credit.refine_values`)."""
from __future__ import annotations

import unicodedata
from pathlib import Path

from ..errors import ConfigError
from .traces import read_trace, trace_steps

WIDTH = 72                        # characters of an action or observation shown in a tree

# (symbol as printed, what it is), per view
STEP_LEGEND = (
    ("--tree K", "the K-th traced FOCUS tree of the step (print it with --tree K): its task, "
                 "nodes (states), paths (root-to-leaf episodes) and continuations (paths "
                 "launched from an inner node)"),
    ("--episode K", "the K-th traced episode (print it with --episode K): its task, reward, "
                    "turns and trained tokens (tokens a loss trains on: response mask 1)"),
    ("of", "traced of the step's total (a trace keeps a sample)"),
)
TREE_LEGEND = (
    ("[i]", "node id; node 0 is the root, depth = turns taken"),
    ("×k [i, j]", "k sibling subtrees that read the same, folded into one (their ids)"),
    ("→", "the policy's action that led to the node → the env's reply (cut to fit)"),
    ("v", "the critic's value V(s) of the node's state"),
    ("Ṽ", "the refined value (κ·v + |C|·Ḡ) / (κ + |C|) over its |C| children, κ = "
          "algo.kappa (with algo.focus_prior=tree the tree's mean outcome stands for v); v "
          "when it has no children yet"),
    ("Ḡ", "the one-step backup: the mean over its children of R (a leaf) or γ·Ṽ (an inner "
          "node), γ = algo.gamma; the critic's regression target"),
    ("n", "the node's completed own samples: the path that created it and the "
          "continuations launched from it"),
    ("c̄", "the mean outcome (reward) of those n samples"),
    ("launched k (#r)", "continuations launched from the node, and their ranks in the "
                        "tree's launch order"),
    ("leaf R", "a leaf: the episode's reward R"),
    ("answered", "the model's final answer at a leaf"),
    ("adv", "the mean advantage over the trained tokens of the action into the node (its "
            "segment)"),
    ("budget by depth", "tokens of root paths, and of continuations by the depth of the node "
                        "they were launched from"),
    ("–", "missing: not recorded, or not a finite number"),
)
EPISODE_LEGEND = (
    ("turn i", "the policy's action (policy:) and the reply of the tool it called "
               "(env: no tool)"),
    ("trained, adv", "the mean advantage over the turn's trained tokens; not trained: none of "
                     "its tokens carries loss"),
    ("reward", "the (shaped) reward, the verifier's verdict (success or failure) and how the "
               "episode ended"),
    ("trained tokens", "tokens a loss trains on (response mask 1)"),
    ("–", "missing: not recorded, or not a finite number"),
)


def text_view(run: Path, step: int | None = None, tree: int | None = None,
              episode: int | None = None) -> str:
    """The text of a run's trace at `step` (default: the last traced step): tree `tree`,
    episode `episode`, or (neither) what the step holds."""
    steps = trace_steps(run)
    if not steps:
        raise ConfigError(f"{run} holds no traces (traces/step-*.json; train.trace_every=0, or "
                          "a run of an older build): the report still shows its curves")
    step = max(steps) if step is None else step
    if step not in steps:
        raise ConfigError(f"no trace of step {step} in {run}; traced steps: "
                          + ", ".join(map(str, steps)))
    data = read_trace(steps[step])
    if tree is not None:
        text = tree_text(_pick(data["trees"], tree, "tree", step), step, tree)
        return text + legend_text(TREE_LEGEND)
    if episode is not None:
        text = episode_text(_pick(data["episodes"], episode, "episode", step), step, episode)
        return text + legend_text(EPISODE_LEGEND)
    return step_text(data) + legend_text(STEP_LEGEND)


def legend_text(legend: tuple) -> str:
    """The legend printed under a view: one symbol a line, with what it is."""
    def width(sym: str) -> int:           # columns: a combining mark (c̄) takes none
        return sum(not unicodedata.combining(c) for c in sym)

    wide = max(width(sym) for sym, _ in legend)
    return "\n\nlegend:\n" + "\n".join(f"  {sym}{' ' * (wide - width(sym))}  {what}"
                                         for sym, what in legend)


def _pick(items: list, k: int, what: str, step: int) -> dict:
    if not 0 <= k < len(items):
        have = f"0-{len(items) - 1}" if items else "none"
        raise ConfigError(f"step {step}'s trace has no {what} {k} (traced {what}s: {have})")
    return items[k]


def _num(x, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def clean(text) -> str:
    """`text` safe for a terminal: control characters (a model's output may hold escape
    sequences) written as \\xNN, newlines kept."""
    return "".join(c if c.isprintable() or c == "\n" else f"\\x{ord(c):02x}" for c in ("" if text is None else str(text)))


def _short(text, width: int = WIDTH) -> str:
    text = " ".join(clean(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def step_text(data: dict) -> str:
    """What a traced step holds: its trees and episodes, one line each."""
    lines = [f"step {data['step']} ({clean(data.get('method')) or 'run'}): {len(data['trees'])} of "
             f"{data.get('trees_in_step', 0)} trees, {len(data['episodes'])} of "
             f"{data.get('episodes_in_step', 0)} episodes traced"]
    for k, t in enumerate(data["trees"]):
        conts = sum(nd.get("launched") or 0 for nd in t["nodes"])
        lines.append(f"  --tree {k}: {clean(t.get('task_id'))}  {len(t['nodes'])} nodes, "
                     f"{len(t.get('paths', {}))} paths, {conts} continuations")
    for k, e in enumerate(data["episodes"]):
        lines.append(f"  --episode {k}: {clean(e.get('task_id'))}  reward {_num(e.get('reward'))}  "
                     f"{len(e.get('turns', []))} turns  {e.get('trained_tokens') or 0} trained tokens")
    return "\n".join(lines)


def node_line(nd: dict) -> str:
    """One node: what led to it, its values and evidence, its continuations' launch order."""
    if nd.get("parent", -1) < 0:
        head = "root"
    else:
        head = _short(nd.get("action"), WIDTH // 2)
        if nd.get("observation"):
            head += f" → {_short(nd['observation'], WIDTH // 2)}"
    if nd.get("reward") is not None:
        tail = f"leaf R {_num(nd['reward'])}"
        if nd.get("model_answer"):
            tail += f"  answered {_short(nd['model_answer'], 24)}"
    else:
        tail = (f"v {_num(nd.get('v'))}  Ṽ {_num(nd.get('V_tilde'))}  Ḡ {_num(nd.get('G_bar'))}  "
                f"n {nd.get('n') or 0}  c̄ {_num(nd.get('cbar'))}")
        if nd.get("launched"):
            order = ", ".join(f"#{r}" for r in nd.get("launch_order", []))
            tail += f"  launched {nd['launched']} ({order})"
    if nd.get("advantage") is not None:
        tail += f"  adv {nd['advantage']:+.3f}"
    return f"{head}  ·  {tail}"


def _render(nodes: list[dict], nid: int, ids: bool, label: str, memo: dict) -> list[str]:
    """Node `nid` and its subtree, with node ids when `ids`, its first line after `label`;
    siblings whose subtrees read the same (ids aside) fold into one, labelled with their count
    and ids. Each subtree is rendered once (`memo`), so a deep tree takes linear time."""
    if (nid, ids) not in memo:
        memo[nid, ids] = _subtree(nodes, nid, ids, memo)
    lines = memo[nid, ids]
    return [label + lines[0], *lines[1:]]


def _subtree(nodes: list[dict], nid: int, ids: bool, memo: dict) -> list[str]:
    out = [node_line(nodes[nid])]
    groups: dict[tuple, list[int]] = {}
    for c in nodes[nid].get("children", []):
        groups.setdefault(tuple(_render(nodes, c, False, "", memo)), []).append(c)
    items = list(groups.values())
    for i, same in enumerate(items):
        tag = f"×{len(same)} " if len(same) > 1 else ""
        if ids:
            tag += f"[{', '.join(map(str, same))}] "
        sub = _render(nodes, same[0], ids, tag, memo)
        last = i == len(items) - 1
        out.append(("└─ " if last else "├─ ") + sub[0])
        out += [("   " if last else "│  ") + line for line in sub[1:]]
    return out


def tree_text(tree: dict, step: int, k: int) -> str:
    """A traced tree: the task, then every node by depth (module docstring of trace_text)."""
    nodes = tree["nodes"]
    conts = sum(nd.get("launched") or 0 for nd in nodes)
    lines = [f"step {step} · tree {k} · task {clean(tree.get('task_id'))} · {len(nodes)} nodes, "
             f"{len(tree.get('paths', {}))} paths, {conts} continuations",
             f"question: {_short(tree.get('question'), 200)}",
             f"gold answer: {clean(tree.get('gold_answer'))}"]
    if nodes:
        lines += _render(nodes, 0, True, "[0] ", {})
    budget = tree.get("budget_by_depth") or []
    if budget:
        lines.append("budget by depth: " + ", ".join(
            f"{'roots' if b['depth'] is None else 'depth ' + str(b['depth'])}: "
            f"{b['paths']} paths, {b['tokens']} tokens" for b in budget))
    return "\n".join(lines)


def episode_text(ep: dict, step: int, k: int) -> str:
    """A traced episode: the task, each turn (action, tool, observation, the advantage its
    trained tokens carry), the outcome."""
    lines = [f"step {step} · episode {k} · task {clean(ep.get('task_id'))} · reward "
             f"{_num(ep.get('reward'))} ({'success' if ep.get('success') else 'failure'}, "
             f"{clean(ep.get('finish'))}) · {ep.get('trained_tokens') or 0} trained tokens",
             f"question: {clean(ep.get('question'))}"]
    for i, t in enumerate(ep.get("turns", [])):
        adv = "not trained" if t.get("advantage") is None else f"trained, adv {t['advantage']:+.3f}"
        lines.append(f"turn {i} ({adv}) policy: {clean(t.get('action'))}")
        if t.get("observation"):
            obs = clean(t["observation"]).replace("\n", "\n" + " " * 10)
            lines.append(f"        {clean(t.get('tool') or 'env')}: {obs}")
    lines += [f"model answer: {clean(ep.get('model_answer')) or '–'}",
              f"gold answer: {clean(ep.get('gold_answer'))}"]
    return "\n".join(lines)

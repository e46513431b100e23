"""The trace schema (docs/traces.md), checked before `agentrl view` shows a trace: every field
the page and `--text` read has its type, a tree's nodes form a tree (node 0 the root, each
parent listed before its children, depth one more than the parent's, at most MAX_TREE_DEPTH),
and an episode's token lists have one entry per token. A trace that does not match is refused
with the first field that does not, e.g. `trees[0].nodes[3].parent: not a number`.

Missing optional fields are allowed (they show as missing); non-finite numbers were already
read as missing (`folder_reader.loads`)."""
from __future__ import annotations

from typing import Callable

MAX_TREE_DEPTH = 200              # turns below a tree's root
MAX_EPISODE_TOKENS = 16_384       # tokens of one traced episode (the trainer keeps 4,096)
MAX_CRITIC_POINTS = 20_000        # critic points of one trace (the trainer keeps 4,000)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _scalar(x) -> bool:
    return x is None or isinstance(x, (str, int, float))


def _opt(ok: Callable) -> Callable:
    return lambda x: x is None or ok(x)


def _list_of(ok: Callable) -> Callable:
    return lambda x: isinstance(x, list) and all(ok(y) for y in x)


# field -> (check, what it must be, required)
_NUM, _OPT_NUM, _INT, _OPT_INT = (_number, "a number"), (_opt(_number), "a number or null"), \
    (_int, "an integer"), (_opt(_int), "an integer or null")
_TEXT, _INTS = (_scalar, "text"), (_list_of(_int), "a list of integers")
_BUDGET = (_list_of(lambda b: isinstance(b, dict) and _opt(_int)(b.get("depth"))
                    and _int(b.get("paths")) and _int(b.get("tokens"))),
           "a list of {depth, paths, tokens}")
_LIST = (lambda x: isinstance(x, list), "a list")
TRACE = {"step": (*_INT, True), "method": (*_TEXT, False), "trees": (*_LIST, True),
         "episodes": (*_LIST, True), "episodes_in_step": (*_INT, False),
         "trees_in_step": (*_INT, False), "budget_by_depth": (*_BUDGET, False),
         "critic": (_opt(lambda c: isinstance(c, dict)), "an object or null", False)}
TREE = {"nodes": (lambda x: isinstance(x, list) and len(x) > 0, "a list of nodes", True),
        "paths": (lambda x: isinstance(x, dict) and all(map(_list_of(_int), x.values())),
                  "an object of node-id lists", False),
        "budget_by_depth": (*_BUDGET, False),
        **{k: (*_TEXT, False) for k in ("task_id", "group", "question", "gold_answer")}}
NODE = {"id": (*_INT, True), "parent": (*_INT, True), "depth": (*_INT, True),
        "children": (*_INTS, True), "launch_order": (*_INTS, False),
        **{k: (*_OPT_NUM, False) for k in ("v", "V_tilde", "G_bar", "cbar", "g", "reward",
                                           "advantage")},
        **{k: (*_OPT_INT, False) for k in ("n", "launched", "path", "row", "position",
                                           "tool_calls")},
        **{k: (*_TEXT, False) for k in ("action", "observation", "model_answer")}}
EPISODE = {"tokens": (_list_of(lambda t: isinstance(t, str)), "a list of strings", True),
           "response_mask": (_list_of(lambda m: m in (0, 1)), "a list of 0 and 1", True),
           "advantages": (_list_of(_opt(_number)), "a list of numbers", True),
           "turns": (_list_of(lambda t: isinstance(t, dict)), "a list of objects", True),
           "reward": (*_OPT_NUM, False),
           **{k: (*_OPT_INT, False) for k in ("row", "path", "origin", "num_tool_calls",
                                              "generated_tokens", "trained_tokens",
                                              "tokens_left_out")},
           **{k: (*_TEXT, False) for k in ("task_id", "group", "question", "gold_answer",
                                           "model_answer", "finish", "success")}}
TURN = {"advantage": (*_OPT_NUM, False), "start": (*_OPT_INT, False), "end": (*_OPT_INT, False),
        **{k: (*_TEXT, False) for k in ("action", "observation", "tool")}}
CRITIC = {"source": (*_TEXT, False), "v": (_list_of(_opt(_number)), "a list of numbers", True),
          "outcome": (_list_of(_opt(_number)), "a list of numbers", True),
          "leaves": (_list_of(_opt(_int)), "a list of integers", True),
          "depth": (_list_of(_opt(_int)), "a list of integers", True)}


def fields(obj, spec: dict, where: str) -> None:
    """`obj` is an object whose fields match `spec`; else ValueError naming the field."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: not an object")
    for key, (ok, what, required) in spec.items():
        if key not in obj:
            if required:
                raise ValueError(f"{where}.{key}: missing")
        elif not ok(obj[key]):
            raise ValueError(f"{where}.{key}: not {what}")


def check_tree(tree, where: str) -> None:
    fields(tree, TREE, where)
    nodes = tree["nodes"]
    for i, nd in enumerate(nodes):
        fields(nd, NODE, f"{where}.nodes[{i}]")
        at = f"{where}.nodes[{i}]"
        if nd["id"] != i:
            raise ValueError(f"{at}.id: {nd['id']}, not its place {i}")
        if (nd["parent"] != -1) if i == 0 else not 0 <= nd["parent"] < i:
            raise ValueError(f"{at}.parent: {nd['parent']} (the root is node 0 and a parent "
                             "comes before its children)")
        depth = 0 if i == 0 else nodes[nd["parent"]]["depth"] + 1
        if nd["depth"] != depth or depth > MAX_TREE_DEPTH:
            raise ValueError(f"{at}.depth: {nd['depth']} (its parent's depth + 1, at most "
                             f"{MAX_TREE_DEPTH})")
        if any(not 0 < c < len(nodes) or nodes[c].get("parent") != i for c in nd["children"]):
            raise ValueError(f"{at}.children: not the nodes whose parent it is")
    if sorted(c for nd in nodes for c in nd["children"]) != list(range(1, len(nodes))):
        raise ValueError(f"{where}.nodes: every node but the root is the child of one node")
    if any(not 0 <= k < len(nodes) for ids in tree.get("paths", {}).values() for k in ids):
        raise ValueError(f"{where}.paths: a node id that is not in the tree")


def check_episode(ep, where: str) -> None:
    fields(ep, EPISODE, where)
    n = len(ep["tokens"])
    if n > MAX_EPISODE_TOKENS or len(ep["response_mask"]) != n or len(ep["advantages"]) != n:
        raise ValueError(f"{where}: tokens, response_mask and advantages must have one entry "
                         f"per token (at most {MAX_EPISODE_TOKENS})")
    for k, turn in enumerate(ep["turns"]):
        fields(turn, TURN, f"{where}.turns[{k}]")


def check_critic(critic, where: str = "critic") -> None:
    fields(critic, CRITIC, where)
    n = len(critic["v"])
    if n > MAX_CRITIC_POINTS or any(len(critic[k]) != n for k in ("outcome", "leaves", "depth")):
        raise ValueError(f"{where}: v, outcome, leaves and depth must have one entry per point "
                         f"(at most {MAX_CRITIC_POINTS})")


def check_trace(data) -> None:
    """`data` matches the trace schema (module docstring); else ValueError naming the first
    field that does not."""
    fields(data, TRACE, "trace")
    for i, tree in enumerate(data["trees"]):
        check_tree(tree, f"trees[{i}]")
    for i, ep in enumerate(data["episodes"]):
        check_episode(ep, f"episodes[{i}]")
    if data.get("critic") is not None:
        check_critic(data["critic"])

"""BFCL multi-turn (v4) as TextEnvs, over the data and executable backends of `bfcl-eval`.

Nothing of BFCL is copied into this repository: questions, ground truth, function docs and the
backend classes (file system, trading bot, travel booking, ...) are loaded from wherever the
`bfcl-eval` package is installed (install it with `pip install --no-deps bfcl-eval==2026.3.23`;
its own dependency pins are for its model handlers, which are not imported here).

Registered envs (one per multi-turn category, 200 tasks each, one split: "eval"):
  bfcl-multi-turn-base, bfcl-multi-turn-miss-func, bfcl-multi-turn-miss-param,
  bfcl-multi-turn-long-context

Episode = one BFCL entry: several user turns. The env's system prompt is BFCL's default prompt for
prompting (non-FC) models with the task's function docs (JSON); the first user turn is the prompt.
Action syntax (one complete assistant message per step), as BFCL's prompt tells the model:
  [f(a=1), g(b='x')]   function calls (a bare `f(a=1)` also works; ``` fences are stripped).
                       Each call runs on the task's backend instances, in order; the observation
                       is the backends' real output (one call: its result; several: one line
                       `call -> result` each). Keyword arguments with literal values only.
  any text without a call (or `[]`) ends the current user turn: the observation is the next
                       user message (`User: ...`); after the last turn the episode terminates.
A message that tries to be a call but does not parse (syntax error, positional or non-literal
arguments) is an error observation and counts as a step of the turn.

Success is BFCL's own multi-turn check, turn by turn, with its `state_checker` and
`response_checker` (imported from `bfcl_eval`): when the model ends user turn t, the turn's
ground-truth calls run on a separate set of ground-truth backends; if the turn has ground truth,
the model must have made a call in it, every public attribute of every backend must equal the
ground truth's, and every ground-truth result of the turn must appear among all the model's
results so far. More than `max_turns` call messages in one user turn fails the task (BFCL
force-terminates after 20 steps). The reward (1 or 0) comes when the last turn ends.

Departures from BFCL's harness, all on malformed output: BFCL ends the turn on an undecodable
message, drops positional arguments silently and turns bare names into strings; here the first
two are error observations and non-literal arguments are errors too (calls never go through
`eval`). Turns in miss_func that reveal held-out functions get BFCL's prompting-mode user message
(the function docs followed by "I have updated some more functions ...").
"""
from __future__ import annotations

import ast
import copy
import functools
import importlib
import importlib.util
import inspect
import itertools
import json
import random
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .base import ENVS, StepResult, Task, env_factory

__all__ = [
    "BFCL_VERSION",
    "CATEGORIES",
    "BfclEnv",
    "BfclSpec",
    "Call",
    "bfcl_available",
    "load_entries",
    "parse_calls",
    "make_bfcl_spec",
]

BFCL_VERSION = "2026.3.23"
"""The `bfcl-eval` release this adapter is written and tested against (pinned in CI)."""
INSTALL_HINT = f"pip install --no-deps bfcl-eval=={BFCL_VERSION}"
CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
END_OF_TURN = "I have done what I can for this request."
# BFCL refuses to run calls with these names (multi_turn_utils.execute_multi_turn_func_call)
_FORBIDDEN = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")


def bfcl_available() -> bool:
    return importlib.util.find_spec("bfcl_eval") is not None


def _package_dir() -> Path:
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"BFCL envs need the bfcl-eval package: {INSTALL_HINT}")
    return Path(list(spec.submodule_search_locations)[0])


def _data_file(folder: Path, category: str) -> Path:
    hits = sorted(folder.glob(f"BFCL_v*_multi_turn_{category}.json"))
    if not hits:
        raise ConfigError(f"bfcl-eval at {folder.parent} has no multi_turn_{category} data; "
                          f"{INSTALL_HINT}")
    return hits[-1]


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@functools.lru_cache(maxsize=None)
def _func_docs(class_name: str) -> tuple[dict, ...]:
    # deferred: optional extra (bfcl_eval)
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    path = _package_dir() / "data" / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    return tuple(_read_jsonl(path))


@functools.lru_cache(maxsize=None)
def load_entries(category: str) -> tuple[dict, ...]:
    """The category's entries: BFCL's question file joined with its ground truth by id, plus
    `functions` (docs shown from the start) and `holdout` ({turn: docs revealed at that turn}),
    built as BFCL's `populate_test_cases_with_predefined_functions` does."""
    if category not in CATEGORIES:
        raise ConfigError(f"unknown BFCL category '{category}'; valid: {', '.join(CATEGORIES)}")
    data = _package_dir() / "data"
    questions = _read_jsonl(_data_file(data, category))
    answer_file = _data_file(data / "possible_answer", category)
    answers = {a["id"]: a["ground_truth"] for a in _read_jsonl(answer_file)}
    out = []
    for q in questions:
        e = copy.deepcopy(q)
        e["ground_truth"] = answers[e["id"]]
        docs = [dict(d) for c in e["involved_classes"] for d in _func_docs(c)]
        holdout: dict[int, list[dict]] = {}
        for turn, names in (e.get("missed_function") or {}).items():
            for name in names:
                i = next(i for i, d in enumerate(docs) if d["name"] == name)
                holdout.setdefault(int(turn), []).append(docs.pop(i))
        e["functions"], e["holdout"] = docs, holdout
        out.append(e)
    return tuple(out)


def system_prompt(functions: list[dict]) -> str:
    """BFCL's default system prompt for prompting models (python calls, no tags, JSON docs,
    plaintext, classic style), built from the package's own templates."""
    # deferred: optional extra (bfcl_eval)
    from bfcl_eval.constants.default_prompts import (OUTPUT_FORMAT_MAPPING, PARAM_TYPE_MAPPING,
                                                     PROMPT_STYLE_TEMPLATES,
                                                     PROMPT_TEMPLATE_MAPPING)

    style = PROMPT_STYLE_TEMPLATES["classic"]
    return PROMPT_TEMPLATE_MAPPING["plaintext"].format(
        persona=style["persona"],
        task=style["task"],
        tool_call_format=style["tool_call_no_tag"].format(
            output_format=OUTPUT_FORMAT_MAPPING["python"], param_types=PARAM_TYPE_MAPPING["python"]),
        multiturn_behavior=style["multiturn_behavior"],
        available_tools=style["available_tools"].format(
            format="json", functions=json.dumps(functions, indent=4)),
    )


def _holdout_message(docs: list[dict]) -> str:
    # deferred: optional extra (bfcl_eval)
    from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING

    return DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=docs)


# ------------------------------------------------------------------------------------ calls
class Call:
    """One parsed call: a plain name, literal positional and keyword arguments."""

    __slots__ = ("name", "args", "kwargs")

    def __init__(self, name: str, args: tuple = (), kwargs: dict | None = None):
        self.name, self.args, self.kwargs = name, tuple(args), dict(kwargs or {})

    def __str__(self) -> str:
        """BFCL's decoded form (`decoded_output_to_execution_list`: `name(k=repr(v), ...)`)."""
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.name}({', '.join(parts)})"

    def __repr__(self) -> str:
        return f"Call({self})"


def _parse_call(node: ast.AST, positional: bool) -> Call:
    if not isinstance(node, ast.Call):
        raise ValueError("expected a function call such as f(a=1)")
    parts = []
    f = node.func
    while isinstance(f, ast.Attribute):
        parts.append(f.attr)
        f = f.value
    if not isinstance(f, ast.Name):
        raise ValueError("a function name must be a plain name")
    name = ".".join([f.id, *reversed(parts)])
    if node.args and not positional:
        raise ValueError(f"{name}: use keyword arguments (name=value), not positional ones")
    if any(k.arg is None for k in node.keywords):
        raise ValueError(f"{name}: ** arguments are not supported")
    try:
        args = tuple(ast.literal_eval(a) for a in node.args)
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(f"{name}: argument values must be literals (strings, numbers, "
                         "lists, dicts, True/False/None)") from None
    return Call(name, args, kwargs)


def parse_calls(text: str, positional: bool = False) -> list[Call] | None:
    """The calls in one assistant message; None when it holds no call attempt (the message ends
    the turn); raises ValueError when it tries to call but is malformed.

    Like BFCL's `default_decode_execute_prompting`: backticks, newlines and spaces are stripped
    from both ends, an opening "```python" tag is dropped, and the text is read as a Python list
    of calls (brackets added if missing). `positional=True` is for BFCL's own ground truth."""
    s = text.strip("`\n ")
    if s.startswith("python") and ("\n" in s[:8] or s[6:7] in (" ", "[")):
        s = s[6:].strip("`\n ")
    if not s or s == "[]":
        return None
    looks_like_call = s.startswith("[") or _starts_with_call(s)
    if not looks_like_call:
        return None
    body = s if s.startswith("[") else f"[{s}]"
    if not body.endswith("]"):
        body += "]"
    try:
        tree = ast.parse(body, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        raise ValueError(f"cannot parse the function calls ({getattr(e, 'msg', e)})") from None
    if not isinstance(tree, (ast.List, ast.Tuple)):
        raise ValueError("expected a list of function calls [f(a=1), g(b=2)]")
    if not tree.elts:
        return None
    return [_parse_call(el, positional) for el in tree.elts]


def _starts_with_call(s: str) -> bool:
    i = 0
    while i < len(s) and (s[i].isalnum() or s[i] in "_."):
        i += 1
    return i > 0 and (s[0].isalpha() or s[0] == "_") and s[i:].lstrip(" ").startswith("(")


# -------------------------------------------------------------------------------- backends
def _new_backends(entry: dict) -> dict[str, Any]:
    """Fresh backend instances with the entry's initial state, as BFCL builds them."""
    # deferred: optional extra (bfcl_eval)
    from bfcl_eval.constants.executable_backend_config import (CLASS_FILE_PATH_MAPPING,
                                                               STATELESS_CLASSES)

    long_context = "long_context" in entry["id"] or "composite" in entry["id"]
    out = {}
    for cls_name in entry["involved_classes"]:
        obj = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[cls_name]), cls_name)()
        if cls_name not in STATELESS_CLASSES:
            obj._load_scenario(copy.deepcopy(entry["initial_config"].get(cls_name, {})),
                               long_context=long_context)
        out[cls_name] = obj
    return out


def _method_table(backends: dict[str, Any]) -> dict[str, str]:
    """Public method name -> class name (a later class wins a shared name, as in BFCL)."""
    table = {}
    for cls_name, obj in backends.items():
        for name, _ in inspect.getmembers(obj, predicate=inspect.ismethod):
            if not name.startswith("_"):
                table[name] = cls_name
    return table


def _execute(backends: dict[str, Any], call: Call) -> str:
    """Run one call; the result as BFCL's executor renders it (errors included)."""
    table = _method_table(backends)
    if call.name.split(".")[-1] in _FORBIDDEN:
        return f"Error during execution: Function call {call.name.split('.')[-1]} is not allowed."
    if call.name not in table:
        return f"Error during execution: name '{call.name}' is not defined"
    try:
        result = getattr(backends[table[call.name]], call.name)(*call.args, **call.kwargs)
    except Exception as e:  # noqa: BLE001  (a backend error is the call's result, as in BFCL)
        return f"Error during execution: {e}"
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


def _checker():
    # deferred: optional extra (bfcl_eval)
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (response_checker,
                                                                           state_checker)

    return state_checker, response_checker


# ------------------------------------------------------------------------------------- env
class BfclEnv:
    """One BFCL multi-turn episode. Implements the TextEnv protocol (see the module docstring)."""

    system_prompt = ""   # BFCL's prompt with the task's function docs, set by reset()

    def __init__(self, entries: dict[str, dict], max_turns: int = 20):
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.entries = entries
        self.max_turns = max_turns          # call messages allowed per user turn
        self.task: Task | None = None
        self._state: dict = {}

    # The whole episode state lives in `_state` (backends included), so snapshot/restore is
    # one deep copy of it.
    @property
    def entry(self) -> dict:
        return self.entries[self.task.task_id]

    @property
    def turn(self) -> int:
        """Index of the current user turn."""
        return self._state["turn"]

    @property
    def history(self) -> list[dict]:
        """Per step: {"action", "kind" (calls | error | end), "observation"}."""
        return self._state["history"]

    @property
    def failure(self) -> dict | None:
        """BFCL's first failing check so far ({"error_type", "error_message"}), or None."""
        return self._state["failure"]

    @property
    def decoded(self) -> list[list[list[str]]]:
        """The model's calls per user turn, per call message, in BFCL's decoded form."""
        return self._state["decoded"]

    @property
    def done(self) -> bool:
        return bool(self._state) and (self._state["terminated"] or self._state["truncated"])

    def reset(self, task: Task) -> str:
        if task.task_id not in self.entries:
            raise ValueError(f"task {task.task_id} is not a task of this env")
        self.task = task
        entry = self.entry
        self.system_prompt = system_prompt(entry["functions"])
        self._state = {
            "backends": _new_backends(entry),        # the model's world
            "gt_backends": _new_backends(entry),     # ground truth, advanced turn by turn
            "turn": 0,                               # current user turn
            "turn_steps": 0,                         # call messages in the current user turn
            "decoded": [[]],                         # per turn, per call message: call strings
            "results": [],                           # every result of the model's calls so far
            "failure": None,                         # BFCL's first failing check (dict) or None
            "history": [],                           # per step: action, kind, observation
            "steps": 0,
            "terminated": False,
            "truncated": False,
        }
        return self._user_message(0)

    def _user_message(self, turn: int) -> str:
        entry = self.entry
        if turn in entry["holdout"]:
            return _holdout_message(entry["holdout"][turn])
        return "\n".join(m["content"] for m in entry["question"][turn])

    def step(self, action: str) -> StepResult:
        s = self._state
        if self.task is None or self.done:
            why = "call reset() first" if self.task is None else "the episode is over"
            return StepResult(f"error: {why}", 0.0, bool(s and s["terminated"]),
                              bool(s and s["truncated"]),
                              {"tool": None, "error": True, "success": False})
        s["steps"] += 1
        info: dict[str, Any] = {"turn": s["turn"], "steps": s["steps"]}
        try:
            calls = parse_calls(action if isinstance(action, str) else "")
        except ValueError as e:
            calls, error = [], (f"error: {e}. Write [func(param=value), ...] or reply in plain "
                                "text to end the turn.")
        else:
            error = None
        if calls is None:  # no call: the user turn ends
            return self._end_turn(action, info)
        s["turn_steps"] += 1
        if error is not None:
            obs = error
            info.update(tool=None, error=True)
        else:
            results = [_execute(s["backends"], c) for c in calls]
            s["decoded"][s["turn"]].append([str(c) for c in calls])
            s["results"] += results
            obs = results[0] if len(calls) == 1 else "\n".join(
                f"{c} -> {r}" for c, r in zip(calls, results))
            info.update(tool=calls[0].name, calls=len(calls), error=False)
        s["history"].append({"action": action, "kind": "error" if error else "calls",
                             "observation": obs})
        if s["turn_steps"] > self.max_turns:  # BFCL: force-terminated, the whole entry fails
            s["truncated"] = True
            if s["failure"] is None:
                s["failure"] = {"error_type": "multi_turn:force_terminated",
                                "error_message": f"more than {self.max_turns} call messages "
                                                 f"in turn {s['turn']}"}
            info.update(success=False, failure=s["failure"]["error_type"])
            return StepResult(obs, 0.0, False, True, info)
        return StepResult(obs, 0.0, False, False, info)

    def _end_turn(self, action: str, info: dict) -> StepResult:
        s = self._state
        t = s["turn"]
        self._check_turn(t)
        s["turn"], s["turn_steps"] = t + 1, 0
        info.update(tool=None, error=False, end_of_turn=True)
        if s["turn"] >= len(self.entry["question"]):
            s["terminated"] = True
            success = s["failure"] is None
            info.update(success=success)
            if not success:
                info["failure"] = s["failure"]["error_type"]
            s["history"].append({"action": action, "kind": "end", "observation": ""})
            return StepResult("", 1.0 if success else 0.0, True, False, info)
        s["decoded"].append([])
        obs = "User: " + self._user_message(s["turn"])
        s["history"].append({"action": action, "kind": "end", "observation": obs})
        return StepResult(obs, 0.0, False, False, info)

    def _check_turn(self, t: int) -> None:
        """BFCL's multi_turn_checker for turn t (its loop body), on the live backends."""
        s = self._state
        gt_calls = self.entry["ground_truth"][t]
        gt_results = [_execute(s["gt_backends"], c) for c in _gt_calls(self.entry["id"], t, gt_calls)]
        if s["failure"] is not None or not gt_calls:
            return
        if not s["decoded"][t]:
            s["failure"] = {"error_type": "multi_turn:empty_turn_model_response",
                            "error_message": f"Model response list is empty for turn {t}"}
            return
        state_checker, response_checker = _checker()
        res = state_checker(s["backends"], s["gt_backends"])
        if res["valid"]:
            res = response_checker(s["results"], gt_results, t)
        if not res["valid"]:
            s["failure"] = {"error_type": res["error_type"], "error_message": res["error_message"]}

    def snapshot(self) -> Any:
        return copy.deepcopy({"task": self.task, "system_prompt": self.__dict__.get("system_prompt"),
                              "state": self._state})

    def restore(self, state: Any) -> None:
        s = copy.deepcopy(state)
        self.task, self._state = s["task"], s["state"]
        if s["system_prompt"] is not None:
            self.system_prompt = s["system_prompt"]


@functools.lru_cache(maxsize=None)
def _gt_parsed(entry_id: str, turn: int, calls: tuple[str, ...]) -> tuple[Call, ...]:
    out = []
    for c in calls:
        parsed = parse_calls(c, positional=True)
        if not parsed or len(parsed) != 1:
            raise ValueError(f"{entry_id}: unparsable ground-truth call {c!r}")
        out.append(parsed[0])
    return tuple(out)


def _gt_calls(entry_id: str, turn: int, calls: list[str]) -> tuple[Call, ...]:
    return _gt_parsed(entry_id, turn, tuple(calls))


def _as_keywords(call: Call, backends: dict[str, Any]) -> Call:
    """A ground-truth call with its positional arguments named (models must use keywords)."""
    if not call.args:
        return call
    cls_name = _method_table(backends).get(call.name)
    if cls_name is None:
        return call
    sig = inspect.signature(getattr(backends[cls_name], call.name))
    bound = sig.bind(*call.args, **call.kwargs)
    return Call(call.name, (), dict(bound.arguments))


# ------------------------------------------------------------------------------------ spec
class BfclSpec:
    """A BFCL multi-turn category: tasks in file order (one "eval" split) and the expert."""

    def __init__(self, category: str, seed: int = 0, max_turns: int = 20):
        self.category = category
        self.name = "bfcl-multi-turn-" + category.replace("_", "-")
        self.seed = int(seed)              # BFCL's data and backends are fixed; kept for the API
        self.max_turns = int(max_turns)
        self._entries = {e["id"]: e for e in load_entries(category)}
        self._tasks = tuple(
            Task(task_id=e["id"], prompt="\n".join(m["content"] for m in e["question"][0]),
                 answer=json.dumps(e["ground_truth"]),
                 meta={"category": category, "turns": len(e["question"]),
                       "classes": list(e["involved_classes"])})
            for e in self._entries.values())

    def make(self) -> BfclEnv:
        return BfclEnv(self._entries, self.max_turns)

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        if split == "train":
            raise ConfigError(f"{self.name} has only an eval split (BFCL is a test suite): it "
                              "cannot train a model or build the tiny one; train on another env, "
                              "and evaluate or roll out here with a model folder (--model) or "
                              "--policy expert")
        if split != "eval":
            raise ConfigError(f"unknown split '{split}'; valid: eval")
        return list(self._tasks if n is None else self._tasks[:n])

    def expert(self, env: BfclEnv, rng: random.Random, error_rate: float = 0.0) -> str:
        """Replay the ground truth: the current user turn's calls (keyword form), one call per
        message (several per message only when the turn has more calls than `max_turns`), then
        a plain-text message that ends the turn. With `error_rate` e, each ground-truth call is
        skipped with probability e (an imperfect demonstrator)."""
        if env.task is None or env.done:
            return END_OF_TURN
        s = env._state
        t = s["turn"]
        gt = _gt_calls(env.task.task_id, t, env.entry["ground_truth"][t])
        sent = s.setdefault("expert_sent", {}).setdefault(t, 0)
        if sent >= len(gt):
            return END_OF_TURN
        per_msg = -(-len(gt) // self.max_turns)
        chunk = list(gt[sent:sent + per_msg])
        s["expert_sent"][t] = sent + len(chunk)
        if error_rate > 0:
            chunk = [c for c in chunk if rng.random() >= error_rate]
            if not chunk:
                return self.expert(env, rng, error_rate)
        calls = [_as_keywords(c, s["backends"]) for c in chunk]
        return str(calls[0]) if len(calls) == 1 else "[" + ", ".join(map(str, calls)) + "]"


# ---------------------------------------------------------------------------- verification
_REF_IDS = itertools.count()


def ground_truth_plan(entry: dict) -> list[list[Call]]:
    """The entry's ground-truth calls per user turn, with arguments named (keyword form)."""
    backends = _new_backends(entry)
    return [[_as_keywords(c, backends) for c in _gt_calls(entry["id"], t, calls)]
            for t, calls in enumerate(entry["ground_truth"])]


def corrupt_plan(plan: list[list[Call]], rng: random.Random,
                 kind: str = "drop") -> list[list[Call]] | None:
    """A copy of `plan` with one call dropped (`kind="drop"`) or one scalar argument changed
    (`"change"`: strings get a suffix, numbers +1, booleans flipped); None if nothing applies."""
    spots = [(t, i) for t, calls in enumerate(plan) for i, c in enumerate(calls)
             if kind == "drop" or any(isinstance(v, (str, int, float)) for v in c.kwargs.values())]
    if kind not in ("drop", "change"):
        raise ValueError(f"unknown corruption '{kind}'; valid: drop, change")
    if not spots:
        return None
    t, i = rng.choice(spots)
    out = [list(calls) for calls in plan]
    if kind == "drop":
        del out[t][i]
        return out
    c = out[t][i]
    keys = [k for k, v in c.kwargs.items() if isinstance(v, (str, int, float))]
    k = rng.choice(keys)
    v = c.kwargs[k]
    new = (not v) if isinstance(v, bool) else v + "_x" if isinstance(v, str) else v + 1
    out[t][i] = Call(c.name, c.args, {**c.kwargs, k: new})
    return out


def run_plan(env: BfclEnv, task: Task, plan: list[list[Call]]) -> StepResult:
    """Play `plan` (calls per user turn, one call per message, then a text message that ends
    the turn) from reset; returns the last step's result."""
    env.reset(task)
    res = None
    for turn_calls in plan:
        for c in turn_calls:
            res = env.step(str(c))
            if res.terminated or res.truncated:
                return res
        res = env.step(END_OF_TURN)
        if res.terminated or res.truncated:
            return res
    return res


def reference_check(entry: dict, decoded: list[list[list[str]]]) -> dict:
    """BFCL's own verdict on decoded calls: `multi_turn_checker` (which re-executes the calls
    with `eval` on backends it keeps in its module globals) after the runner's force-termination
    check. Only for verification (tests, benchmarks/check_bfcl.py): `decoded` must come from
    this env (literal-only calls); the checker's cached instances are removed afterwards."""
    # deferred: optional extra (bfcl_eval)
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    if len(decoded) != len(entry["ground_truth"]):
        return {"valid": False, "error_type": "multi_turn:force_terminated"}
    name = f"agentrl_ref_{next(_REF_IDS)}"
    test_entry = {k: copy.deepcopy(entry[k]) for k in ("id", "initial_config", "involved_classes")}
    try:
        return multi_turn_checker(copy.deepcopy(decoded), entry["ground_truth"], test_entry,
                                  entry["id"].rsplit("_", 1)[0], name)
    finally:
        for key in [k for k in vars(multi_turn_utils) if k.startswith(name + "_")]:
            delattr(multi_turn_utils, key)


def make_bfcl_spec(category: str):
    """Registry factory for one category. Options: max_turns (call messages allowed per user
    turn; BFCL's limit is 20)."""

    def factory(seed: int = 0, max_turns: int = 20) -> BfclSpec:
        return BfclSpec(category, seed=seed, max_turns=max_turns)

    factory.__doc__ = make_bfcl_spec.__doc__
    return env_factory("bfcl-multi-turn-" + category.replace("_", "-"), ("max_turns",))(factory)


for _cat in CATEGORIES:
    ENVS.register("bfcl-multi-turn-" + _cat.replace("_", "-"), make_bfcl_spec(_cat))

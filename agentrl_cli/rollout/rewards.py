"""Reward functions of the episode (`algo.rewards`, `agentrl train --reward FILE.py:fn`): each
scores a finished episode with a float, weighted and added to the env's outcome reward (or,
with `algo.reward_mode=replace`, instead of it). They are applied where every controller
shapes an episode's reward (`controllers.shape_rewards`: linear groups, VinePPO's episodes and
continuations, every FOCUS path when it lands as a leaf), so every estimator's credit reads
the same reward. docs/rewards.md is the user's page.

A function is called with keywords, and receives those of its parameters among `EPISODE_ARGS`
(all of them with `**kwargs`). A function with TRL's signature (a `prompts` or `completions`
parameter) is called as TRL calls it, on a batch of one episode (`trl_adapter`). The functions
are loaded with the env's loader (`envs.plugins.load_spec`), once per process.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

from ..envs import guard, plugins
from ..errors import ConfigError
from ..types import Episode, EpisodeMeta

# what a reward function may ask for, by parameter name
EPISODE_ARGS = ("messages", "tool_calls", "answer", "gold", "reward", "success", "finish",
                "task_id", "episode")


@dataclass(frozen=True)
class RewardFn:
    """One loaded reward function of `algo.rewards`."""

    name: str                     # its metric is reward/<name>
    spec: str                     # file.py:fn or module:fn, as recorded in the run's config
    weight: float
    fn: Callable[..., Any]
    params: tuple[str, ...]       # the EPISODE_ARGS it takes


def _params(spec: str, fn: Callable[..., Any]) -> tuple[str, ...]:
    """The EPISODE_ARGS `fn` takes (all with **kwargs); a parameter it requires that is not
    one of them is a one-line error."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return EPISODE_ARGS
    ps = sig.parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in ps):
        return EPISODE_ARGS
    named = [p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [p.name for p in ps if p.name not in EPISODE_ARGS and p.default is p.empty
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if unknown:
        raise ConfigError(f"reward '{spec}': parameter '{unknown[0]}' is not one a reward "
                          f"function gets ({', '.join(EPISODE_ARGS)}, or **kwargs; a TRL "
                          "reward function adapts in a few lines: docs/rewards.md)")
    return tuple(n for n in named if n in EPISODE_ARGS)


# what a TRL-style function gets (`trl_adapter`): TRL's own arguments, then the episode's
# fields as the one-item lists TRL makes of a dataset's columns (not `answer`: in TRL datasets
# that column is the gold answer, here `gold`)
TRL_ARGS = ("prompts", "completions", "completion_ids")
TRL_COLUMNS = ("gold", "tool_calls", "reward", "success", "finish", "task_id")


def _signature(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []


def trl_adapter(spec: str, fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """For a function with TRL's signature, `fn(prompts, completions, **kwargs) -> list[float]`
    (a `prompts` or `completions` parameter), a per-episode function that calls it on a batch
    of one: `prompts=[[user message]]`, `completions=[[the episode's assistant and tool
    messages]]`, `completion_ids=[the policy's token ids]`, and `TRL_COLUMNS` as one-item
    lists; its list of one value is the value (None: 0.0, as TRL's sum skips it). None for any
    other function. A required parameter it would not get is a one-line ConfigError."""
    ps = _signature(fn)
    if not any(p.name in ("prompts", "completions") for p in ps):
        return None
    given = TRL_ARGS + TRL_COLUMNS
    missing = [p.name for p in ps if p.name not in given and p.default is p.empty
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing:
        raise ConfigError(f"reward '{spec}': parameter '{missing[0]}' is not one a TRL-style "
                          f"reward function gets ({', '.join(given)}, or **kwargs; the gold "
                          "answer is 'gold': docs/rewards.md)")
    wanted = given if any(p.kind == p.VAR_KEYWORD for p in ps) else tuple(p.name for p in ps)

    def per_episode(**args: Any) -> Any:
        ep = args["episode"]
        batch = {"prompts": [args["messages"][:1]], "completions": [args["messages"][1:]],
                 "completion_ids": [[t for t, m in zip(ep.token_ids, ep.response_mask) if m]],
                 **{k: [args[k]] for k in TRL_COLUMNS}}
        out = fn(**{k: v for k, v in batch.items() if k in wanted})
        if isinstance(out, (list, tuple)) and len(out) == 1:
            return 0.0 if out[0] is None else out[0]
        return out                        # a bare number, or a value `score` refuses in one line

    per_episode.user_fn = fn              # an error names the user's function, not this adapter
    return per_episode


@functools.lru_cache(maxsize=32)
def _load(name: str, spec: str, weight: float) -> RewardFn:
    fn = plugins.load_spec(spec, "reward")
    if not callable(fn):
        raise ConfigError(f"reward '{spec}' is a {type(fn).__name__}, not a function")
    batched = trl_adapter(spec, fn)
    if batched is not None:
        return RewardFn(name, spec, weight, batched, EPISODE_ARGS)
    return RewardFn(name, spec, weight, fn, _params(spec, fn))


def load_rewards(entries: list[dict]) -> tuple[RewardFn, ...]:
    """The functions of `algo.rewards` (entries as `config.reward_specs` gives them)."""
    return tuple(_load(e["name"], e["fn"], float(e["weight"])) for e in entries)


def episode_args(ep: Episode, copy_episode: bool = True) -> dict[str, Any]:
    """What a reward function may read of a finished episode: `messages` (the conversation as
    chat messages: user question, assistant messages, tool replies), `tool_calls` (the turns
    the env read as a tool call: {"name", "text"}), `answer` (the model's final answer, "" if
    none), `gold` (the task's gold answer), `reward` (the env's own), `success` (the env's
    verdict), `finish` (answer | max_turns | max_tokens | env_error), `task_id`, `episode` (a
    deep copy, made only when `copy_episode`; every other value is built afresh per call)."""
    messages = [{"role": "user", "content": ep.question}]
    for t in ep.turns:
        messages.append({"role": "assistant", "content": t.action})
        if t.observation:
            messages.append({"role": "tool", "content": t.observation})
    calls = [{"name": t.tool, "text": t.action} for t in ep.turns
             if t.tool and t.tool != "answer"]
    return {"messages": messages, "tool_calls": calls, "answer": ep.model_answer,
            "gold": ep.answer,
            "reward": ep.reward if ep.meta.reward_env is None else ep.meta.reward_env,
            "success": ep.success, "finish": ep.finish, "task_id": ep.task_id,
            "episode": episode_copy(ep) if copy_episode else None}


def episode_copy(ep: Episode) -> Episode:
    """A copy of `ep` that shares nothing mutable with it: its lists copied (each `Turn` in
    them too), its dicts deep-copied; a thousandth of `copy.deepcopy`'s cost on lists of
    token ids."""
    out = copy.copy(ep)
    for f in dataclasses.fields(ep):
        v = getattr(ep, f.name)
        if isinstance(v, list):
            setattr(out, f.name, [x if isinstance(x, (int, float, str)) else copy.deepcopy(x)
                                  for x in v] if v and not isinstance(v[0], (int, float))
                    else list(v))
        elif isinstance(v, (dict, set, EpisodeMeta)):
            setattr(out, f.name, copy.deepcopy(v))
    return out


def score(r: RewardFn, args: dict[str, Any], timeout_s: float = guard.DEFAULT_TIMEOUT_S) -> float:
    """`r`'s value on an episode, run as the env's steps are (`envs.guard.call_user`: within
    `timeout_s`, an exception, exit or timeout is one line naming the function, its file and
    the task); a value that is not a real number (a string or a bool is not), not finite or
    outside `guard.DEFAULT_REWARD_RANGE` is one line too."""
    where = f"reward '{r.name}' ({r.spec}) on task {args['task_id']}"
    value = guard.call_user(r.fn, (), {k: args[k] for k in r.params}, timeout_s, where)
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, numbers.Real):
        raise guard.UserCodeError(f"{where} returned {type(value).__name__} {value!r:.60}, "
                                  "not a number (an int or a float)")
    return checked_reward(float(value), f"{where} returned")


def checked_reward(value: float, what: str) -> float:
    """`value` when finite and inside `guard.DEFAULT_REWARD_RANGE`, else a one-line error
    "`what` ..." (a reward of 1e300 would train to inf and NaN)."""
    lo, hi = guard.DEFAULT_REWARD_RANGE
    if not math.isfinite(value):
        raise guard.UserCodeError(f"{what} {value}, not a finite number")
    if not lo <= value <= hi:
        raise guard.UserCodeError(f"{what} {value:g}, outside [{lo:g}, {hi:g}] (the range "
                                  "every reward is checked against)")
    return value


def apply_rewards(ep: Episode, fns: tuple[RewardFn, ...], mode: str,
                  timeout_s: float = guard.DEFAULT_TIMEOUT_S) -> None:
    """Score a finished episode once: `ep.meta.rewards` holds each function's value,
    `ep.meta.reward_env` the env's reward, and `ep.reward` becomes the env's reward (mode
    add, 0 with replace) plus each weight x value, checked as each value is. Each function
    reads its own copy of the episode (`episode_args`), so none changes what it scores."""
    if not fns or ep.meta.reward_env is not None:
        return
    values = {r.name: score(r, episode_args(ep, copy_episode="episode" in r.params), timeout_s)
              for r in fns}
    ep.meta.reward_env, ep.meta.rewards = ep.reward, values
    base = ep.reward if mode == "add" else 0.0
    ep.reward = checked_reward(base + sum(r.weight * values[r.name] for r in fns),
                               f"the shaped reward of task {ep.task_id} (algo.rewards) is")


def reward_metrics(episodes: list[Episode]) -> dict[str, float]:
    """The step's mean of each reward function's value (`reward/<name>`) and of the env's own
    reward (`reward/env`) over `episodes`; empty when no function scored them."""
    scored = [e for e in episodes if e.meta.rewards is not None]
    if not scored:
        return {}
    out = {"reward/env": sum(e.meta.reward_env for e in scored) / len(scored)}
    for name in scored[0].meta.rewards:
        out[f"reward/{name}"] = sum(e.meta.rewards[name] for e in scored) / len(scored)
    return out

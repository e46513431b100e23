"""One episode under construction and its token bookkeeping (token-in, token-out).

`LiveEpisode` pairs an `Episode` being built with its env. The functions append exactly the ids
the engine generated (`append_turn`) and the ids of each observation as fed to the model
(`append_observation`), step the env (`step_env`: an env error ends the episode, never the
batch), and give the next chunk of ids (`apply_step`). The rollout runner and controllers
drive them; context operators (`context.operators`) use them to decide what comes next.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..envs.base import StepResult, Task, TextEnv
from ..envs.guard import EnvContractError
from ..models.chat import ChatFormat
from ..types import Episode, EpisodeMeta, Turn


@dataclass
class LiveEpisode:
    """An episode being built (one engine row)."""

    ep: Episode
    env: TextEnv
    done: bool = False
    summarizing: bool = False     # a context operator asked for a summary: the next turn is it


def new_episode(task: Task, group: int, prompt_ids: list[int]) -> Episode:
    n = len(prompt_ids)
    return Episode(task_id=task.task_id, group=group, token_ids=list(prompt_ids),
                   response_mask=[0] * n, logprobs=[0.0] * n, turn_index=[-1] * n,
                   segment_starts=[], segment_index=[-1] * n, answer=task.answer,
                   question=task.prompt,
                   meta=EpisodeMeta(hops=task.meta.get("hops")))


def start_context(ep: Episode, env: TextEnv) -> None:
    """Mark a fresh episode (its tokens so far = the task prompt) as managed by the env's
    context operator, if it has one: segments then follow context windows."""
    op = getattr(env, "context_operator", None)
    if op is not None:
        ep.context, ep.window_prefix = op.name, len(ep.token_ids)


def append_turn(ep: Episode, ids: list[int], lps: list[float], action: str) -> Turn:
    """Append one assistant message (policy tokens). Its segment is its turn number, or under a
    context operator its context window (a segment starts at the window's first turn)."""
    k = ep.num_turns
    seg = len(ep.window_starts) if ep.context else k
    start = len(ep.token_ids)
    if len(ep.segment_starts) <= seg:
        ep.segment_starts.append(start)
    ep.token_ids += ids
    ep.response_mask += [1] * len(ids)
    ep.logprobs += lps
    ep.turn_index += [k] * len(ids)
    ep.segment_index += [seg] * len(ids)
    ep.generated_tokens += len(ids)
    turn = Turn(start=start, end=len(ep.token_ids), action=action, observation="", tool=None)
    ep.turns.append(turn)
    return turn


def append_observation(ep: Episode, turn: Turn, obs_ids: list[int], text: str) -> None:
    turn.observation = text
    turn.obs_start = len(ep.token_ids)
    ep.token_ids += obs_ids
    ep.response_mask += [0] * len(obs_ids)
    ep.logprobs += [0.0] * len(obs_ids)
    ep.turn_index += [-1] * len(obs_ids)
    ep.segment_index += [-1] * len(obs_ids)
    turn.obs_end = len(ep.token_ids)


def step_env(live: LiveEpisode, turn: Turn) -> StepResult | None:
    """Step the env with the turn's action; None (the episode is finished) when it ended."""
    ep = live.ep
    try:
        res = live.env.step(turn.action)
    except EnvContractError as e:   # the env broke the protocol: the run stops, located
        raise e.at(ep.task_id, ep.num_turns) from None
    except Exception as e:  # an env bug must not kill the whole batch
        live.done, ep.finish, ep.reward, ep.success = True, "env_error", 0.0, False
        ep.meta.env_error = f"task {ep.task_id}, step {ep.num_turns}: {type(e).__name__}: {e}"
        return None
    turn.tool = res.info.get("tool")
    if turn.tool and turn.tool != "answer" and not res.info.get("error"):
        ep.num_tool_calls += 1
    if res.terminated or res.truncated:
        live.done = True
        ep.reward = float(res.reward)
        ep.success = bool(res.info.get("success", res.reward > 0))
        ep.finish = "answer" if res.terminated else "max_turns"
        if res.terminated:   # the env's reading of the final answer, else the message itself
            ep.model_answer = str(res.info.get("answer", turn.action))
        return None
    return res


def apply_step(live: LiveEpisode, fmt: ChatFormat, turn: Turn, max_tokens: int,
               max_new_tokens: int) -> list[int] | None:
    """Step the env with the turn's action; returns the next chunk of ids, or None when done."""
    ep = live.ep
    res = step_env(live, turn)
    if res is None:
        return None
    obs_ids = fmt.observation_ids(res.observation)
    if len(ep.token_ids) + len(obs_ids) + max_new_tokens > max_tokens:
        live.done, ep.finish = True, "max_tokens"
        return None
    append_observation(ep, turn, obs_ids, res.observation)
    return obs_ids

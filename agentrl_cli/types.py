"""Core data types. Every field says its shape and meaning.

Token-in, token-out: an `Episode` stores the exact ids the engine generated and the exact ids
of every observation appended, so training never re-tokenises text.

What the parts of a run note on an episode beside its tokens is an `EpisodeMeta`: every key
declared once, here. What a method's rollout (and its preparer) hand its estimator beside the
batch's tokens is a `Payload` of objects typed by the part that makes them: the trainer passes
it from `RolloutResult.payload` to `Batch.payload` without reading it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Iterator, TypeVar

T = TypeVar("T")


@dataclass
class Turn:
    """One assistant message and the environment's reply."""

    start: int                    # index in Episode.token_ids of the turn's first policy token
    end: int                      # one past its last policy token (the stop token included)
    action: str                   # decoded action text (special tokens removed)
    observation: str              # env reply text ("" on the final turn)
    tool: str | None              # tool name the env recognised, None if malformed / answer
    obs_start: int = -1           # index of the first env token after the turn (-1: none)
    obs_end: int = -1             # one past the last env token


@dataclass(slots=True)
class EpisodeMeta:
    """What the parts of a run note on an episode beside its tokens; None: not noted. Slots: a
    key not declared here is an error (`AttributeError`), never a silent side channel."""

    hops: int | None = None               # the task's hops (its env's `Task.meta`), for reports
    env_error: str | None = None          # the exception the env raised in step() (finish "env_error")
    context_resets: int | None = None     # times a context operator reset the context
    summary_turns: list[int] | None = None  # turns that are a compaction's summary, not env actions
    # reward shaping (`rollout.controllers.shape_rewards`, `rollout.rewards.apply_rewards`)
    reward_env: float | None = None       # the env's own reward, before the reward functions
    rewards: dict[str, float] | None = None  # each reward function's value, by its name
    reward_raw: float | None = None       # the reward before DAPO's overlong penalty
    overlong_penalty: float | None = None  # DAPO's overlong penalty added to the reward
    # a tree controller's path (`rollout.planner`): for traces and `agentrl rollout`
    focus_tree: int | None = None         # the task tree (its group) the path belongs to
    focus_path: int | None = None         # the path's id in the step (= its row in the batch)
    focus_origin: int | None = None       # the node the path was launched from (0: a root path)
    # a value continuation (`rollout.vine`): never trained on
    vine_state: int | None = None         # the boundary state it estimates
    source: int | None = None             # the episode whose state it starts from
    boundary: int | None = None           # that state's segment boundary in the source

    SHAPED = ("reward_env", "rewards", "reward_raw", "overlong_penalty")
    PATH = ("focus_tree", "focus_path", "focus_origin")

    def cleared(self, names: tuple[str, ...]) -> "EpisodeMeta":
        """A copy with the keys `names` not noted (e.g. what a continuation does not inherit)."""
        return replace(self, **dict.fromkeys(names))

    def to_json(self) -> dict:
        """The noted keys only, in declaration order."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}


class Payload:
    """What a method's rollout and preparer hand its estimator beside the batch's tokens: at most
    one object of each type, found by its type (`get`). The type is the contract between the
    part that makes it (a controller's `RolloutResult.payload`, a preparer's `batch.payload.add`)
    and the estimator that reads it; the trainer passes the payload on without reading it."""

    def __init__(self, *items: object):
        self._items: dict[type, object] = {}
        for item in items:
            self.add(item)

    def add(self, item: object) -> None:
        """Hold `item`; a second object of the same type is an error (two parts made it)."""
        if type(item) in self._items:
            raise ValueError(f"the payload already holds a {type(item).__name__}")
        self._items[type(item)] = item

    def get(self, kind: type[T]) -> T | None:
        """The object of type `kind`, or None when no part made one."""
        return self._items.get(kind)

    def __iter__(self) -> Iterator[object]:
        return iter(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def to(self, device) -> "Payload":
        """The same payload with each object that holds tensors (it has a `to(device)`) moved."""
        return Payload(*(x.to(device) if hasattr(x, "to") else x for x in self))


@dataclass
class Episode:
    """One complete episode (a root-to-leaf path). Lists are aligned, length = len(token_ids)."""

    task_id: str
    group: int                    # index of the task within the step (GRPO group)
    token_ids: list[int]          # prompt + every turn's policy tokens + env tokens, in order
    response_mask: list[int]      # 1 on policy tokens (trained on), 0 on prompt / env tokens
    logprobs: list[float]         # engine log-prob of each policy token, 0.0 elsewhere
    turn_index: list[int]         # turn number (0..T-1) on policy tokens, -1 elsewhere
    segment_starts: list[int]     # token index where each segment's state s_k ends (= where the
                                  # policy starts generating segment k); one segment per turn, or
                                  # one per context window under a context operator
    turns: list[Turn] = field(default_factory=list)
    segment_index: list[int] = field(default_factory=list)  # segment of each policy token, -1 elsewhere
    reward: float = 0.0           # terminal reward R
    success: bool = False         # verifier's verdict
    finish: str = ""              # "answer" | "max_turns" | "max_tokens" | "env_error"
    num_tool_calls: int = 0       # turns the env parsed as a tool call (not the final answer)
    generated_tokens: int = 0     # policy tokens generated (= sum(response_mask))
    answer: str = ""              # gold answer (for TRACE / reports); `gold_answer` in to_json()
    meta: EpisodeMeta = field(default_factory=EpisodeMeta)  # what the run's parts noted (above)
    question: str = ""            # the task's opening user message (its question / issue / case)
    model_answer: str = ""        # what the policy answered when it ended with an answer ("" else)
    context: str = ""             # context operator that managed the episode ("" = none)
    window_prefix: int = 0        # tokens every context window sees (the task prompt; operators only)
    window_starts: list[int] = field(default_factory=list)  # token index where each context window
                                  # after the first begins: the context was reset there, and a
                                  # token of window w sees only the prefix and window w's tokens

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    def to_json(self) -> dict:
        """JSONL form: the question, the model's answer and the gold answer first, by those
        names, then every other field."""
        d = asdict(self)
        d["meta"] = self.meta.to_json()
        head = {"task_id": d.pop("task_id"), "question": d.pop("question"),
                "model_answer": d.pop("model_answer"), "gold_answer": d.pop("answer"),
                "success": d.pop("success")}
        d["num_turns"] = self.num_turns
        return {**head, **d}

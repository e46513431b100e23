"""Core data types. Every field says its shape and meaning.

Token-in, token-out: an `Episode` stores the exact ids the engine generated and the exact ids
of every observation appended, so training never re-tokenises text.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


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
    meta: dict = field(default_factory=dict)
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
        head = {"task_id": d.pop("task_id"), "question": d.pop("question"),
                "model_answer": d.pop("model_answer"), "gold_answer": d.pop("answer"),
                "success": d.pop("success")}
        d["num_turns"] = self.num_turns
        return {**head, **d}

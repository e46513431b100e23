"""Context management (docs/methods.md): `none` (default), `compaction`, `workspace`.

`context.operator` picks an operator from `OPERATORS`; `wrap_spec(spec, cfg.context)` (called
by `make_spec`, so training, evaluation and `agentrl rollout` all use it) makes the
env spec's envs carry it. The rollout runner asks it what to feed after every turn
(`context.operators`); a stored episode keeps one token sequence with its context windows
(`context.windows`), and the trainer's forward masks attention by window so its log-probs are
those the engine sampled with (`models.sequences.hidden_states`). Controllers and estimators
never branch on the operator: they see segment boundaries (one per context window) as usual.
With `none` the spec is returned unchanged and nothing differs from a run without this package.
"""
from __future__ import annotations

from typing import Callable

from ..envs.base import make_env_spec
from ..envs.guard import guard_spec
from ..envs.tool_calls import tool_spec
from ..registry import Registry
from .envs import ContextEnv, ContextSpec
from .operators import Compaction, ContextOperator, Workspace
from .windows import visible_ids, visible_len, window_index

OPERATORS: Registry[Callable[..., ContextOperator | None]] = Registry("context operator")
OPERATORS.register("none", lambda cfg: None)
OPERATORS.register("compaction", lambda cfg: Compaction(cfg.threshold_tokens, cfg.style))
OPERATORS.register("workspace", lambda cfg: Workspace(cfg.threshold_tokens, cfg.style))


def make_operator(cfg) -> ContextOperator | None:
    """The operator of a `ContextConfig` (None for `none`)."""
    return OPERATORS.get(cfg.operator)(cfg)


def wrap_spec(spec, cfg):
    """`spec` with its envs under the configured operator; `spec` itself for `none`."""
    op = make_operator(cfg)
    return spec if op is None else ContextSpec(spec, op)


def make_spec(cfg):
    """The env spec of a `RunConfig`: the one place it is built (training, evaluation,
    `agentrl rollout`, ablate and diagnostics call it). The env's factory takes the options of
    the env section it declares (`envs.base.make_env_spec`, as the tiny model's builder does).
    Its envs take tool calls in `model.tool_format` (`envs.tool_calls`; unchanged for `text`),
    are checked on every step (`envs.guard`: types, reward range, timeout,
    observation size) and run under the configured context operator (`wrap_spec`; unchanged
    for `none`)."""
    spec = tool_spec(make_env_spec(cfg.env), cfg.model.tool_format, cfg.env.name)
    return wrap_spec(guard_spec(spec, cfg.env), cfg.context)


__all__ = ["OPERATORS", "Compaction", "ContextEnv", "ContextOperator", "ContextSpec", "Workspace",
           "make_operator", "make_spec", "visible_ids", "visible_len", "window_index", "wrap_spec"]

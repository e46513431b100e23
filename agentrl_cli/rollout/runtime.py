"""The runtime a rollout runs on, built from a config in one place (docs/architecture.md,
"Modules, one line each"): the policy model with its tokenizer and chat format, the env spec (under
the configured context operator), the generation engine and the sampling parameters.

The trainer, `agentrl eval`, `agentrl rollout` (episodes and FOCUS trees), `agentrl ablate`'s
budget measurement, the Ray rollout workers and the diagnostics all call `build_runtime`.
Building `tiny` first (a training job: `app.tiny_build.ensure_model`) is the caller's
business; the model is loaded from `model.name` as it is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..config import RunConfig
from ..context import make_spec
from ..engines import build_engine, sampling_params
from ..engines.base import Engine, SamplingParams
from ..envs.base import EnvSpec
from ..models.chat import ChatFormat
from ..models import loading


@dataclass
class Runtime:
    """What a rollout of `cfg` runs on."""

    cfg: RunConfig
    model: torch.nn.Module        # the policy, on the configured device, in eval mode
    tok: Any                      # its tokenizer
    fmt: ChatFormat               # its chat format (prompt ids, stop ids, action decoding)
    model_path: str               # the folder the policy was loaded from
    spec: EnvSpec                 # the env spec (`context.make_spec`)
    engine: Engine                # the configured engine on `model`
    params: SamplingParams        # the configured sampling parameters


def build_runtime(cfg: RunConfig, log: Callable[[str], None] = print,
                  greedy: bool = False) -> Runtime:
    """The runtime of `cfg`: load the policy (`models.loading.load_policy`), build the env spec
    (`context.make_spec`), the engine (`engines.build_engine`) and the sampling parameters
    (`engines.sampling_params`; `greedy`: argmax decoding), in that order."""
    model, tok, fmt, path = loading.load_policy(cfg, log)
    spec = make_spec(cfg)
    engine = build_engine(cfg, model, fmt)
    return Runtime(cfg, model, tok, fmt, path, spec, engine, sampling_params(cfg, greedy=greedy))

"""Generation engines (the protocol: `engines/base.py`). Importing this package registers the
built-ins: `hf`, and `vllm` lazily (GPU, optional extra): naming it imports `engines/vllm.py`,
which imports vLLM itself only when an engine is built."""
from .base import ENGINES, Engine, EngineBatch, ForkableBatch, SamplingParams
from .hf import HFEngine
from .kv_batch import KVBatch
from .sampling import sample

ENGINES.register("hf", HFEngine)


def _vllm_engine():
    # deferred: optional extra (vllm)
    from .vllm import VLLMEngine

    return VLLMEngine


ENGINES.register_lazy("vllm", _vllm_engine)


def check_engine(name: str) -> None:
    """Fail fast (one-line ConfigError) when the named engine cannot run here, before any model
    is loaded: e.g. `vllm` without the vllm package or without CUDA."""
    ENGINES.get(name).check_available()


def build_engine(cfg, model, fmt) -> Engine:
    """The configured engine for `model` (`Engine.from_config`: the engine reads the whole
    config it needs)."""
    return ENGINES.get(cfg.rollout.engine).from_config(cfg, model, fmt)


def sampling_params(cfg, greedy: bool = False) -> SamplingParams:
    """The configured sampling parameters (`rollout.temperature`, `top_p`, `max_new_tokens`)."""
    r = cfg.rollout
    return SamplingParams(r.temperature, r.top_p, r.max_new_tokens, greedy=greedy)


__all__ = ["ENGINES", "Engine", "EngineBatch", "ForkableBatch", "HFEngine", "KVBatch",
           "SamplingParams", "build_engine", "check_engine", "sample", "sampling_params"]

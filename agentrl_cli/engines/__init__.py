"""Generation engines. `hf` is built in; `vllm` registers lazily (GPU, optional extra): naming it
imports `engines/vllm.py`, which imports vLLM itself only when an engine is built."""
from .hf import ENGINES, HFEngine, KVBatch, SamplingParams, sample


def _vllm_engine():
    from .vllm import VLLMEngine

    return VLLMEngine


ENGINES.register_lazy("vllm", _vllm_engine)


def check_engine(name: str) -> None:
    """Fail fast (one-line ConfigError) when the named engine cannot run here, before any model
    is loaded: e.g. `vllm` without the vllm package or without CUDA."""
    check = getattr(ENGINES.get(name), "check_available", None)
    if check is not None:
        check()


def build_engine(cfg, model, fmt):
    """The configured engine for `model` (an engine with `from_config` gets the whole config)."""
    cls = ENGINES.get(cfg.rollout.engine)
    if hasattr(cls, "from_config"):
        return cls.from_config(cfg, model, fmt)
    return cls(model, fmt.pad_id, next(model.parameters()).device)


def sampling_params(cfg, greedy: bool = False) -> SamplingParams:
    """The configured sampling parameters (`rollout.temperature`, `top_p`, `max_new_tokens`)."""
    r = cfg.rollout
    return SamplingParams(r.temperature, r.top_p, r.max_new_tokens, greedy=greedy)


__all__ = ["ENGINES", "HFEngine", "KVBatch", "SamplingParams", "build_engine", "check_engine",
           "sample", "sampling_params"]

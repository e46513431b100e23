"""Generation engines. `hf` is built in; `vllm` registers lazily (GPU, optional extra)."""
from .hf import ENGINES, HFEngine, KVBatch, SamplingParams, sample

__all__ = ["ENGINES", "HFEngine", "KVBatch", "SamplingParams", "sample"]

"""The `vllm` engine (GPU, optional; vLLM pins its own torch, so it lives in its own environment:
see the README's "Scaling out"). This module imports vLLM only when an engine is built, so
naming the engine costs nothing and `agentrl --help` never imports it.

Token in, token out: prompts go to vLLM as token ids (`{"prompt_token_ids": ...}`, no tokenizer
is initialised), and each turn comes back as the sampled ids with the log-prob of each sampled
token (`SamplingParams(logprobs=0)`). The engine is built with `logprobs_mode=
"processed_logprobs"`, i.e. log-probs of softmax(logits / temperature), the distribution the
trainer scores (with `top_p < 1` vLLM renormalises over the nucleus while the trainer does not;
`rollout/logprob_gap` shows it). Each request samples with its own seed, drawn from the path's
or row's torch generator, so the episodes are a function of the run's seeds. Stopping is ours:
`stop_token_ids` = the chat format's stop ids, EOS ignored, `max_tokens` = the turn budget.

Multi-turn and forked continuations resend the whole context; automatic prefix caching
(`enable_prefix_caching=True`) turns that into a cache hit for every block already computed,
so a turn costs its observation's prefill and a FOCUS continuation from a node costs nothing
beyond the blocks not yet cached.

Two ways to drive it:
- `new_batch(n)` -> `VLLMBatch` (the `extend`/`generate` half of `KVBatch`): the lock-step
  runner (`run_episodes`, evaluation, `vine`) works unchanged, one `LLM.generate` per turn round.
- `token_level = False`: the path scheduler drives it with `rollout.vllm_paths.VLLMPathExecutor`:
  FOCUS and `linear` submit one request per turn to the engine and step it; a path's next turn
  is submitted as soon as its previous one finished and its env stepped (continuous batching).
  FOCUS needs no logits from the engine; its critic values come from the trainer.

Weights: after every update the trainer's state dict goes to the model in vLLM's worker through
`collective_rpc` (a `worker_extension_cls` method calling the model's `load_weights`), then the
prefix cache is reset (cached blocks were computed with the old weights). With
`rollout.vllm_sleep` the engine sleeps during the update (level 1: weights to CPU, KV cache
freed) and wakes its weights, loads the new ones, then wakes its KV cache.
A LoRA policy (`model.lora_rank > 0`): vLLM loads the base folder, and every sync (the first
one when the engine is built) sends the merged weights, base + adapters under the base model's
names (`models.lora.merged_state_dict`), so vLLM needs no LoRA support of its own. This path is
written and never run (no GPU here).
NOT RUN HERE: this module was written against vLLM's documented API without a GPU; the CPU
tests cover only the lazy import and the error path. `experiments/gpu/check_scale.sh` is the
check to run on a GPU.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any, Sequence

import torch

from ..errors import ConfigError
from ..models.lora import is_lora, merged_state_dict
from .base import Engine, SamplingParams

EXTRA_HINT = "install vLLM in its own environment (docs/scaling.md)"


def check_available() -> None:
    """One-line ConfigError unless vLLM is importable and a CUDA GPU is visible."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"--engine vllm needs the vllm package, which is not installed: {EXTRA_HINT}")
    if not torch.cuda.is_available():
        raise ConfigError("--engine vllm needs a CUDA GPU and none is visible; use --engine hf on CPU")


def seed_from(generator: torch.Generator | None) -> int:
    """A request seed drawn from a torch generator (None: a fresh random seed)."""
    return int(torch.randint(0, 2**31 - 1, (1,), generator=generator))


def sampled_logprobs(completion, ids: list[int]) -> list[float]:
    """The log-prob of each sampled token from a vLLM completion's `logprobs`."""
    return [float(step[t].logprob) for step, t in zip(completion.logprobs, ids)]


class WorkerExtension:
    """Mixed into vLLM's GPU worker (`worker_extension_cls`): receives the trainer's weights."""

    def agentrl_load_weights(self, named: list[tuple[str, torch.Tensor]]) -> int:
        runner = self.model_runner
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        model.load_weights(weights=named)
        torch.cuda.synchronize()
        return len(named)


class VLLMEngine(Engine):
    """vLLM's offline `LLM` for the policy in `model`'s folder (see the module docstring)."""

    name = "vllm"
    token_level = False           # gives whole turns, not per-token logits (no KVBatch)

    check_available = staticmethod(check_available)

    def __init__(self, model, pad_id: int, device=None, cfg=None, fmt=None, path: str | None = None):
        check_available()
        self.pad_id, self.fmt = pad_id, fmt
        self.path = path or getattr(model, "name_or_path", None)
        if not self.path:
            raise ConfigError("--engine vllm needs the model's folder (model.name_or_path is empty)")
        self.sleep_on_release = bool(cfg.rollout.vllm_sleep) if cfg is not None else False
        self.asleep = False
        self.requests = 0
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # weights pass by reference
        max_len = (cfg.rollout.max_tokens + cfg.rollout.max_new_tokens) if cfg is not None else 4096
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        if limit:
            max_len = min(max_len, int(limit))
        self.llm = self._make_llm(
            model=self.path, tokenizer=self.path, skip_tokenizer_init=True,
            dtype=cfg.model.dtype if cfg is not None else "auto",
            seed=cfg.seed if cfg is not None else 0,
            gpu_memory_utilization=cfg.rollout.vllm_gpu_memory if cfg is not None else 0.4,
            enable_prefix_caching=True, max_model_len=max_len,
            enable_sleep_mode=self.sleep_on_release,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=f"{__name__}.WorkerExtension",
        )
        if is_lora(model):        # vLLM loaded the base: the adapters' merged weights on top
            self.load_weights(model)

    @classmethod
    def from_config(cls, cfg, model, fmt) -> "VLLMEngine":
        return cls(model, fmt.pad_id, cfg=cfg, fmt=fmt)

    @staticmethod
    def _make_llm(**kw):
        """`vllm.LLM(**kw)`; an option this vLLM version does not know is dropped (reported)."""
        # deferred: optional extra (vllm)
        from vllm import LLM

        dropped = []
        while True:
            try:
                llm = LLM(**kw)
                break
            except TypeError as e:
                bad = next((k for k in kw if f"'{k}'" in str(e)), None)
                if bad is None or bad in ("model", "tokenizer"):
                    raise
                dropped.append(bad)
                kw.pop(bad)
        if dropped:
            print(f"vllm engine: this vLLM does not accept {', '.join(dropped)}; running without")
        return llm

    # -- requests ------------------------------------------------------------------------------

    def sampling(self, params: SamplingParams, seed: int, stop_ids: Sequence[int]):
        # deferred: optional extra (vllm)
        from vllm import SamplingParams as VSamplingParams

        kw: dict[str, Any] = dict(
            n=1, temperature=0.0 if params.greedy else params.temperature, top_p=params.top_p,
            max_tokens=params.max_new_tokens, stop_token_ids=list(stop_ids), ignore_eos=True,
            logprobs=0, seed=seed, detokenize=False)
        try:
            # deferred: optional extra (vllm)
            from vllm.sampling_params import RequestOutputKind

            kw["output_kind"] = RequestOutputKind.CUMULATIVE
        except ImportError:
            pass
        return VSamplingParams(**kw)

    def generate(self, prompts: list[list[int]], params: SamplingParams, seeds: list[int],
                 stop_ids: Sequence[int]) -> list[tuple[list[int], list[float]]]:
        """One turn for each prompt (token ids) -> (ids, log-probs) per prompt."""
        sps = [self.sampling(params, s, stop_ids) for s in seeds]
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sps,
                                 use_tqdm=False)
        res = []
        for out in outs:
            comp = out.outputs[0]
            ids = list(comp.token_ids)
            res.append((ids, sampled_logprobs(comp, ids)))
        return res

    def add_request(self, request_id: str, prompt: list[int], sampling) -> str:
        """Queue one request; returns the id its outputs will carry (a vLLM that makes ids
        unique returns its own)."""
        got = self.llm.llm_engine.add_request(request_id, {"prompt_token_ids": list(prompt)},
                                              sampling)
        self.requests += 1
        return got if isinstance(got, str) else request_id

    def step(self) -> list:
        return self.llm.llm_engine.step()

    def abort(self, request_ids: list[str]) -> None:
        if request_ids:
            self.llm.llm_engine.abort_request(request_ids)

    # -- the two drivers -----------------------------------------------------------------------

    def new_batch(self, n_rows: int) -> "VLLMBatch":
        return VLLMBatch(self, n_rows)

    # -- weights and memory --------------------------------------------------------------------

    def _wake(self, tags: list[str]) -> None:
        try:
            self.llm.wake_up(tags=tags)
        except TypeError:  # a vLLM without tagged wake-up: everything at once
            if tags[0] == "weights":
                self.llm.wake_up()

    def load_weights(self, weights) -> None:
        """New policy weights (a module or a state dict) into the engine; wakes it if asleep.
        A LoRA module sends its merged weights (base + adapters, the base model's names)."""
        state = merged_state_dict(weights) if isinstance(weights, torch.nn.Module) else weights
        in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
        named = [(k, v.detach() if in_process else v.detach().cpu()) for k, v in state.items()]
        if self.asleep:
            self._wake(["weights"])
        self.llm.collective_rpc("agentrl_load_weights", args=(named,))
        if self.asleep:
            self._wake(["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()

    def release(self) -> None:
        """Free the GPU for the trainer's update (when `rollout.vllm_sleep`)."""
        if self.sleep_on_release and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True


class VLLMBatch:
    """The `extend` / `generate` half of `KVBatch` on vLLM: rows are token lists, every
    `generate` sends each row's whole context (prefix caching makes the repeat cheap)."""

    def __init__(self, engine: VLLMEngine, n_rows: int):
        self.engine, self.n = engine, n_rows
        self.tokens: list[list[int]] = [[] for _ in range(n_rows)]
        self.forward_tokens = 0   # tokens sent as new input or generated (cache hits included)
        self.keep_hidden = False

    def extend(self, chunks: list[list[int] | None], only_fed: bool = False) -> None:
        for r, c in enumerate(chunks):
            if c:
                self.tokens[r] += list(c)
                self.forward_tokens += len(c)

    def generate(self, rows: list[int], params: SamplingParams, stop_ids: tuple[int, ...],
                 generator=None) -> tuple[list[list[int]], list[list[float]]]:
        gens = [generator[r] if isinstance(generator, (list, tuple)) else generator for r in rows]
        seeds = [seed_from(g) for g in gens]
        outs = self.engine.generate([self.tokens[r] for r in rows], params, seeds, stop_ids)
        ids_out, lps_out = [], []
        for r, (ids, lps) in zip(rows, outs):
            self.tokens[r] += ids
            self.forward_tokens += len(ids)
            ids_out.append(ids)
            lps_out.append(lps)
        return ids_out, lps_out

"""What a command checks before any work: every plugin a config names exists (and fits where
it runs), a hub model is there, the prompts and the rows in flight fit.

`config` knows values, not plugins; the registries live with the plugins (envs, engines,
estimators, losses, controllers, FOCUS allocators and gains, context operators), so the names
are checked here, above all of them: by the CLI and by `ablate` right after a config is loaded
(`load_checked`, `load_saved_checked`), and by `app.train.train` first thing (a typo fails in
under a second, before a model is loaded or a run folder written).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Callable
from pathlib import Path

from ..config import RunConfig, load, load_saved
from ..config.schema import TrainConfig
from ..context import OPERATORS, make_spec
from ..credit.estimators import ESTIMATORS
from ..engines import ENGINES
from ..envs import ENVS
from ..envs.base import check_tiny_env, make_env_spec
from ..envs.benchmarks import get_benchmark, load_benchmarks
from ..envs.checker import require_fork
from ..errors import ConfigError
from ..methods import METHODS
from ..models.loading import chat_format, model_path, resolve_device
from ..rollout.controllers import CONTROLLERS
from ..rollout.planner import ALLOCATORS
from ..rollout.rewards import load_rewards
from ..train.learner import TREE_PACK_MAX_TOKENS
from ..train.policy_losses import POLICY_LOSSES


def check_names(cfg: RunConfig) -> RunConfig:
    """Unknown env / engine / estimator / loss / controller / FOCUS allocator / context
    operator -> one `RegistryError` line listing the valid ones; a reward function that does
    not load, or a controller that cannot run where `rollout.workers` puts it -> one
    `ConfigError` line. Returns `cfg`. (Checks of values alone, e.g. `algo.focus_gain` or
    the LoRA options, are config's: `config.validation`, run on every config built.)"""
    a = cfg.algo
    for reg, name in ((ENVS, cfg.env.name), (ENGINES, cfg.rollout.engine),
                      (ESTIMATORS, a.estimator), (POLICY_LOSSES, a.loss),
                      (CONTROLLERS, a.controller), (ALLOCATORS, a.focus_allocator),
                      (OPERATORS, cfg.context.operator)):
        if name not in reg:
            reg.get(name)  # raises the one-line RegistryError
    if a.rewards:                         # the reward functions import, before any work

        load_rewards(a.rewards)
    check_placement(cfg)
    check_oracle(cfg)
    return cfg


def check_oracle(cfg: RunConfig) -> None:
    """`algo.focus_critic=oracle` reads the env's `oracle_value()`: an env without one is one
    ConfigError line, before any work."""
    if cfg.algo.focus_critic != "oracle" or not _grows_trees(cfg):
        return

    env = make_env_spec(cfg.env).make()
    if not callable(getattr(env, "oracle_value", None)):
        raise ConfigError(f"algo.focus_critic=oracle needs an env that computes a state's success "
                          f"probability (env.oracle_value()); env '{cfg.env.name}' has none "
                          "(the built-in one that does: allocation)")


def _grows_trees(cfg: RunConfig) -> bool:
    """Whether the run's controller grows trees (the oracle replaces their node values; parked
    rows stay in the cache)."""
    return CONTROLLERS.get(cfg.algo.controller).trees


def check_placement(cfg: RunConfig) -> None:
    """With `rollout.workers > 0` the step runs on the path scheduler (`rollout.rollouts`):
    its controller must run there (a `rollout.controllers.Controller` with `run_paths`), and
    DAPO's dynamic sampling runs in process only. Else one ConfigError line."""
    if cfg.rollout.workers == 0:
        return

    if CONTROLLERS.get(cfg.algo.controller).run_paths is None:
        paths = [n for n in CONTROLLERS.names() if CONTROLLERS.get(n).run_paths is not None]
        raise ConfigError(f"algo.controller '{cfg.algo.controller}' runs in process only: with "
                          f"rollout.workers > 0 use one of {', '.join(paths)}")
    if cfg.algo.dynamic_sampling:
        raise ConfigError("algo.dynamic_sampling runs in process only (set rollout.workers=0)")


def check_eval_tasks(cfg: RunConfig, n: int | None = None, what: str = "train.eval_tasks") -> None:
    """`n` held-out tasks (default `train.eval_tasks`) exist in the env's eval split; more is a
    one-line error, not a silent cut to the split's size. Builds the env spec (cheap: no
    model), so it runs before any work."""
    n = cfg.train.eval_tasks if n is None else n
    size = len(make_spec(cfg).tasks("eval"))
    if n > size:
        hint = " (or raise env.n_eval)" if "n_eval" in _env_options(cfg.env.name) else ""
        raise ConfigError(f"{what}={n} is above the {cfg.env.name} eval split's {size} tasks: "
                          f"give at most {size}{hint}")


def _env_options(name: str) -> tuple[str, ...]:
    return tuple(getattr(ENVS.get(name), "options", ()) or ())


HUB_TIMEOUT = 5.0    # seconds for the one request that asks the hub whether a model exists


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def check_hub_model(name: str, key: str = "model.name") -> None:
    """A hub id (not `tiny`, not a local folder) must be in the local Hugging Face cache or,
    online, exist on the hub: one request of at most HUB_TIMEOUT seconds, no retries. Else one
    ConfigError line before any work: the loader would otherwise retry for most of a minute
    and fail after the run folder was opened. With HF_HUB_OFFLINE=1 only the cache counts."""
    if not name or name == "tiny" or Path(name).expanduser().exists():
        return
    # deferred: huggingface_hub's client takes seconds to import
    from huggingface_hub import try_to_load_from_cache

    try:
        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return
    except ValueError:                    # not a valid repo id
        raise ConfigError(f"{key}: '{name}' is neither a local folder nor a hub id") from None
    if hub_offline():
        raise ConfigError(f"{key}: '{name}' is not a local folder and not in the Hugging Face "
                          "cache, and HF_HUB_OFFLINE=1 forbids downloading it: check the "
                          "path, or download it once online")
    _ask_hub(name, key)


@functools.lru_cache(maxsize=64)
def _ask_hub(name: str, key: str) -> None:
    # deferred: huggingface_hub's client takes seconds to import
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(name, timeout=HUB_TIMEOUT)
    except GatedRepoError:
        return                            # it exists: the loader reports the access it needs
    except RepositoryNotFoundError:
        raise ConfigError(f"{key}: no model '{name}' on the Hugging Face hub (and no local "
                          "folder of that name): check the id or the path") from None
    except Exception as e:  # noqa: BLE001 (no connection, a timeout, a proxy's refusal)
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{key}: '{name}' is not a local folder nor in the Hugging Face "
                          f"cache, and the hub cannot be reached ({first}): check the "
                          "network, or the path if it is a local model") from None


def load_checked(*args, **kwargs) -> RunConfig:
    """`config.load(...)` followed by `check_names` and (`check_hub_model`) a model that is
    there: the config a command runs with."""
    cfg = check_names(load(*args, **kwargs))
    check_hub_model(cfg.model.name)
    check_hub_model(cfg.model.critic_path, "model.critic_path")
    return cfg


def load_saved_checked(run_dir, sets: list[str] | None = None) -> RunConfig:
    """`config.load_saved(run_dir, sets)` (a run folder's config, e.g. to resume or evaluate
    it) followed by `check_names`: a run that names a plugin no longer installed, or a `--set`
    with a typo, fails before any work."""
    return check_names(load_saved(run_dir, sets))


# ------------------------------------------------------------------ a command's config
def flags(method=None, env=None, model=None, engine=None, seed=None, out=None) -> dict:
    """CLI flags as dotted config keys (None = not given)."""
    return {"env.name": env, "model.name": model, "rollout.engine": engine, "seed": seed,
            "out": None if out is None else str(out), "_method": method}


def load_config(config: Path | str | None, sets: list[str] | None, benchmark: str | None = None,
                **kw) -> RunConfig:
    """The checked RunConfig of a command (`load_checked`), its flags given as `kw` (`flags`).
    `benchmark` (a benchmarks.yaml entry) sets the env and its presets, after checking that the
    benchmark can run here (else a one-line error); `--env` naming a benchmark's env applies
    the same presets. Then what a user env must offer (`user_env_needs`)."""
    f = flags(**kw)
    method = f.pop("_method")
    presets = None
    if benchmark is not None:
        if f["env.name"] is not None:
            raise ConfigError("give --benchmark or --env, not both")
        b = get_benchmark(benchmark)
        b.check()
        presets = b.presets()
    elif f["env.name"] is not None:
        try:
            table = load_benchmarks()
        except ConfigError:
            table = {}
        # the entry named like the env first (`search`, not its variant `search-long`)
        same = sorted((b for b in table.values() if b.env == f["env.name"]),
                      key=lambda b: b.name != f["env.name"])
        presets = same[0].presets() if same else None
    cfg = load_checked(str(config) if config else None, sets, method=method, presets=presets, **f)
    user_env_needs(cfg, forks=method is not None)
    return cfg


def user_env_needs(cfg: RunConfig, forks: bool = True) -> None:
    """What a user env must offer for this command, checked before any model loads: a scripted
    expert for `--model tiny`; with `forks`, the fork check when the method's controller forks
    episodes (FOCUS, VinePPO; training checks its own method in any case)."""
    if cfg.model.name == "tiny":
        check_tiny_env(cfg.env)
    if forks and CONTROLLERS.get(cfg.algo.controller).forks:
        require_fork(cfg.env, f"method {cfg.method}")


# ------------------------------------------------------------------ what a rollout allocates
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def available_memory() -> int | None:
    """Bytes the rollout may take: the kernel's MemAvailable (None where unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def rollout_bytes(model: dict, rows: int, context: int, prefill: int, dtype_bytes: int,
                  cpu: bool) -> tuple[int, int]:
    """(KV cache, attention of one prefill) in bytes, from a model's config.json (`model`).
    KV cache: rows x context tokens x layers x 2 (K, V) x KV heads x head dim. On the CPU the
    hf engine's attention with a padding mask materialises its scores and mask: rows x (heads
    + 1) x prefill x prefill (a row's whole first input, its prompt, is one forward; on a GPU
    the fused kernels do not, so this term is 0)."""
    heads = int(model.get("num_attention_heads") or 1)
    kv_heads = int(model.get("num_key_value_heads") or heads)
    head_dim = int(model.get("head_dim") or int(model.get("hidden_size", heads)) // heads)
    layers = int(model.get("num_hidden_layers") or 1)
    kv = rows * context * layers * 2 * kv_heads * head_dim * dtype_bytes
    att = rows * (heads + 1) * prefill * prefill * dtype_bytes if cpu else 0
    return kv, att


def check_rollout_memory(cfg: RunConfig, rows: int, split: str = "eval", n_tasks: int | None = None,
                         available: int | None = None) -> bool:
    """Before the model loads: (1) every prompt the rollout will feed (system prompt + first
    user message of each of its tasks) fits in `rollout.max_tokens`, since a prompt is fed
    whole (a BFCL prompt with the task's function docs is tens of thousands of tokens with a
    byte-level tokenizer); (2) `rows` rows in flight x `rollout.max_tokens` (the KV cache) plus,
    on the CPU, one prefill of the longest prompt (`rollout_bytes`) fit in the available
    memory. Else one ConfigError line naming the key to lower. The hf engine only (vLLM takes
    `rollout.vllm_gpu_memory` of the GPU and pages its cache). Returns whether the prompts were
    checked (False: not the hf engine, or no local model folder to read yet)."""
    if cfg.rollout.engine != "hf":
        return False
    try:
        path = model_path(cfg)
        model = json.loads((Path(path) / "config.json").read_text())
    except (ConfigError, OSError, ValueError):
        return False                      # no local config to read: the loader reports it
    model = model.get("text_config", model)
    _, fmt = chat_format(cfg, path)
    spec = make_spec(cfg)
    longest, where = 0, None
    for task in spec.tasks(split, n_tasks):
        env = spec.make()
        user = env.reset(task)            # first: reset sets the task's system prompt
        n = len(fmt.prompt_ids(env.system_prompt, user, getattr(env, "tool_schemas", None)))
        if n > longest:
            longest, where = n, task.task_id
    m = cfg.rollout.max_tokens
    if longest > m:
        raise ConfigError(f"the {cfg.env.name} prompt of task {where} is {longest:,} tokens with "
                          f"this model's tokenizer, above rollout.max_tokens={m:,}: a prompt is "
                          f"fed whole; raise rollout.max_tokens or use a model whose tokenizer "
                          f"is not byte-level")
    available = available_memory() if available is None else available
    if available is None:
        return True
    cpu = resolve_device(cfg.model.device).type == "cpu"
    kv, att = rollout_bytes(model, rows, m, longest, _DTYPE_BYTES[cfg.model.dtype], cpu)
    if kv + att > available:
        gib = lambda b: f"{b / 2**30:,.1f} GiB"  # noqa: E731
        what = f"KV cache {gib(kv)}" + (f" + the CPU attention of a {longest:,}-token prompt "
                                        f"{gib(att)}" if att else "")
        raise ConfigError(f"the rollout would need about {gib(kv + att)} ({rows} rows in flight x "
                          f"rollout.max_tokens={m:,}: {what}), above the {gib(available)} "
                          f"available: " + ("fewer rows in flight (rollout.batch_size) or "
                                            "shorter prompts (a tokenizer that is not byte-level)"
                                            if att > kv else
                                            "lower rollout.max_tokens or rollout.batch_size"))


def check_run_memory(cfg: RunConfig) -> bool:
    """`check_rollout_memory` for a training run: its training prompts at the rows a step keeps
    in flight (twice `rollout.batch_size` for a tree controller, whose parked rows stay in the
    cache), and its held-out check's prompts. Returns whether they were checked."""
    rows = cfg.rollout.batch_size * (2 if _grows_trees(cfg) else 1)
    checked = check_rollout_memory(cfg, rows, "train")
    return check_rollout_memory(cfg, cfg.rollout.batch_size, "eval", cfg.train.eval_tasks) and checked


# ------------------------------------------------------------------ what an update allocates
GIB = 2**30


def _shape(model: dict) -> dict[str, int]:
    """The sizes of a decoder's config.json that its memory follows."""
    heads = int(model.get("num_attention_heads") or 1)
    h = int(model.get("hidden_size") or model.get("n_embd") or 1)
    hd = int(model.get("head_dim") or h // heads)
    return {"h": h, "layers": int(model.get("num_hidden_layers") or model.get("n_layer") or 1),
            "q": heads * hd, "kv": int(model.get("num_key_value_heads") or heads) * hd,
            "i": int(model.get("intermediate_size") or 4 * h),
            "vocab": int(model.get("vocab_size") or 1),
            "tied": bool(model.get("tie_word_embeddings", True))}


def parameter_count(model: dict) -> tuple[int, int]:
    """(all parameters, the LoRA-adaptable projections' (in + out) summed over one layer) of a
    Llama/Qwen-shaped decoder: embeddings (and an untied LM head), per layer q/k/v/o and
    gate/up/down projections and their norms."""
    s = _shape(model)
    h, q, kv, i = s["h"], s["q"], s["kv"], s["i"]
    layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h + 2 * (q // max(1, int(
        model.get("num_attention_heads") or 1)))
    embed = s["vocab"] * h * (1 if s["tied"] else 2)
    sides = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h)
    return embed + s["layers"] * layer + h, sides


# Floats autograd keeps per token and layer of a decoder layer in train mode, by width: the
# two RMSNorms' inputs and outputs (4 x hidden), q's projection, norm, rotation and its
# GQA-expanded K/V copies and the attention output (6 x q width), k's projection, norm and
# rotation and v (4 x kv width), and the MLP's gate, SiLU, up and product (4 x intermediate).
ACT_PER_TOKEN = {"h": 4, "q": 6, "kv": 4, "i": 4}
LOGIT_COPIES = 3      # a log-prob chunk's logits, their softmax and its gradient (float32)


def update_bytes(model: dict, tokens: int, policy_tokens: int, chunk: int, dtype_bytes: int,
                 lora_rank: int = 0, checkpointing: bool = False, reference: bool = False,
                 tree_mask: bool = False) -> dict[str, int]:
    """The update's peak by part, in bytes, for one micro-batch of `tokens` tokens
    (`policy_tokens` of them policy tokens, which alone reach the LM head) of a model with
    config.json `model`:
    - weights: parameters x dtype bytes (twice with a frozen reference copy);
    - optimiser: gradients + AdamW's two moments of the trainable parameters (all of them, or
      with `lora_rank` the adapters: rank x (in + out) of each projection, and their weights);
    - activations: tokens x layers x (ACT_PER_TOKEN's floats) x dtype bytes; with
      `checkpointing` each layer keeps its input only, and one layer's activations exist at a
      time in its recomputation;
    - lm_head: one log-prob chunk's logits (min(chunk, policy tokens) x vocabulary, float32,
      LOGIT_COPIES of them);
    - tree_mask: tree packing's dense tokens x tokens mask (as booleans and as the additive
      float mask attention reads).
    The attention itself keeps no tokens x tokens scores: torch's CPU and CUDA kernels for
    sdpa are fused (benchmarks/bench_update_memory.py measures the total)."""
    s = _shape(model)
    n_params, sides = parameter_count(model)
    trainable = lora_rank * sides * s["layers"] if lora_rank > 0 else n_params
    per_layer = sum(ACT_PER_TOKEN[k] * s[k] for k in ACT_PER_TOKEN) * dtype_bytes
    act = (tokens * (s["layers"] * s["h"] * dtype_bytes + per_layer) if checkpointing
           else tokens * s["layers"] * per_layer)
    n_chunk = min(chunk or policy_tokens, policy_tokens)
    return {"weights": n_params * dtype_bytes * (2 if reference else 1)
            + (trainable * dtype_bytes if lora_rank > 0 else 0),
            "optimiser": 3 * trainable * dtype_bytes,
            "activations": act,
            "lm_head": n_chunk * s["vocab"] * 4 * LOGIT_COPIES,
            "tree_mask": tokens * tokens * (1 + dtype_bytes) if tree_mask else 0}


def _model_json(cfg: RunConfig) -> dict | None:
    """The policy's config.json (its text model's), or None where there is no local one yet."""
    try:
        model = json.loads((Path(model_path(cfg)) / "config.json").read_text())
    except (ConfigError, OSError, ValueError):
        return None
    return model.get("text_config", model) if isinstance(model, dict) else None


def update_parts(cfg: RunConfig, model: dict, tokens: int) -> dict[str, int]:
    """`update_bytes` for this run at micro-batches of `tokens` tokens (all of them counted as
    policy tokens: the LM head's chunk is then whole)."""
    reference = METHODS.get(cfg.method).reference or cfg.algo.kl_coef > 0
    return update_bytes(model, tokens, tokens, cfg.train.logprob_chunk, _DTYPE_BYTES[cfg.model.dtype],
                        cfg.model.lora_rank, cfg.model.gradient_checkpointing, reference,
                        cfg.train.tree_pack and tokens <= TREE_PACK_MAX_TOKENS)


MIN_MICROBATCH = 256     # the smallest micro-batch a default is lowered to


def check_update_memory(cfg: RunConfig, available: int | None = None,
                        log: Callable[[str], None] = print) -> RunConfig:
    """Before any rollout: the update's peak (`update_parts` at `train.max_tokens_per_microbatch`)
    fits in the available memory (the host's, for a model on the CPU). Where it does not and the
    micro-batch is at its default, the largest halving of it that fits is taken, and said;
    otherwise one ConfigError line naming the keys that lower the peak. Returns the config the
    run goes on with."""
    model = _model_json(cfg)
    if model is None or resolve_device(cfg.model.device).type != "cpu":
        return cfg
    available = available_memory() if available is None else available
    if available is None:
        return cfg
    tokens = cfg.train.max_tokens_per_microbatch
    parts = update_parts(cfg, model, tokens)
    if sum(parts.values()) <= available:
        return cfg
    default = TrainConfig().max_tokens_per_microbatch
    fit = next((t for t in (tokens >> k for k in range(1, 16)) if t >= MIN_MICROBATCH
                and sum(update_parts(cfg, model, t).values()) <= available), None)
    gib = lambda b: f"{b / GIB:,.1f} GiB"  # noqa: E731
    if tokens == default and fit is not None:
        log(f"train.max_tokens_per_microbatch={fit}: at the default {tokens:,} the update would "
            f"need about {gib(sum(parts.values()))}, above the {gib(available)} available")
        return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_tokens_per_microbatch=fit))
    keys = ["lower train.max_tokens_per_microbatch" + (f" (to {fit:,})" if fit else "")]
    if not cfg.model.gradient_checkpointing:
        keys.append("set model.gradient_checkpointing=true")
    if cfg.model.lora_rank == 0 and parts["optimiser"] > available // 2:
        keys.append("train adapters (model.lora_rank)")
    what = ", ".join(f"{k.replace('_', ' ')} {gib(v)}" for k, v in parts.items() if v)
    raise ConfigError(f"the update would need about {gib(sum(parts.values()))} ({what}; "
                      f"train.max_tokens_per_microbatch={tokens:,}), above the {gib(available)} "
                      f"available: {' or '.join(keys)}")

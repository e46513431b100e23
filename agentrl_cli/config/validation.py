"""Checks on a config's values, each a one-line `ConfigError`: ranges, caps and choices of
the fields (`_validate`, run by `loading.build` on every config), the metric sinks `train.log`
names, the LoRA options, keys and sections as given (a mistyped one named with the nearest),
a model given as a local folder, and what a resume may change.

Values only: whether a plugin a config names (env, engine, estimator, loss, controller,
allocator, context operator, reward function) exists is checked where the plugins are
built, `app.preflight.check_names`."""
from __future__ import annotations

import re
from pathlib import Path

from ..errors import ConfigError
from ..registry import suggest
from .schema import CAPS, LEAF_TYPES, SECTIONS, RunConfig, flatten

_POSITIVE = {
    "rollout.tasks_per_step", "rollout.group_size", "rollout.max_new_tokens", "rollout.max_tokens",
    "rollout.batch_size", "train.lr", "train.ppo_epochs", "train.minibatches",
    "train.max_tokens_per_microbatch", "train.eval_tasks", "train.eval_samples",
    "env.max_turns", "env.min_hops", "algo.vine_k", "algo.trace_eps", "algo.trace_k",
    "algo.overlong_cache", "env.n_train", "env.n_eval", "env.max_observation_chars",
}
_NON_NEGATIVE = {
    "train.steps", "train.eval_every", "train.save_every", "train.trace_every", "train.grad_clip", "train.weight_decay",
    "rollout.budget_tokens", "rollout.temperature", "algo.kl_coef", "algo.eps_low", "algo.eps_high",
    "algo.vf_coef", "algo.value_clip", "algo.kappa", "algo.beta", "model.tiny_warmup_steps", "algo.agg_norm",
    "algo.dynamic_rounds", "algo.lambda_term", "algo.alpha_out", "algo.alpha_turn",
    "train.logprob_chunk", "train.logprob_tolerance", "rollout.workers", "rollout.worker_gpus", "train.critic_lr",
    "train.critic_warmup", "seed", "env.seed", "algo.focus_min_depth", "train.warmup_steps",
    "env.step_timeout_s",
    "algo.entropy_coef",
}
# episodes x tokens of one step's batch tensors ([episodes, max_tokens] per field)
BATCH_CELLS_CAP = 2**31
_UNIT = {"env.max_error_rate", "algo.gamma", "algo.lam", "algo.lam_intra", "model.tiny_target_success", "algo.gamma_td",
         "model.tiny_error_rate"}
_CHOICES = {
    "context.style": ("free", "structured"),
    "algo.agg": ("token-mean", "seq-mean", "token-sum-norm"),
    "model.dtype": ("float32", "bfloat16", "float16"),
    "model.critic": ("head", "detached", "separate"),
    "model.device": ("auto", "cpu", "cuda"),
    "model.tool_format": ("text", "hermes", "llama3-json"),
    "model.attention": ("eager", "sdpa", "flex_attention", "flash_attention_2", "sink_sdpa", "sink_flex"),
    "env.relations": ("single", "full"),
    "env.repos": ("per-task", "shared"),
    "algo.focus_baseline": ("refined", "loo"),
    "algo.focus_prior": ("critic", "tree"),
    "algo.focus_evidence": ("own", "subtree"),
    "algo.focus_critic": ("learned", "cold", "pretrained", "oracle"),
    "algo.focus_norm": ("tree", "contrast", "none"),
    "rollout.focus_tasks": ("tasks_per_step", "match"),
    "algo.focus_critic_targets": ("nodes", "tokens"),
    "algo.focus_critic_backup": ("refined", "evidence"),
    "algo.focus_return": ("path", "subtree"),
    "algo.focus_segment_weight": ("one", "visit"),
    "train.old_logprobs": ("auto", "engine", "score"),
    "train.lr_schedule": ("constant", "linear", "cosine"),
    "algo.kl_estimator": ("k1", "k2", "k3"),
    "algo.reward_mode": ("add", "replace"),
    # the gains `credit.focus.focus_gain` defines (its GAIN_KINDS, which tests/test_config_sections.py
    # holds equal to these)
    "algo.focus_gain": ("plugin", "bayes"),
}
# the metric sinks `train.log` may name (`reporting.sinks` opens them)
SINKS = ("tensorboard", "wandb")


def parse_sinks(spec: str) -> list[str]:
    """`train.log` as a list: 'tensorboard,wandb' -> ['tensorboard', 'wandb'] (each once);
    an unknown name raises ConfigError (a ValueError)."""
    names = [s.strip() for s in (spec or "").split(",") if s.strip()]
    bad = [n for n in names if n not in SINKS]
    if bad:
        raise ConfigError(f"train.log: unknown sink '{bad[0]}'; valid: {', '.join(SINKS)} "
                          f"(comma-separated, empty for metrics.jsonl only)")
    return list(dict.fromkeys(names))


def _validate(cfg: RunConfig) -> None:
    """Every value check of a built config (`loading.build` runs it); the first that fails
    raises its one-line ConfigError."""
    flat = flatten(cfg)
    _validate_fields(flat)
    cells = cfg.episodes_per_step * cfg.rollout.max_tokens
    if cells > BATCH_CELLS_CAP:
        raise ConfigError(f"rollout.tasks_per_step x rollout.group_size x rollout.max_tokens = "
                          f"{cells:,} exceeds 2^31 (one step's batch would not fit in memory)")
    parse_sinks(cfg.train.log)
    for key in _UNIT:
        if not 0.0 <= flat[key] <= 1.0:
            raise ConfigError(f"{key} must be in [0, 1], got {flat[key]}")
    for key, choices in _CHOICES.items():
        if flat[key] not in choices:
            raise ConfigError(f"{key} must be one of {', '.join(choices)}, got '{flat[key]}'")
    _validate_pairs(cfg)
    if cfg.context.operator != "none":
        _validate_context(cfg)
    if cfg.algo.reward_mode == "replace" and not cfg.algo.rewards:
        raise ConfigError("algo.reward_mode=replace needs at least one reward function "
                          "(--reward FILE.py:fn or algo.rewards)")
    if 0 < cfg.train.steps <= cfg.train.warmup_steps:
        raise ConfigError(f"train.warmup_steps ({cfg.train.warmup_steps}) must be < train.steps "
                          f"({cfg.train.steps}): the run would train its whole length at the "
                          "warm-up's lowered rate")
    if cfg.env.max_hops < cfg.env.min_hops:
        raise ConfigError(f"env.max_hops ({cfg.env.max_hops}) < env.min_hops ({cfg.env.min_hops})")
    for key in ("rollout.temperature",):
        if flat[key] == 0:
            raise ConfigError(f"{key} must be > 0 for training (use eval --greedy for argmax)")
    check_lora(cfg)


def _validate_fields(flat: dict) -> None:
    """Each field on its own: positive, non-negative, within its documented cap."""
    for key in _POSITIVE:
        if not flat[key] > 0:
            raise ConfigError(f"{key} must be > 0, got {flat[key]}")
    for key in _NON_NEGATIVE:
        if flat[key] < 0:
            raise ConfigError(f"{key} must be >= 0, got {flat[key]}")
    for key, cap in CAPS.items():
        if flat[key] > cap:
            raise ConfigError(f"{key} must be <= {cap:,} (its documented cap), got {flat[key]:,}")


def _validate_pairs(cfg: RunConfig) -> None:
    """Values that bound one another, and the ranges of a few fields not in the tables."""
    if not 0.0 < cfg.rollout.vllm_gpu_memory <= 1.0:
        raise ConfigError(f"rollout.vllm_gpu_memory must be in (0, 1], got {cfg.rollout.vllm_gpu_memory}")
    if not 0.0 < cfg.rollout.top_p <= 1.0:
        raise ConfigError(f"rollout.top_p must be in (0, 1], got {cfg.rollout.top_p}")
    if cfg.rollout.max_new_tokens > cfg.rollout.max_tokens:
        raise ConfigError(f"rollout.max_new_tokens ({cfg.rollout.max_new_tokens}) must be <= "
                          f"rollout.max_tokens ({cfg.rollout.max_tokens}): one turn cannot "
                          "outgrow the whole episode")
    if cfg.algo.overlong_shaping and cfg.algo.overlong_cache > cfg.rollout.max_tokens:
        raise ConfigError(f"algo.overlong_cache ({cfg.algo.overlong_cache}) must be <= "
                          f"rollout.max_tokens ({cfg.rollout.max_tokens})")
    if "{answer}" not in cfg.algo.trace_answer:
        raise ConfigError(f"algo.trace_answer must contain '{{answer}}', got '{cfg.algo.trace_answer}'")
    if cfg.model.attention == "sink_flex" and cfg.model.device == "cpu":
        raise ConfigError("model.attention=sink_flex needs CUDA (FlexAttention has no CPU backward); "
                          "use sink_sdpa on CPU")


def _validate_context(cfg: RunConfig) -> None:
    """An operator needs a threshold it can reach and the in-process token-level engine."""
    c = cfg.context
    if not 0 < c.threshold_tokens < cfg.rollout.max_tokens:
        raise ConfigError(f"context.threshold_tokens must be in (0, rollout.max_tokens="
                          f"{cfg.rollout.max_tokens}), got {c.threshold_tokens}")
    if cfg.rollout.workers > 0 or cfg.rollout.engine != "hf":
        raise ConfigError(f"context.operator={c.operator} runs with the in-process hf engine only "
                          "(rollout.engine=hf, rollout.workers=0)")
    if cfg.model.attention not in ("sdpa", "eager", "sink_sdpa"):
        raise ConfigError(f"context.operator={c.operator} trains with a dense window mask: "
                          f"model.attention must be sdpa, eager or sink_sdpa, got {cfg.model.attention}")


def check_lora(cfg: RunConfig) -> None:
    """One-line errors for LoRA values that can only be mistakes (before any model loads; the
    rank's bound by the model's hidden width is checked where the adapters are made)."""
    m = cfg.model
    if m.lora_rank < 0:
        raise ConfigError(f"model.lora_rank must be >= 0 (0: no LoRA), got {m.lora_rank}")
    if m.lora_rank > 0 and m.lora_alpha <= 0:
        raise ConfigError(f"model.lora_alpha must be > 0, got {m.lora_alpha}")
    if not 0.0 <= m.lora_dropout < 1.0:
        raise ConfigError(f"model.lora_dropout must be in [0, 1), got {m.lora_dropout}")


def _check_key(key: str) -> None:
    if key in LEAF_TYPES:
        return

    head = key.partition(".")[0]
    if head not in SECTIONS and head not in LEAF_TYPES:
        _check_section(head, key)
    close = suggest(key, list(LEAF_TYPES))
    hint = f" (did you mean '{close}'?)" if close else ""
    raise ConfigError(f"unknown config key '{key}'{hint}")


def _check_section(name: str, key: str | None = None) -> None:
    """A one-line error for unknown section `name` (of `key`, a dotted key), naming the
    nearest section when it is a mistyped one (`trian`), or the nearest key of that section
    (`trian.stesp`: `train.steps`). With `key`, returns when no section is near (the caller's
    error for the key follows)."""
    close = suggest(name, sorted(SECTIONS))
    if close is None and key is not None:
        return
    rest = key.partition(".")[2] if key else ""
    if close and rest:
        near = suggest(rest, [k.partition(".")[2] for k in LEAF_TYPES if k.startswith(f"{close}.")])
        if near:
            raise ConfigError(f"unknown config key '{key}' (did you mean '{close}.{near}'?)")
    given = f" in '{key}'" if key and key != name else ""
    hint = f"did you mean '{close}'? " if close else ""
    raise ConfigError(f"unknown config section '{name}'{given} ({hint}sections: "
                      f"{', '.join(sorted(SECTIONS))})")

_ENV_KEY = re.compile(r"env\.(options\.)?[A-Za-z_][A-Za-z0-9_]*$")


def _check_given_key(key: str) -> None:
    """`_check_key` for a key as given (YAML, --set): an `env.NAME` key may be a user env's
    option, which `build` decides once the env's name is known."""
    if not _ENV_KEY.match(key):
        _check_key(key)


def check_model(cfg: RunConfig) -> None:
    """`model.name` is 'tiny', a local model folder or a hub id; a local folder given as a
    model or critic is a model, not a run folder. (Plugin names are checked where things are
    built: `app.preflight.check_names`.)"""
    m = cfg.model.name
    if m != "tiny" and not Path(m).expanduser().is_dir():
        hub_like = m.count("/") == 1 and not m.startswith((".", "/", "~"))
        if Path(m).expanduser().exists() or not hub_like:
            raise ConfigError(f"model not found: '{m}' is neither 'tiny', a local folder, nor a hub id")
    for key, path in (("model.name", m), ("model.critic_path", cfg.model.critic_path)):
        check_model_folder(key, path)


def check_model_folder(key: str, path: str) -> None:
    """A local folder given as a model must be one (a Hugging Face folder with config.json)."""
    p = Path(path).expanduser()
    if not path or path == "tiny" or not p.is_dir():
        return
    if (p / "checkpoints").is_dir() or (p / "metrics.jsonl").is_file():
        steps = sorted((p / "checkpoints").glob("step-*"))
        raise ConfigError(f"{key}: {path} is a run folder, not a model; give one of its "
                          f"checkpoints, e.g. {steps[-1] if steps else p / 'checkpoints' / 'step-N'}")
    if not (p / "config.json").is_file() and not (p / "adapter_config.json").is_file():
        raise ConfigError(f"{key}: {path} is a folder but not a model (no Hugging Face config.json)")


# What `train --resume` may change (how long, how often to check and save, where metrics and
# rollouts go): none of them changes what the run computes. Any other key, and the options
# --method/--env/--seed/--config/--model/--benchmark/--engine, would make the resumed run a
# different run, so a resume refuses them (`resume_changes`).
RESUME_KEYS = ("train.steps", "train.eval_every", "train.save_every", "train.trace_every",
               "train.log", "train.on_step_timeout_s", "rollout.workers", "rollout.ray_address")


def resume_changes(saved: RunConfig, resumed: RunConfig) -> dict[str, list]:
    """{key: [saved value, new value]} for the keys a resume changes; a key outside
    RESUME_KEYS is a one-line error naming it."""
    a, b = flatten(saved), flatten(resumed)
    changed = {k: [a[k], b[k]] for k in a if k != "out" and a[k] != b[k]}
    for key in changed:
        if key not in RESUME_KEYS:
            raise ConfigError(f"--set {key}={b[key]} would change the resumed run (it ran with "
                              f"{key}={a[key]}); a resume may change only "
                              f"{', '.join(RESUME_KEYS)}; start a new run with --out instead")
    return changed

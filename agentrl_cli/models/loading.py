"""Load the policy (and, through the trainer, its critic and reference) from config.

A model folder is any Hugging Face causal LM whose tokenizer has a chat template that renders
the `tool` role and ends an assistant message with a stop token (`chat.template_problem`;
`model.chat_template=PATH` supplies one). With `model.lora_rank > 0` the policy is wrapped
with LoRA adapters (`models/lora.py`); a folder of adapters (a LoRA run's checkpoint) loads
over its base model.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from . import lora
from ..errors import ConfigError
from ..config import RunConfig, check_lora
from .chat import ChatFormat
from .tiny import TinyRecipe, is_built, tiny_path

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("model.device=cuda but no CUDA device is available")
    return torch.device(name)


def tiny_recipe(cfg: RunConfig) -> TinyRecipe:
    return TinyRecipe(env=cfg.env, max_steps=cfg.model.tiny_warmup_steps,
                      target_success=cfg.model.tiny_target_success,
                      error_rate=cfg.model.tiny_error_rate)


def model_path(cfg: RunConfig) -> str:
    """The local folder of `tiny` (built for this config's env and warm-up settings) or the
    folder / hub id the user named. Building `tiny` is training: commands build it first
    (`app.tiny_build.ensure_model`); here a missing build is a one-line error."""
    if cfg.model.name == "tiny":
        path = tiny_path(tiny_recipe(cfg))
        if not is_built(path):
            raise ConfigError(f"the tiny model for env '{cfg.env.name}' is not built yet "
                              f"({path}): commands build it; in code call "
                              f"agentrl_cli.app.tiny_build.ensure_model(cfg) first")
        return str(path)
    return cfg.model.name


def quiet_transformers() -> None:
    """No per-shard progress bars from transformers: our own display reports progress."""
    # deferred: transformers takes seconds to import
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def apply_memory_options(model, cfg: RunConfig):
    """Activation checkpointing of the decoder layers when `model.gradient_checkpointing` is on
    (active only in train mode; the trainer's scoring passes run in eval mode without it)."""
    if cfg.model.gradient_checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


def load_model(path: str, cfg: RunConfig):
    # deferred: transformers takes seconds to import
    from transformers import AutoModelForCausalLM

    # deferred: importing it imports transformers (it registers the sink-aware attentions)
    from .attention import hf_attention_name

    quiet_transformers()

    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=DTYPES[cfg.model.dtype],
            attn_implementation=hf_attention_name(cfg.model.attention))
    except OSError as e:
        raise ConfigError(f"cannot load model '{path}': {str(e).splitlines()[0]}") from None
    return apply_memory_options(model, cfg)


def load_tokenizer(cfg: RunConfig, path: str):
    """The tokenizer of model folder `path`, with `model.chat_template`'s template if given."""
    # deferred: transformers takes seconds to import
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot load the tokenizer of '{path}': {str(e).splitlines()[0]}") from None
    if cfg.model.chat_template:
        f = Path(cfg.model.chat_template).expanduser()
        if not f.is_file():
            raise ConfigError(f"model.chat_template: no file {f}")
        tok.chat_template = f.read_text()
    return tok


def chat_format(cfg: RunConfig, path: str):
    """(tokenizer, ChatFormat) of model folder `path`: a template that lacks what agent episodes
    need is a one-line ConfigError naming the model and what is missing."""
    tok = load_tokenizer(cfg, path)
    source = (f"model.chat_template {cfg.model.chat_template}" if cfg.model.chat_template
              else f"model '{path}'")
    return tok, ChatFormat.from_tokenizer(tok, source, cfg.model.tool_format)


def _load_weights(path: str, cfg: RunConfig, log: Callable[[str], None]):
    """The model of folder `path`: full weights, or adapters over their base; with
    `model.lora_rank > 0` fresh adapters over full weights, or the folder's adapters trainable;
    with rank 0 a folder's adapters are merged into the base (a full fine-tune from there)."""
    check_lora(cfg)                       # a config built by `dataclasses.replace` skipped it
    if lora.is_adapter_folder(path):
        base = lora.adapter_base(path)
        if base.startswith(("/", ".", "~")) and not Path(base).expanduser().is_dir():
            raise ConfigError(f"the adapters in {path} were trained over {base}, which is not "
                              "a folder here (adapter_config.json: base_model_name_or_path)")
        model = lora.load_adapted(load_model(base, cfg), path, trainable=cfg.model.lora_rank > 0)
        if cfg.model.lora_rank == 0:
            return lora.merge(model)
        log(f"lora: the adapters of {path} over {base} (their own rank and targets)")
        return model
    model = load_model(path, cfg)
    if cfg.model.lora_rank > 0:
        model = lora.wrap(model, cfg, path)
        n = sum(p.numel() for p in lora.trainable_parameters(model))
        total = sum(p.numel() for p in model.parameters())
        log(f"lora: rank {cfg.model.lora_rank} adapters on "
            f"{', '.join(sorted(model.peft_config['default'].target_modules))}: "
            f"{n:,} of {total:,} parameters train")
    return model


def load_policy(cfg: RunConfig, log: Callable[[str], None] = print):
    """-> (model, tokenizer, ChatFormat, path) on the configured device, in eval mode."""
    device = resolve_device(cfg.model.device)
    if cfg.model.attention == "sink_flex" and device.type != "cuda":
        raise ConfigError("model.attention=sink_flex needs CUDA (FlexAttention has no CPU "
                          "backward); use sink_sdpa on CPU")
    path = model_path(cfg)
    tok, fmt = chat_format(cfg, path)     # a template problem fails before the weights load
    model = _load_weights(path, cfg, log).to(device)
    model.eval()
    return model, tok, fmt, path


def load_critic_model(cfg: RunConfig, policy_path: str | None, device: torch.device):
    """The model of a separate critic loaded from `model.critic_path` (train mode is the
    trainer's business). It reads the policy's token ids as they are, so its tokenizer must be
    the policy's: a different vocabulary is a one-line error, not silently wrong values."""
    # deferred: transformers takes seconds to import
    from transformers import AutoTokenizer

    path = cfg.model.critic_path
    try:
        theirs = AutoTokenizer.from_pretrained(path).get_vocab()
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.critic_path '{path}': no tokenizer to check against the "
                          f"policy's ({str(e).splitlines()[0]})") from None
    if policy_path is not None and theirs != AutoTokenizer.from_pretrained(policy_path).get_vocab():
        raise ConfigError(f"model.critic_path '{path}' has a different tokenizer from the policy "
                          f"'{policy_path}': the critic must read the policy's token ids")
    return load_model(path, cfg).to(device)

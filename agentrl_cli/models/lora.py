"""LoRA through PEFT: the policy with low-rank adapters (`model.lora_rank > 0`), its frozen
base as the reference, adapter checkpoints, and merged weights for an engine with its own copy.

PEFT is imported only here and only when LoRA is on (`require_peft`): a run without LoRA never
imports it, and a missing PEFT is a one-line error naming `pip install peft`.

- `wrap`: `get_peft_model` over the loaded model; only the adapters require gradients (the
  optimiser receives `trainable_parameters`). `model.lora_targets` empty: every linear layer
  (torch's `Linear`, or transformers' `Conv1D` as in GPT-2, adapted with `fan_in_fan_out`)
  whose name is a known attention or MLP projection (`PROJECTIONS`) present in the model. A
  rank above the model's hidden width is a one-line error (`check_rank`).
- `merge`: a folder's adapters merged into their base, every parameter trainable (a full
  fine-tune from a LoRA checkpoint).
- The policy stays a `PeftModel`: its forward, `get_decoder()` and `get_output_embeddings()`
  reach the wrapped model, whose target layers hold the adapters in place, so the `hf` engine,
  which shares the module, samples from the adapted model.
- `BaseView`: the reference model of a LoRA run (KL, TRACE). It is the same module: every
  forward through it runs inside PEFT's `disable_adapter()`, so there is no second copy.
- Checkpoints: `PeftModel.save_pretrained` writes `adapter_config.json` and
  `adapter_model.safetensors` (the adapters only); `adapter_config.json`'s
  `base_model_name_or_path` is the base folder (made absolute), from which `load_adapted`
  rebuilds the policy. `module_state` maps the file's keys to the module's (`--resume`).
- `merged_state_dict`: base + scale * B @ A per adapted layer under the base model's own names
  (what vLLM's `load_weights` reads), one layer at a time, without a merged copy of the model.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from ..errors import ConfigError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_FILE = "adapter_model.safetensors"
PEFT_HINT = "pip install peft (or pip install 'agentrl[lora]')"
# the attention and MLP projections of the common decoder families: Llama, Qwen, Mistral, Gemma
# (q/k/v/o_proj, gate/up/down_proj), Phi-3 (qkv_proj, gate_up_proj), Phi-1/2 and OPT (dense,
# out_proj, fc1, fc2), GPT-2 (c_attn, c_proj, c_fc: Conv1D), GPT-NeoX, Falcon and Bloom
# (query_key_value, dense, dense_h_to_4h, dense_4h_to_h), GPT-J (fc_in, fc_out), MPT (Wqkv);
# `default_targets` keeps those present in a model
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "gate_proj", "up_proj",
               "down_proj", "gate_up_proj", "c_attn", "c_proj", "c_fc", "query_key_value",
               "dense", "dense_h_to_4h", "dense_4h_to_h", "Wqkv", "out_proj", "fc1", "fc2",
               "fc_in", "fc_out")
LISTED = 6      # a one-line error names this many of a model's layers, then a count
_ADAPTER_KEY = re.compile(r"\.(lora_A|lora_B|lora_embedding_A|lora_embedding_B|lora_magnitude_vector)"
                          r"(?=\.|$)")


def require_peft():
    """The `peft` module, or a one-line ConfigError naming how to install it."""
    try:
        # deferred: optional extra (peft)
        import peft
    except ImportError:
        raise ConfigError(f"model.lora_rank > 0 needs PEFT, which is not installed: {PEFT_HINT}") from None
    return peft


def is_lora(model) -> bool:
    """Whether `model` is a PEFT model (without importing PEFT)."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def is_adapter_folder(path: str | Path) -> bool:
    """A folder holding PEFT adapters (a LoRA run's checkpoint) rather than full weights."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def _is_conv1d(mod) -> bool:
    # deferred: transformers takes seconds to import
    from transformers.pytorch_utils import Conv1D

    return isinstance(mod, Conv1D)


def _adaptable(mod) -> bool:
    """A layer LoRA adapts as a linear map: torch's `Linear`, or transformers' `Conv1D`
    (GPT-2's projections, a linear layer with its weight stored transposed)."""
    return isinstance(mod, torch.nn.Linear) or _is_conv1d(mod)


def linear_names(model) -> list[str]:
    """The distinct names (the last part) of `model`'s linear layers, sorted."""
    return sorted({name.rsplit(".", 1)[-1] for name, mod in model.named_modules()
                   if name and _adaptable(mod)})


def default_targets(model) -> list[str]:
    """The names in `PROJECTIONS` of the linear layers present in `model` (sorted)."""
    return sorted(set(linear_names(model)) & set(PROJECTIONS))


def _listed(names: list[str]) -> str:
    more = f" and {len(names) - LISTED} more" if len(names) > LISTED else ""
    return (", ".join(names[:LISTED]) + more) if names else "none"


def _targets(model, spec: str) -> list[str]:
    names = [t.strip() for t in spec.split(",") if t.strip()] if spec else default_targets(model)
    if not names:
        raise ConfigError("model.lora_targets: none of this model's linear layers has a known "
                          f"projection name; its linear layers: {_listed(linear_names(model))}; "
                          "set model.lora_targets=NAME,NAME to choose")
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in names if t not in present]
    if missing:
        raise ConfigError(f"model.lora_targets: no module named {', '.join(missing)} in this model "
                          f"(its linear layers: {_listed(linear_names(model))})")
    return names


def hidden_width(model) -> int | None:
    """The model's hidden size (`hidden_size`, GPT-2's `n_embd`, ...), None if its config has none."""
    conf = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    width = getattr(conf, "hidden_size", None)
    return width if isinstance(width, int) and width > 0 else None


def check_rank(model, rank: int) -> None:
    """A rank above the model's hidden width is a one-line error: an adapter's update B @ A
    cannot have a rank above its layer's width, so the excess only adds parameters."""
    width = hidden_width(model)
    if width is not None and rank > width:
        raise ConfigError(f"model.lora_rank={rank} is above this model's hidden width ({width}); "
                          f"use a rank of at most {width} (8-64 is usual)")


def wrap(model, cfg, base_path: str):
    """`model` with fresh LoRA adapters (`model.lora_*`); only the adapters train. The adapter
    config records `base_path` (absolute for a local folder) as the base to load them over."""
    peft = require_peft()
    m = cfg.model
    check_rank(model, m.lora_rank)
    targets = _targets(model, m.lora_targets)
    conf = peft.LoraConfig(r=m.lora_rank, lora_alpha=m.lora_alpha, lora_dropout=m.lora_dropout,
                           target_modules=targets, bias="none", task_type="CAUSAL_LM",
                           fan_in_fan_out=_transposed(model, targets))
    out = peft.get_peft_model(model, conf)
    _record_base(out, base_path)
    return out


def _transposed(model, targets: list[str]) -> bool:
    """Whether the targeted layers store their weight as (in, out) (`Conv1D`): PEFT's
    `fan_in_fan_out`."""
    return any(_is_conv1d(mod) for name, mod in model.named_modules()
               if name.rsplit(".", 1)[-1] in targets)


def merge(model):
    """A PEFT model's adapters merged into its base: a plain model whose every parameter
    trains. PEFT loads a folder's adapters over a frozen base, and merging keeps those flags."""
    return model.merge_and_unload().requires_grad_(True)


def _record_base(model, base_path: str) -> None:
    p = Path(base_path).expanduser()
    for conf in model.peft_config.values():
        conf.base_model_name_or_path = str(p.resolve()) if p.is_dir() else base_path


def adapter_base(path: str | Path) -> str:
    """The base model an adapter folder was trained over (`base_model_name_or_path`)."""
    f = Path(path) / ADAPTER_CONFIG
    try:
        base = json.loads(f.read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError) as e:
        raise ConfigError(f"{f} unreadable: {e}") from None
    if not base:
        raise ConfigError(f"{f} names no base model (base_model_name_or_path)")
    return base


def load_adapted(base_model, path: str | Path, trainable: bool):
    """The adapters of folder `path` over `base_model` (its base, loaded by the caller)."""
    peft = require_peft()
    model = peft.PeftModel.from_pretrained(base_model, str(path), is_trainable=trainable)
    _record_base(model, adapter_base(path))
    return model


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    """What the optimiser receives: the adapters of a PEFT model, every parameter otherwise
    (so a full fine-tune's optimiser state keeps its parameter order)."""
    if is_lora(model):
        return [p for p in model.parameters() if p.requires_grad]
    return list(model.parameters())


def module_state(weights: dict, adapter: str = "default") -> dict:
    """Adapter-file keys (`...q_proj.lora_A.weight`, as `save_pretrained` writes them) as the
    PEFT module's state-dict keys (`...q_proj.lora_A.default.weight`)."""
    return {_ADAPTER_KEY.sub(lambda m: f".{m.group(1)}.{adapter}", k, count=1): v
            for k, v in weights.items()}


class _Disabled(torch.nn.Module):
    """A submodule of a PEFT model called with the adapters disabled (not registered as a
    child: it adds no parameters and no state)."""

    def __init__(self, peft_model, module):
        super().__init__()
        object.__setattr__(self, "_peft", peft_model)
        object.__setattr__(self, "_inner", module)

    @property
    def config(self):
        return self._inner.config

    @property
    def weight(self):
        return self._inner.weight

    @property
    def bias(self):
        return self._inner.bias

    def forward(self, *args, **kwargs):
        with self._peft.disable_adapter():
            return self._inner(*args, **kwargs)


class BaseView:
    """The base model under a PEFT model, as the reference model of a LoRA run: the same
    module (no copy), every forward run inside `disable_adapter()`. Offers what the scoring
    passes use: `config`, `parameters()`, `get_decoder()`, `get_output_embeddings()`, calls."""

    def __init__(self, peft_model):
        self.peft = peft_model

    @property
    def config(self):
        return self.peft.config

    def parameters(self, recurse: bool = True):
        return self.peft.parameters(recurse)

    def eval(self):
        return self

    def get_decoder(self):
        return _Disabled(self.peft, self.peft.get_decoder())

    def get_output_embeddings(self):
        head = self.peft.get_output_embeddings()
        # a plain Linear head has no adapter (lm_head not targeted): the scoring pass reads its
        # weight directly (`sequences.logprobs_from_hidden`)
        return head if type(head) is torch.nn.Linear else _Disabled(self.peft, head)

    def __call__(self, *args, **kwargs):
        with self.peft.disable_adapter():
            return self.peft(*args, **kwargs)


def reference_of(model):
    """A LoRA policy's reference (`BaseView`), or None when `model` is not a PEFT model."""
    return BaseView(model) if is_lora(model) else None


@torch.no_grad()
def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """The weights of `model` with its adapters merged, under the base model's own names
    (`model.layers.0.self_attn.q_proj.weight`, ...); a model without adapters: its state dict.
    Only one merged tensor per adapted layer is made; the base weights are shared, not copied."""
    if not is_lora(model):
        return model.state_dict()
    base = model.get_base_model()
    deltas = {}
    for name, mod in base.named_modules():
        if hasattr(mod, "get_delta_weight") and hasattr(mod, "base_layer"):
            w = mod.get_base_layer().weight
            delta = sum((mod.get_delta_weight(a) for a in mod.active_adapters
                         if a in getattr(mod, "lora_A", {})), torch.zeros_like(w))
            deltas[f"{name}.base_layer.weight"] = (w + delta.to(w.dtype)).detach()
    out = {}
    for key, value in base.state_dict().items():
        if _ADAPTER_KEY.search(key) or ".lora_" in key:
            continue
        out[key.replace(".base_layer.", ".")] = deltas.get(key, value)
    return out

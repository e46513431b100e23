"""A wider copy of a decoder that computes the same function: a critic with more capacity that
starts from what the policy already reads (`agentrl widen`, then `model.critic_path`).

Function-preserving widening (Net2WiderNet, Chen et al. 2016) of a Llama-style decoder
(Llama, Qwen2, Qwen3, Mistral: RMSNorm, q/k/v/o and gate/up/down projections, with or without
biases; a reading projection keeps its bias, a writing one repeats it):

- the residual stream of width h becomes f x h, every unit repeated f times (x' = [x, ..., x]).
  RMSNorm sees the same mean square, so with its weight repeated its output is repeated too;
- a projection that reads the stream (q, k, v, gate, up, the LM head) gets its input columns
  split in f parts that sum to the old ones, so it computes exactly what it did: the parts are
  W/f plus zero-sum noise (`noise` x the std of W), which breaks the symmetry between the copies
  (with equal parts every copy would get the same gradient forever);
- a projection that writes the stream (o, down) and the embedding get their output rows
  repeated, so the stream stays repeated;
- with `widen_mlp`, the MLP's inner width grows the same way (gate and up rows repeated, down's
  input columns split).

Attention heads, head size and the per-head q/k norms are unchanged. The LM head is untied
from the embedding (they now need different weights). Hidden states of the wide model are the
old ones repeated, up to float rounding: `check_widened` measures it. A value head on the wide
model starts from scratch (`model.critic_path` starts its head at 0.5)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from .loading import quiet_transformers

_READS = ("q_proj", "k_proj", "v_proj")          # attention inputs: read the stream
_MLP_READS = ("gate_proj", "up_proj")


def _split_columns(w: torch.Tensor, f: int, noise: float, gen: torch.Generator) -> torch.Tensor:
    """[out, in] -> [out, f x in]: f parts of w / f, plus noise that sums to 0 over the parts."""
    parts = [w / f for _ in range(f)]
    if noise > 0 and f > 1:
        scale = noise * float(w.float().std())
        eps = [torch.randn(w.shape, generator=gen, dtype=torch.float32).to(w.dtype) * scale
               for _ in range(f - 1)]
        for i, e in enumerate(eps):
            parts[i] = parts[i] + e
        parts[-1] = parts[-1] - sum(eps)
    return torch.cat(parts, dim=1)


def _repeat_rows(w: torch.Tensor, f: int) -> torch.Tensor:
    return torch.cat([w] * f, dim=0)


def _widened_weights(model, f: int, noise: float, widen_mlp: bool,
                     gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Every parameter of the wide model, by name, from `model`'s (the rules of the module
    docstring)."""
    old = dict(model.named_parameters())
    new: dict[str, torch.Tensor] = {}
    for name, w in old.items():
        w = w.detach()
        leaf = name.split(".")[-2] if name.endswith((".weight", ".bias")) else name
        if name.endswith(".bias"):                  # reads: as it was; writes: repeated
            if leaf in _READS or (leaf in _MLP_READS and not widen_mlp) or leaf == "lm_head":
                new[name] = w.clone()
            elif leaf in ("o_proj", "down_proj") or leaf in _MLP_READS:
                new[name] = w.repeat(f)
            else:
                raise ValueError(f"widen: no rule for parameter '{name}' {tuple(w.shape)}")
        elif name.endswith("embed_tokens.weight"):
            new[name] = torch.cat([w] * f, dim=1)
        elif leaf in ("input_layernorm", "post_attention_layernorm", "norm"):
            new[name] = w.repeat(f)
        elif leaf in ("q_norm", "k_norm"):
            new[name] = w.clone()
        elif leaf in _READS:
            new[name] = _split_columns(w, f, noise, gen)
        elif leaf == "o_proj":
            new[name] = _repeat_rows(w, f)
        elif leaf in _MLP_READS:
            w2 = _split_columns(w, f, noise, gen)
            new[name] = _repeat_rows(w2, f) if widen_mlp else w2
        elif leaf == "down_proj":
            w2 = _split_columns(w, f, noise, gen) if widen_mlp else w
            new[name] = _repeat_rows(w2, f)
        elif name == "lm_head.weight":
            new[name] = _split_columns(w, f, noise, gen)
        else:
            raise ValueError(f"widen: no rule for parameter '{name}' {tuple(w.shape)}")
    if "lm_head.weight" not in new:                 # tied: the head read the embedding
        emb = next(w for n, w in old.items() if n.endswith("embed_tokens.weight")).detach()
        new["lm_head.weight"] = _split_columns(emb, f, noise, gen)
    return new


def widen(model, factor: int = 2, noise: float = 0.01, widen_mlp: bool = True, seed: int = 0):
    """A new model whose hidden size (and, with `widen_mlp`, MLP width) is `factor` times
    `model`'s and whose hidden states are `model`'s repeated `factor` times."""
    if factor < 2:
        raise ValueError(f"widen: factor must be at least 2, got {factor}")
    cfg = model.config
    inner = model.model
    if not all(hasattr(inner.layers[0], a) for a in ("self_attn", "mlp", "input_layernorm",
                                                     "post_attention_layernorm")):
        raise ValueError(f"widen: {type(model).__name__} is not a Llama-style decoder "
                         "(self_attn, mlp, input_layernorm, post_attention_layernorm)")
    f = factor
    gen = torch.Generator().manual_seed(seed)
    new_cfg = copy.deepcopy(cfg)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    new_cfg.head_dim = head_dim                     # heads keep their size
    new_cfg.hidden_size = cfg.hidden_size * f
    if widen_mlp:
        new_cfg.intermediate_size = cfg.intermediate_size * f
    new_cfg.tie_word_embeddings = False
    wide = type(model)(new_cfg).to(next(model.parameters()).dtype)
    new = _widened_weights(model, f, noise, widen_mlp, gen)
    missing = set(dict(wide.named_parameters())) - set(new)
    if missing:
        raise ValueError(f"widen: the wide model has parameters with no source: {sorted(missing)}")
    with torch.no_grad():
        for name, p in wide.named_parameters():
            if p.shape != new[name].shape:
                raise ValueError(f"widen: '{name}' is {tuple(p.shape)} in the wide model, "
                                 f"{tuple(new[name].shape)} from the rule")
            p.copy_(new[name])
    wide.eval()
    return wide


@torch.no_grad()
def check_widened(model, wide, ids: torch.Tensor) -> float:
    """Largest relative difference between `model`'s last hidden states on `ids` [B, T] and the
    first copy of `wide`'s (the others equal it): 0 up to float rounding when `wide = widen(model)`."""
    h = model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
    hw = wide(input_ids=ids, output_hidden_states=True).hidden_states[-1]
    f = hw.shape[-1] // h.shape[-1]
    worst = 0.0
    for i in range(f):
        part = hw[..., i * h.shape[-1]:(i + 1) * h.shape[-1]]
        worst = max(worst, float((part - h).abs().max() / h.abs().max().clamp(min=1e-12)))
    return worst


def widen_folder(src: str, out, factor: int = 2, noise: float = 0.01, widen_mlp: bool = True,
                 seed: int = 0, check_tokens: int = 64) -> dict:
    """Widen the model of folder `src` into the new folder `out` (weights, config, tokenizer and
    chat template, `widen.json`); -> what `widen.json` records, with the check on `check_tokens`
    random token ids. `out` must not exist or be empty."""
    # deferred: transformers takes seconds to import
    from transformers import AutoModelForCausalLM, AutoTokenizer


    quiet_transformers()
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"'{out}' exists and is not an empty folder")
    model = AutoModelForCausalLM.from_pretrained(src).eval()
    tok = AutoTokenizer.from_pretrained(src)
    wide = widen(model, factor, noise, widen_mlp, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, model.config.vocab_size, (2, max(2, check_tokens)), generator=gen)
    diff = check_widened(model, wide, ids)
    out.mkdir(parents=True, exist_ok=True)
    wide.save_pretrained(out)
    tok.save_pretrained(out)
    info = {"source": str(src), "factor": factor, "noise": noise, "widen_mlp": widen_mlp,
            "seed": seed, "hidden_size": wide.config.hidden_size,
            "intermediate_size": wide.config.intermediate_size,
            "parameters": sum(p.numel() for p in wide.parameters()),
            "source_parameters": sum(p.numel() for p in model.parameters()),
            "hidden_state_rel_diff": diff}
    (out / "widen.json").write_text(json.dumps(info, indent=2) + "\n")
    return info

"""Sink-aware attention (agentrl_cli/models/attention.py) equals transformers' gpt-oss eager
attention, in outputs and in gradients of q, k, v and the sinks; on a whole tiny gpt-oss model
too. The FlexAttention path is checked forward-only on CPU (PyTorch has no FlexAttention
backward on CPU) and fully by the `gpu`-marked test when CUDA is present."""
from __future__ import annotations

import types
import warnings

import pytest
import torch
import torch.nn.functional as F

from conftest import MICRO

from agentrl_cli import config
from agentrl_cli.errors import ConfigError
from agentrl_cli.engines.kv_cache import cache_arg
from agentrl_cli.models import attention as A

TOL = dict(atol=1e-5, rtol=1e-5)

# (batch, heads, kv_heads, q_len, kv_len, head_dim, sliding_window, block_size)
CASES = {
    "causal": (2, 4, 2, 48, 48, 8, None, None),
    "window-chunked": (2, 4, 2, 96, 96, 8, 12, 16),
    "window-ragged-blocks": (1, 4, 4, 70, 70, 8, 9, 13),
    "window-wider-than-seq": (2, 4, 2, 20, 20, 8, 64, None),
    "decode-after-cache": (2, 4, 2, 3, 40, 8, None, None),
    "decode-window": (2, 4, 1, 3, 40, 8, 8, None),
}


def _inputs(B, H, Hk, Lq, Lk, D, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Lq, D, generator=g).to(device).requires_grad_()
    k = torch.randn(B, Hk, Lk, D, generator=g).to(device).requires_grad_()
    v = torch.randn(B, Hk, Lk, D, generator=g).to(device).requires_grad_()
    sinks = (2 * torch.randn(H, generator=g)).to(device).requires_grad_()
    return q, k, v, sinks


def _allowed(Lq, Lk, window, device="cpu"):
    """[Lq, Lk] bool: queries are the last Lq key positions; causal, inside the window."""
    qp = torch.arange(Lk - Lq, Lk, device=device)[:, None]
    kp = torch.arange(Lk, device=device)[None, :]
    ok = qp >= kp
    if window is not None:
        ok &= (qp - kp) < window
    return ok


def _eager(q, k, v, sinks, window, allowed=None):
    """transformers' own gpt-oss eager attention with an explicit additive mask."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    H, Hk, Lq, Lk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    module = types.SimpleNamespace(num_key_value_groups=H // Hk, sinks=sinks, training=False)
    if allowed is None:
        allowed = _allowed(Lq, Lk, window, q.device)[None, None]
    mask = torch.zeros(allowed.shape, device=q.device).masked_fill(~allowed, torch.finfo(q.dtype).min)
    return eager_attention_forward(module, q, k, v, mask, scaling=q.shape[-1] ** -0.5)[0]


def _module(q, k):
    return types.SimpleNamespace(num_key_value_groups=q.shape[1] // k.shape[1], training=False)


def _check_fwd_bwd(fn, case, device="cpu", **kw):
    B, H, Hk, Lq, Lk, D, window, _ = case
    q, k, v, sinks = _inputs(B, H, Hk, Lq, Lk, D, device)
    ref = _eager(q, k, v, sinks, window)
    out, _ = fn(_module(q, k), q, k, v, None, scaling=D ** -0.5, sliding_window=window,
                s_aux=sinks, **kw)
    torch.testing.assert_close(out, ref, **TOL)
    grad = torch.randn_like(ref)
    want = torch.autograd.grad(ref, (q, k, v, sinks), grad)
    got = torch.autograd.grad(out, (q, k, v, sinks), grad)
    for name, a, b in zip("qkv", got, want):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, n=name: f"grad {n}: {m}")
    torch.testing.assert_close(got[3], want[3], **TOL, msg=lambda m: f"grad sinks: {m}")
    assert float(want[3].abs().max()) > 1e-3  # the sinks matter in this test


@pytest.mark.parametrize("name", list(CASES))
def test_sink_sdpa_equals_eager_forward_and_gradients(name):
    case = CASES[name]
    _check_fwd_bwd(A.sink_sdpa_attention, case, block_size=case[-1])


def test_sink_sdpa_honours_an_explicit_padding_mask():
    """Left-padded rows through transformers' dense boolean mask: sink column added, no NaN."""
    B, H, Hk, L, D = 2, 4, 2, 24, 8
    q, k, v, sinks = _inputs(B, H, Hk, L, L, D)
    allowed = _allowed(L, L, 10)[None, None].expand(B, 1, L, L).clone()
    allowed[0, :, :, :5] = False  # row 0 has 5 padding keys; its first queries see only the sink
    ref = _eager(q, k, v, sinks, None, allowed=allowed)
    out, _ = A.sink_sdpa_attention(_module(q, k), q, k, v, allowed, scaling=D ** -0.5,
                                   sliding_window=10, s_aux=sinks)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, **TOL)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v, sinks), g),
                    torch.autograd.grad(ref, (q, k, v, sinks), g)):
        torch.testing.assert_close(a, b, **TOL)


def test_sink_sdpa_builds_only_block_local_masks(monkeypatch):
    """The window is enforced per query block: no [L, L] mask (or score matrix) is ever built."""
    L, w, block = 256, 16, 32
    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append((tuple(q.shape), tuple(k.shape), None if attn_mask is None else tuple(attn_mask.shape)))
        return real(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(A.F, "scaled_dot_product_attention", spy)
    q, k, v, sinks = _inputs(1, 2, 1, L, L, 8)
    A.sink_sdpa_attention(_module(q, k), q, k, v, None, sliding_window=w, s_aux=sinks, block_size=block)
    assert len(seen) == L // block
    for q_shape, k_shape, m_shape in seen:
        assert q_shape[2] == block and k_shape[2] <= block + w  # sink + window + block
        assert m_shape == (block, k_shape[2])
    seen.clear()
    A.sink_sdpa_attention(_module(q, k), q, k, v, None, sliding_window=None, s_aux=sinks)
    assert seen == [((1, 2, L + 1, 9), (1, 2, L + 1, 9), None)]  # one fused causal call, no mask


@pytest.mark.parametrize("window", [None, 16])
def test_sink_sdpa_runs_on_the_fused_kernel(window):
    """Forward and backward pass with SDPA restricted to its fused (flash) CPU kernel: the
    math fallback, which builds the [L, L] score matrix, would raise here."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v, sinks = _inputs(1, 4, 2, 96, 96, 8)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out, _ = A.sink_sdpa_attention(_module(q, k), q, k, v, None, sliding_window=window,
                                       s_aux=sinks, block_size=32)
        out.square().sum().backward()
    assert sinks.grad is not None and torch.isfinite(q.grad).all()


def test_without_sinks_it_is_plain_causal_attention():
    q, k, v, _ = _inputs(2, 4, 2, 40, 40, 8)
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                         is_causal=True).transpose(1, 2)
    out, _ = A.sink_sdpa_attention(_module(q, k), q, k, v, None)
    torch.testing.assert_close(out, ref, **TOL)


@pytest.mark.parametrize("name", ["causal", "window-chunked", "decode-window"])
def test_sink_flex_forward_equals_eager_on_cpu(name):
    B, H, Hk, Lq, Lk, D, window, _ = CASES[name]
    q, k, v, sinks = (t.detach() for t in _inputs(B, H, Hk, Lq, Lk, D))
    ref = _eager(q, k, v, sinks, window)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        out, _ = A.sink_flex_attention(_module(q, k), q, k, v, None, scaling=D ** -0.5,
                                       sliding_window=window, s_aux=sinks)
    torch.testing.assert_close(out, ref, **TOL)


def _gpu_case(name):
    """The CPU case with head_dim 16 (GPU kernels' smallest comfortable width)."""
    B, H, Hk, Lq, Lk, _, window, block = CASES[name]
    return (B, H, Hk, Lq, Lk, 16, window, block)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["causal", "window-chunked", "decode-window"])
def test_sink_flex_equals_eager_on_gpu(name):
    torch.backends.cuda.matmul.allow_tf32 = False
    _check_fwd_bwd(A.sink_flex_attention, _gpu_case(name), device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["causal", "window-chunked", "decode-window"])
def test_sink_sdpa_equals_eager_on_gpu(name):
    torch.backends.cuda.matmul.allow_tf32 = False
    _check_fwd_bwd(A.sink_sdpa_attention, _gpu_case(name), device="cuda", block_size=CASES[name][-1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sink_flex_long_sequence_on_gpu():
    """Several FlexAttention blocks (128 wide) and a window that crosses block edges."""
    torch.backends.cuda.matmul.allow_tf32 = False
    _check_fwd_bwd(A.sink_flex_attention, (2, 4, 2, 640, 640, 64, 200, None), device="cuda")


# ------------------------------------------------------------------------- whole model
def tiny_gpt_oss(attn: str = "eager", window: int = 8, seed: int = 0, head_dim: int = 8):
    """A two-layer gpt-oss (sliding + full attention, sinks, MoE) small enough for CPU tests."""
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(seed)
    cfg = GptOssConfig(vocab_size=128, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
                       sliding_window=window, num_local_experts=2, num_experts_per_tok=1,
                       layer_types=["sliding_attention", "full_attention"],
                       attn_implementation=attn)
    model = GptOssForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.5)  # the default init is ~0: make them matter
    return model


def _logits_and_grads(model, ids, attn_mask=None):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=attn_mask).logits
    (logits.float() ** 2).mean().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("attention", ["sink_sdpa", "sink_flex"])
def test_tiny_gpt_oss_logits_equal_eager(attention):
    model = tiny_gpt_oss()
    ids = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(1))
    ref, ref_grads = _logits_and_grads(model, ids)
    model.set_attn_implementation(A.hf_attention_name(attention))
    assert model.model.layers[0].self_attn.config._attn_implementation == A.hf_attention_name(attention)
    if attention == "sink_flex":  # forward only on CPU
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.testing.assert_close(model(input_ids=ids).logits, ref, **TOL)
        return
    out, grads = _logits_and_grads(model, ids)
    torch.testing.assert_close(out, ref, **TOL)
    assert set(grads) == set(ref_grads) and any("sinks" in n for n in grads)
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], **TOL, msg=lambda m, n=n: f"{n}: {m}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("attention", ["sink_flex", "sink_sdpa"])
def test_tiny_gpt_oss_equals_eager_on_gpu(attention):
    """Whole model on CUDA: logits and every parameter's gradient; then left padding, which
    goes through transformers' mask builders (BlockMask for flex, dense for sdpa)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    model = tiny_gpt_oss(window=64, head_dim=16).cuda()
    ids = torch.randint(0, 128, (2, 300), generator=torch.Generator().manual_seed(1)).cuda()
    mask = torch.ones_like(ids)
    mask[0, :17] = 0
    ref, ref_grads = _logits_and_grads(model, ids)
    with torch.no_grad():
        ref_padded = model(input_ids=ids, attention_mask=mask).logits
    model.set_attn_implementation(A.hf_attention_name(attention))
    out, grads = _logits_and_grads(model, ids)
    torch.testing.assert_close(out, ref, **TOL)
    assert set(grads) == set(ref_grads)
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], **TOL, msg=lambda m, n=n: f"{n}: {m}")
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(padded[0, 17:], ref_padded[0, 17:], **TOL)
    torch.testing.assert_close(padded[1], ref_padded[1], **TOL)


def test_tiny_gpt_oss_padding_and_kv_cache_equal_eager():
    """Generation-style use: left padding (dense-mask path) and cached decoding steps."""
    from transformers import DynamicCache

    model = tiny_gpt_oss().eval()
    ids = torch.randint(0, 128, (2, 30), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 30, dtype=torch.long)
    mask[0, :6] = 0
    outs = {}
    for name in ("eager", "sink_sdpa"):
        model.set_attn_implementation(A.hf_attention_name(name))
        with torch.no_grad():
            padded = model(input_ids=ids, attention_mask=mask).logits
            cache = DynamicCache(config=model.config)
            model(input_ids=ids[:, :20], **cache_arg(model, cache), use_cache=True)
            step = model(input_ids=ids[:, 20:23], **cache_arg(model, cache), use_cache=True).logits
            last = model(input_ids=ids[:, 23:24], **cache_arg(model, cache), use_cache=True).logits
        outs[name] = (padded[0, 6:], padded[1], step, last)
    for a, b in zip(outs["sink_sdpa"], outs["eager"]):
        torch.testing.assert_close(a, b, **TOL)


# ------------------------------------------------------------------------------ config
def test_attention_config_is_validated():
    assert config.load(sets=["model.attention=sink_sdpa"]).model.attention == "sink_sdpa"
    assert config.load(sets=["model.attention=sink_flex", "model.device=cuda"]).model.attention == "sink_flex"
    with pytest.raises(ConfigError, match="model.attention must be one of"):
        config.load(sets=["model.attention=sink"])
    with pytest.raises(ConfigError, match="sink_flex needs CUDA"):
        config.load(sets=["model.attention=sink_flex", "model.device=cpu"])


def test_policy_loads_with_sink_sdpa(micro_policy):
    """The built-in tiny model (Qwen3, no sinks) loads with `sink_sdpa` and keeps its logits."""
    from agentrl_cli.models.loading import load_policy

    model, _, _, _ = micro_policy
    cfg = config.load(sets=MICRO + ["model.attention=sink_sdpa"])
    sink_model, _, _, _ = load_policy(cfg, log=lambda s: None)
    assert sink_model.config._attn_implementation == "sink_fused"
    ids = torch.randint(5, 100, (2, 33), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(sink_model(input_ids=ids).logits, model(input_ids=ids).logits, **TOL)

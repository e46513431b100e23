"""The memory-lean training step (docs/methods.md) computes the same loss and gradients as the
plain step: chunked, recomputed log-probs; activation checkpointing; micro-batches packed by
token budget with gradient accumulation."""
from __future__ import annotations

import copy

import pytest
import torch
from conftest import MICRO, random_batch

from agentrl_cli import config
from agentrl_cli.models.sequences import hidden_states, logprobs_from_hidden
from agentrl_cli.train.batch import microbatches
from agentrl_cli.train.learner import build_learner, score, update
from agentrl_cli.app.tiny_build import load_policy

TOL = dict(atol=1e-6, rtol=1e-4)


class SavedSizes:
    """Records the element count of every tensor autograd saves for backward."""

    def __init__(self):
        self.sizes: list[int] = []

    def __enter__(self):
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda x: x)
        self._ctx.__enter__()
        return self

    def _pack(self, t):
        self.sizes.append(t.numel())
        return t

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)


def test_chunked_logprobs_equal_plain_and_never_keep_full_logits(micro_policy):
    model = copy.deepcopy(micro_policy[0]).train()
    V = model.get_output_embeddings().weight.shape[0]
    ids = torch.randint(5, V, (2, 150), generator=torch.Generator().manual_seed(0))
    out = {}
    for chunk in (0, 32):
        model.zero_grad(set_to_none=True)
        h = hidden_states(model, ids, torch.ones_like(ids)).detach().requires_grad_()
        with SavedSizes() as saved:
            lp = logprobs_from_hidden(model, h, ids, temperature=0.7, chunk=chunk)
        (lp * torch.linspace(-1, 1, lp.shape[1])).sum().backward()
        out[chunk] = (lp.detach(), h.grad, model.get_output_embeddings().weight.grad.clone(),
                      sum(saved.sizes))
    for a, b in zip(out[32][:3], out[0][:3]):
        torch.testing.assert_close(a, b, **TOL)
    full = 2 * 149 * V
    assert out[0][3] >= full          # the plain path keeps [B, L, V] for backward
    assert out[32][3] < full // 4     # the chunked path does not: logits are recomputed


@pytest.mark.parametrize("chunk", [0, 32])
def test_policy_only_logprobs_equal_full_ones_where_needed(micro_policy, chunk):
    """`where` (the trainer's policy tokens): the same log-probs and gradients there as the full
    computation, 0 elsewhere, and the LM head's saved inputs shrink to the selected tokens."""
    model = copy.deepcopy(micro_policy[0]).train()
    head = model.get_output_embeddings().weight
    V = head.shape[0]
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, V, (3, 120), generator=g)
    where = torch.rand(3, 119, generator=g) < 0.15
    weights = torch.randn(3, 119, generator=g)
    out = []
    for sel in (None, where):
        model.zero_grad(set_to_none=True)
        h = hidden_states(model, ids, torch.ones_like(ids)).detach().requires_grad_()
        with SavedSizes() as saved:
            lp = logprobs_from_hidden(model, h, ids, temperature=0.7, chunk=chunk, where=sel)
        (lp * weights * where).sum().backward()
        out.append((lp.detach(), h.grad, head.grad.clone(), sum(saved.sizes)))
    (full, gh_full, gw_full, saved_full), (part, gh_part, gw_part, saved_part) = out
    torch.testing.assert_close(part[where], full[where], **TOL)
    assert float(part[~where].abs().max()) == 0.0 and float(full[~where].abs().min()) > 0.0
    torch.testing.assert_close(gh_part, gh_full, **TOL)
    torch.testing.assert_close(gw_part, gw_full, **TOL)
    assert float(gw_full.abs().sum()) > 0.0
    if chunk:
        assert saved_part < saved_full / 3


def test_gradient_checkpointing_is_wired_and_saves_activations(micro_policy):
    cfg = config.load(sets=MICRO + ["model.gradient_checkpointing=true"])
    lean, _, _, _ = load_policy(cfg, log=lambda s: None)
    plain = copy.deepcopy(micro_policy[0])
    name = "is_activation_checkpointing" if hasattr(lean, "is_activation_checkpointing") \
        else "is_gradient_checkpointing"  # the attribute's name before transformers 5.2x
    on = lambda m: getattr(m, name)
    assert on(lean) and not on(plain)
    ids = torch.randint(5, 500, (2, 64), generator=torch.Generator().manual_seed(1))
    grads, saved = [], []
    for model in (plain, lean):
        model.train()
        with SavedSizes() as s:
            loss = logprobs_from_hidden(model, hidden_states(model, ids, torch.ones_like(ids)), ids).mean()
        loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
        saved.append(sum(s.sizes))
        model.eval()
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], **TOL)
    assert saved[1] < saved[0] / 3


def test_microbatches_pack_by_token_budget():
    lengths = [10, 100, 12, 95, 11, 90, 40, 300]
    batch = random_batch(lengths, vocab=50)
    groups = microbatches(batch, 200)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        longest = max(lengths[i] for i in g)
        assert len(g) * longest <= 200 or len(g) == 1
    padded = sum(len(g) * max(lengths[i] for i in g) for g in groups)
    # longest first: [300] [100, 95] [90, 40] [12, 11, 10]; packing consecutive rows instead
    # pads short rows up to long neighbours: [10, 100] [12, 95] [11, 90] [40] [300] = 910 tokens
    assert (len(groups), padded) == (4, 716)


@pytest.mark.parametrize("method", ["grpo", "ppo", "dr_grpo"])
def test_memory_lean_step_equals_plain_step(method):
    """Chunked log-probs + activation checkpointing + sink_sdpa + several micro-batches (gradient
    accumulation) give the plain step's loss and gradients (unchunked, no checkpointing, one
    micro-batch)."""
    common = MICRO + ["train.grad_clip=0", "rollout.temperature=0.8"]
    plain_cfg = config.load(method=method, sets=common + [
        "train.logprob_chunk=0", "train.max_tokens_per_microbatch=100000"])
    lean_cfg = config.load(method=method, sets=common + [
        "train.logprob_chunk=16", "model.gradient_checkpointing=true", "model.attention=sink_sdpa",
        "train.max_tokens_per_microbatch=200"])
    results = []
    batch0 = None
    for cfg in (plain_cfg, lean_cfg):
        model, _, _, _ = load_policy(cfg, log=lambda s: None)
        learner = build_learner(cfg, model)
        if batch0 is None:
            batch0 = random_batch([70, 33, 64, 20, 71, 45], model.config.vocab_size)
            score(learner, batch0, cfg)  # old log-probs / values from the plain model
            g = torch.Generator().manual_seed(4)
            mask = batch0.response_mask
            batch0.old_logprobs = batch0.old_logprobs + 0.3 * torch.randn(mask.shape, generator=g) * mask
            batch0.advantages = torch.randn(mask.shape, generator=g) * mask
            if batch0.old_values is not None:
                batch0.returns = torch.rand(mask.shape, generator=g) * mask
                # critic targets on a sparse subset of the policy tokens (as FOCUS's tree
                # nodes): the logged critic stats must be weighted by their own share
                batch0.value_mask = mask * (torch.rand(mask.shape, generator=g) < 0.2)
        n_micro = len(microbatches(batch0, cfg.train.max_tokens_per_microbatch))
        stats = update(learner, copy.copy(batch0), cfg, step=1)
        grads = {n: p.grad.clone() for n, p in zip(range(len(learner.params)), learner.params)}
        results.append((n_micro, stats, grads))
    (n_plain, s_plain, g_plain), (n_lean, s_lean, g_lean) = results
    assert n_plain == 1 and n_lean >= 3
    assert s_plain["loss/policy"] == pytest.approx(s_lean["loss/policy"], rel=1e-5, abs=1e-7)
    assert abs(s_plain["loss/policy"]) > 1e-4
    if method == "ppo":
        assert s_plain["loss/critic"] == pytest.approx(s_lean["loss/critic"], rel=1e-5)
    assert g_plain.keys() == g_lean.keys()
    for n in g_plain:
        torch.testing.assert_close(g_lean[n], g_plain[n], **TOL)
    assert sum(float(g.abs().sum()) for g in g_plain.values()) > 0

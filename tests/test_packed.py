"""Packed forward passes (`train.pack`): a micro-batch's episodes in one row without padding give
the padded forward's log-probs and values, no episode sees another, and an update on packed
micro-batches has the padded update's loss and gradients."""
from __future__ import annotations

import copy

import pytest
import torch
from conftest import MICRO, random_batch

from agentrl_cli import config
from agentrl_cli.models.critic import build_critic
from agentrl_cli.models.sequences import (can_pack, logprobs_from_hidden, pack_rows,
                                          packed_hidden_states, unpack_next)
from agentrl_cli.train.batch import forward, microbatches
from agentrl_cli.train.learner import build_learner, score, update

LENGTHS = [70, 33, 64, 20, 71, 45, 1, 2]


def _value_critic(model, form, seed=0):
    torch.manual_seed(seed)
    critic = build_critic(form, model)
    with torch.no_grad():
        critic.weight.normal_(std=0.3)
    return critic


@pytest.mark.parametrize("form", [None, "head", "separate"])
def test_packed_forward_equals_padded(micro_policy, form):
    model = copy.deepcopy(micro_policy[0]).eval()
    critic = _value_critic(model, form) if form else None
    batch = random_batch(LENGTHS, model.config.vocab_size)
    with torch.no_grad():
        lp, v = forward(model, critic, batch, 0.7, chunk=16)
        plp, pv = forward(model, critic, batch, 0.7, chunk=16, pack=True)
    real = batch.attention_mask.bool()
    real[:, 0] = False                   # position 0 carries nothing in either layout
    policy = batch.response_mask.bool()  # log-probs exist for policy tokens only
    torch.testing.assert_close(plp[policy], lp[policy], atol=1e-6, rtol=0)
    assert float(plp[~policy].abs().max()) == 0.0
    assert float(lp[policy].abs().min()) > 0.0    # real log-probs, not zeros
    if form:
        # values are a random head's dot product with 128 hidden features (|v| up to ~1): the
        # two layouts' float reductions differ by a few ulps of that (2.4e-6 seen on one CPU)
        torch.testing.assert_close(pv[real], v[real], atol=1e-6, rtol=1e-5)
        assert float(pv[~real].abs().max()) == 0.0
        assert float(v[real].std()) > 1e-3


def test_packed_episodes_do_not_see_each_other(micro_policy):
    """Changing one episode's tokens changes its own packed log-probs and no other's; position
    ids restart, so an episode's outputs do not depend on where it sits in the row."""
    model = micro_policy[0].eval()
    batch = random_batch(LENGTHS[:4], model.config.vocab_size)
    other = random_batch(LENGTHS[:4], model.config.vocab_size, seed=1)
    ids = batch.input_ids.clone()
    ids[1] = other.input_ids[1]
    attn = batch.attention_mask
    rows = []
    with torch.no_grad():
        for x, m in ((batch.input_ids, attn), (ids, attn), (batch.input_ids.flip(0), attn.flip(0))):
            flat, pos, bounds = pack_rows(x, m)
            h = packed_hidden_states(model, flat, pos, bounds)
            rows.append(unpack_next(logprobs_from_hidden(model, h, flat)[0], m, bounds))
    a, b, flipped = rows
    assert torch.equal(a[[0, 2, 3]], b[[0, 2, 3]])
    assert float((a[1] - b[1]).abs().max()) > 1e-3
    torch.testing.assert_close(flipped.flip(0), a, atol=1e-6, rtol=0)


def test_unpack_next_drops_cross_episode_entries():
    attn = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    _, _, bounds = pack_rows(torch.zeros_like(attn), attn)
    assert bounds == [(0, 3), (3, 4), (4, 8)]
    x = torch.arange(7, dtype=torch.float) + 1     # entry t: about packed token t + 1
    out = unpack_next(x, attn, bounds)
    # row 0: tokens 1, 2 <- entries 0, 1 (entry 2 is about row 1's token); row 1: nothing
    # (entry 3 is about row 2's first token); row 2: tokens 1..3 <- entries 4..6
    assert out.tolist() == [[0, 1, 2, 0], [0, 0, 0, 0], [0, 5, 6, 7]]


def test_microbatches_count_real_tokens_when_packed():
    lengths = [10, 100, 12, 95, 11, 90, 40, 300]
    batch = random_batch(lengths, vocab=50)
    groups = microbatches(batch, 200, packed=True)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        assert sum(lengths[i] for i in g) <= 200 or len(g) == 1
    # longest first, filled by real tokens: [300] [100, 95] [90, 40, 12, 11, 10]
    assert groups == [[7], [1, 3], [5, 6, 2, 4, 0]]
    assert len(microbatches(batch, 200)) == 4          # padded: [300] [100 95] [90 40] [12 11 10]


@pytest.mark.parametrize("method", ["grpo", "ppo", "gspo"])
def test_packed_update_equals_padded_update(micro_policy, method):
    """Same batch, same weights: `train.pack=true` gives the padded update's loss, statistics
    and gradients (several packed micro-batches, token-mean / seq-mean aggregation unchanged)."""
    common = MICRO + ["train.grad_clip=0", "rollout.temperature=0.8", "train.logprob_chunk=16",
                      "train.max_tokens_per_microbatch=150", "train.tree_pack=false"]
    out = []
    batch0 = None
    for pack in (False, True):
        cfg = config.load(method=method, sets=common + [f"train.pack={str(pack).lower()}"])
        model = copy.deepcopy(micro_policy[0])
        learner = build_learner(cfg, model, log=lambda s: None)
        assert can_pack(model)
        if batch0 is None:
            batch0 = random_batch(LENGTHS, model.config.vocab_size)
            score(learner, batch0, cfg)
            g = torch.Generator().manual_seed(4)
            mask = batch0.response_mask
            batch0.old_logprobs = batch0.old_logprobs + 0.3 * torch.randn(mask.shape, generator=g) * mask
            batch0.advantages = torch.randn(mask.shape, generator=g) * mask
            if learner.critic is not None:
                with torch.no_grad():
                    learner.critic.weight.normal_(std=0.3, generator=g)
                batch0.returns = torch.rand(mask.shape, generator=g) * mask
                batch0.value_mask = mask
        if learner.critic is not None:
            with torch.no_grad():
                learner.critic.weight.copy_(torch.linspace(-0.3, 0.3, model.config.hidden_size))
        n_micro = len(microbatches(batch0, cfg.train.max_tokens_per_microbatch, pack))
        stats = update(learner, copy.copy(batch0), cfg, step=1)
        out.append((n_micro, stats, [p.grad.clone() for p in learner.params]))
    (n_pad, s_pad, g_pad), (n_pack, s_pack, g_pack) = out
    assert n_pack >= 2 and n_pad >= 2
    assert s_pad.keys() == s_pack.keys()
    # statistics are per-micro-batch values weighted by the micro-batch's share, so only those
    # that are token means under token-mean weights are independent of the grouping (a maximum
    # never is; under seq-mean only the loss is)
    keys = ([k for k in s_pad if k != "ratio/max"] if method != "gspo"
            else ["loss/policy"])
    for k in keys:
        assert s_pack[k] == pytest.approx(s_pad[k], rel=1e-5, abs=1e-7), k
    assert abs(s_pad["loss/policy"]) > 1e-4
    for a, b in zip(g_pack, g_pad):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    assert sum(float(g.abs().sum()) for g in g_pad) > 0


def test_pack_falls_back_to_padded_where_it_cannot_run(micro_policy):
    """Context windows (a reset episode) and activation checkpointing run the padded pass."""
    model = micro_policy[0].eval()
    batch = random_batch([30, 20], model.config.vocab_size)
    batch.window_index = torch.zeros_like(batch.input_ids)
    batch.window_index[0, 10:] = 1
    with torch.no_grad():
        lp, _ = forward(model, None, batch, 1.0, pack=True)
        ref, _ = forward(model, None, batch, 1.0)
    assert torch.equal(lp, ref)                    # padded layout, garbage on padding included
    lean = copy.deepcopy(model)
    lean.gradient_checkpointing_enable()
    assert not can_pack(lean) and can_pack(model)

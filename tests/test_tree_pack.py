"""Tree-packed forward passes (`train.tree_pack`): episodes that share a prefix (a FOCUS tree's
paths copy their source path up to the node) run as one row holding each distinct token once,
under a tree attention mask. Log-probs, values and gradients equal the per-episode forward's;
each shared token is forwarded once."""
from __future__ import annotations

import copy

import pytest
import torch
from conftest import MICRO

from agentrl_cli import config
from agentrl_cli.models.critic import build_critic
from agentrl_cli.models.sequences import tree_mask, tree_pack_rows
from agentrl_cli.train.batch import Batch, forward, microbatches
from agentrl_cli.train.learner import build_learner, score, update

# (source row, tokens shared with it, own length): forks at depths 30, 60, 50 (from a fork), a
# path identical to its source, a leaf that stops inside its source, and a second task's tree
TREE = [(None, 0, 90), (0, 30, 75), (0, 60, 100), (1, 50, 64), (0, 90, 90), (2, 40, 40),
        (None, 0, 55), (6, 20, 48)]
DISTINCT = 90 + 45 + 40 + 14 + 0 + 0 + 55 + 28


def tree_batch(vocab: int, seed: int = 0) -> Batch:
    """Hand-built paths of two trees: a path copies its source's tokens (and their response
    mask) up to the fork, then has its own random tokens."""
    g = torch.Generator().manual_seed(seed)
    B, L = len(TREE), max(n for _, _, n in TREE)
    ids = torch.zeros(B, L, dtype=torch.long)
    attn = torch.zeros(B, L, dtype=torch.long)
    resp = torch.zeros(B, L)
    for i, (src, share, n) in enumerate(TREE):
        ids[i, :n] = torch.randint(5, vocab, (n,), generator=g)
        resp[i, 8:n] = (torch.rand(max(n - 8, 0), generator=g) < 0.7).float()
        if src is not None:
            ids[i, :share] = ids[src, :share]
            resp[i, :share] = resp[src, :share]
            if share < n:                    # the fork: a different next token
                ids[i, share] = (ids[src, share] - 5 + 1) % (vocab - 5) + 5
        attn[i, :n] = 1
    turn = torch.where(resp > 0, torch.arange(L).expand(B, L) // 16, torch.full((B, L), -1))
    return Batch(input_ids=ids, attention_mask=attn, response_mask=resp,
                 engine_logprobs=torch.zeros(B, L), turn_index=turn, segment_index=turn.clone(),
                 rewards=torch.rand(B, generator=g),
                 group_index=torch.tensor([0, 0, 0, 0, 0, 0, 1, 1]))


def assert_rel(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-5) -> None:
    """|a - b| within `rel` of b's scale (its largest |entry|): float reductions in another
    order differ by a few ulps of the scale, which an entry near 0 cannot be held to."""
    scale = float(b.abs().max())
    assert scale > 0 and float((a - b).abs().max()) <= rel * scale, float((a - b).abs().max())


def random_critic(model, form: str):
    """A seeded critic of `form` whose values spread (a random head, std 0.3)."""
    torch.manual_seed(0)
    critic = build_critic(form, model)
    with torch.no_grad():
        critic.weight.normal_(std=0.3)
    return critic


def per_path_and_tree(model, critic, batch, temperature: float):
    """(per-path log-probs, values, tree log-probs, values, real next-token positions, policy
    positions) of one batch."""
    with torch.no_grad():
        lp, v = forward(model, critic, batch, temperature, chunk=16)
        tlp, tv = forward(model, critic, batch, temperature, chunk=16, pack="tree")
    real = batch.attention_mask.bool()
    real[:, 0] = False
    return lp, v, tlp, tv, real, batch.response_mask.bool()


def test_tree_pack_rows_keeps_each_distinct_token_once():
    b = tree_batch(50)
    flat, pos, parent, index = tree_pack_rows(b.input_ids, b.attention_mask)
    assert flat.shape[0] == DISTINCT
    real = index >= 0
    assert torch.equal(real, b.attention_mask.bool())
    assert torch.equal(flat[index[real]], b.input_ids[real])            # same token everywhere
    assert torch.equal(pos[index[real]], torch.arange(b.input_ids.shape[1]).expand_as(index)[real])
    assert torch.equal(index[1, :30], index[0, :30]) and index[1, 30] != index[0, 30]
    assert torch.equal(index[3, :50], index[1, :50]) and torch.equal(index[4], index[0])
    assert int((parent < 0).sum()) == 2                                   # one root per task
    for i, n in enumerate(b.attention_mask.sum(1).tolist()):              # parents follow rows
        assert torch.equal(parent[index[i, 1:n]], index[i, :n - 1])
    mask = tree_mask(index, b.attention_mask.sum(1).tolist())
    # a token sees exactly its path's tokens up to itself: row 3's token 60 sees row 1's first
    # 50 tokens (through the fork) and none of row 0's tokens after 30
    q = int(index[3, 60])
    assert set(mask[q].nonzero().squeeze(1).tolist()) == set(index[3, :61].tolist())
    assert not mask[q, index[0, 30:]].any()
    assert int(mask.sum()) == sum(int(pos[t]) + 1 for t in range(flat.shape[0]))


@pytest.mark.parametrize("form", [None, "head", "separate"])
def test_tree_forward_equals_per_path(micro_policy, form):
    model = copy.deepcopy(micro_policy[0]).eval()
    critic = random_critic(model, form) if form else None
    lp, v, tlp, tv, real, policy = per_path_and_tree(model, critic,
                                                     tree_batch(model.config.vocab_size), 0.7)
    assert_rel(tlp[policy], lp[policy])
    assert float(tlp[~policy].abs().max()) == 0.0
    assert float(lp[policy].abs().min()) > 0.0
    if form:
        assert_rel(tv[real], v[real])
        assert float(v[real].std()) > 1e-3


def test_tree_paths_do_not_see_their_siblings(micro_policy):
    """Changing one path's tokens after its fork changes its own outputs and no other path's."""
    model = micro_policy[0].eval()
    batch = tree_batch(model.config.vocab_size)
    other = copy.deepcopy(batch)
    other.input_ids[2, 70:] = (other.input_ids[2, 70:] + 1) % model.config.vocab_size
    with torch.no_grad():
        a, _ = forward(model, None, batch, 1.0, pack="tree")
        b, _ = forward(model, None, other, 1.0, pack="tree")
    rows = [0, 1, 3, 4, 5, 6, 7]
    assert torch.equal(a[rows], b[rows])
    assert float((a[2, 71:] - b[2, 71:]).abs().max()) > 1e-3


def test_tree_microbatches_count_distinct_tokens():
    b = tree_batch(50)
    one = microbatches(b, 10_000, "tree")
    assert one == [[2, 0, 4, 1, 3, 5, 6, 7]]              # by group, longest first
    groups = microbatches(b, 200, "tree")
    assert sorted(i for g in groups for i in g) == list(range(len(TREE)))
    for g in groups:
        sub = b.select(g)
        flat, *_ = tree_pack_rows(sub.input_ids, sub.attention_mask)
        assert flat.shape[0] <= 200 or len(g) == 1
    assert len(groups) < len(microbatches(b, 200, True))  # fewer than counting every copy


@pytest.mark.parametrize("method", ["grpo", "ppo"])
def test_tree_update_equals_per_path_update(micro_policy, method):
    """Same batch, same weights: the tree-packed update has the per-path update's loss,
    statistics and gradients (relative 1e-5), over several micro-batches."""
    common = MICRO + ["train.grad_clip=0", "rollout.temperature=0.8", "train.logprob_chunk=16",
                      "train.max_tokens_per_microbatch=200"]
    out, batch0 = [], None
    for tree in (False, True):
        cfg = config.load(method=method, sets=common + [f"train.tree_pack={str(tree).lower()}"])
        model = copy.deepcopy(micro_policy[0])
        learner = build_learner(cfg, model, log=lambda s: None)
        if batch0 is None:
            batch0 = tree_batch(model.config.vocab_size)
            score(learner, batch0, cfg)
            g = torch.Generator().manual_seed(4)
            mask = batch0.response_mask
            batch0.old_logprobs = batch0.old_logprobs + 0.3 * torch.randn(mask.shape, generator=g) * mask
            batch0.advantages = torch.randn(mask.shape, generator=g) * mask
            if learner.critic is not None:
                batch0.returns = torch.rand(mask.shape, generator=g) * mask
                batch0.value_mask = mask
        if learner.critic is not None:
            with torch.no_grad():
                learner.critic.weight.copy_(torch.linspace(-0.3, 0.3, model.config.hidden_size))
        form = "tree" if tree else False
        n_micro = len(microbatches(batch0, cfg.train.max_tokens_per_microbatch, form))
        stats = update(learner, copy.copy(batch0), cfg, step=1)
        out.append((n_micro, stats, [p.grad.clone() for p in learner.params]))
    (n_path, s_path, g_path), (n_tree, s_tree, g_tree) = out
    assert n_tree >= 2
    for k in [k for k in s_path if k != "ratio/max"]:
        assert s_tree[k] == pytest.approx(s_path[k], rel=1e-5, abs=1e-7), k
    assert abs(s_path["loss/policy"]) > 1e-4
    for a, b in zip(g_tree, g_path):
        assert_rel(a, b)
    assert sum(float(g.abs().sum()) for g in g_path) > 0


@pytest.mark.parametrize("attention", ["eager", "sink_sdpa"])
def test_tree_forward_with_other_attentions(micro_policy, attention):
    """The tree mask reaches eager attention (as an additive mask) and the sink-aware fused
    attention (as a boolean mask) too: the same log-probs and values as per path."""
    from agentrl_cli.models import attention as A

    A.register()
    model = copy.deepcopy(micro_policy[0]).eval()
    model.set_attn_implementation(A.hf_attention_name(attention))
    lp, v, tlp, tv, real, policy = per_path_and_tree(
        model, random_critic(model, "head"), tree_batch(model.config.vocab_size, seed=3), 1.0)
    assert_rel(tlp[policy], lp[policy])
    assert_rel(tv[real], v[real])


def test_large_micro_batches_run_per_path(micro_policy):
    """The tree mask is dense, so micro-batches over TREE_PACK_MAX_TOKENS run per path."""
    from agentrl_cli.train.learner import TREE_PACK_MAX_TOKENS, packs

    model = micro_policy[0]
    small = config.load(method="focus", sets=MICRO)
    big = config.load(method="focus", sets=MICRO + [
        f"train.max_tokens_per_microbatch={TREE_PACK_MAX_TOKENS * 2}"])
    off = config.load(method="focus", sets=MICRO + ["train.tree_pack=false"])
    learner = build_learner(small, copy.deepcopy(model), log=lambda s: None)
    assert packs(learner, small) == "tree"
    assert packs(learner, big) != "tree" and packs(learner, off) != "tree"

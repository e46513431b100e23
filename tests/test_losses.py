"""Losses against plain-loop references and hand values."""
import math

import pytest
import torch

from agentrl_cli import losses

DT = torch.float64


def _batch(seed, B=4, L=9):
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(B, L, generator=g, dtype=DT) * 3
    logp_new = logp_old + 0.3 * torch.randn(B, L, generator=g, dtype=DT)
    adv = torch.randn(B, L, generator=g, dtype=DT)
    mask = (torch.rand(B, L, generator=g) > 0.3).to(DT)
    mask[0, 0] = 1.0
    return logp_new, logp_old, adv, mask


def ref_aggregate(x, mask, agg):
    B, L = x.shape
    if agg == "token-mean":
        tot, n = 0.0, 0
        for b in range(B):
            for t in range(L):
                if mask[b, t] > 0:
                    tot += float(x[b, t])
                    n += 1
        return tot / max(n, 1)
    rows = []
    for b in range(B):
        vals = [float(x[b, t]) for t in range(L) if mask[b, t] > 0]
        if vals:
            rows.append(sum(vals) / len(vals))
    return sum(rows) / len(rows)


def ref_ppo_per_token(logp_new, logp_old, adv, lo, hi):
    out = torch.zeros_like(adv)
    for b in range(adv.shape[0]):
        for t in range(adv.shape[1]):
            r = math.exp(float(logp_new[b, t] - logp_old[b, t]))
            a = float(adv[b, t])
            out[b, t] = -min(r * a, min(max(r, 1 - lo), 1 + hi) * a)
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean"])
def test_ppo_clip_vs_loop(seed, agg):
    logp_new, logp_old, adv, mask = _batch(seed)
    loss, stats = losses.ppo_clip_loss(logp_new, logp_old, adv, mask, 0.2, 0.28, agg)
    per = ref_ppo_per_token(logp_new, logp_old, adv, 0.2, 0.28)
    assert float(loss) == pytest.approx(ref_aggregate(per, mask, agg), abs=1e-10)
    lr = logp_new - logp_old
    kl = ref_aggregate(torch.exp(lr) - 1 - lr, mask, "token-mean")
    assert float(stats["kl/approx"]) == pytest.approx(kl, abs=1e-10) and float(stats["kl/approx"]) >= 0
    assert float(stats["ratio/mean"]) == pytest.approx(ref_aggregate(torch.exp(lr), mask, "token-mean"))
    assert 0.0 <= float(stats["clipfrac"]) <= 1.0


def test_ppo_clip_asymmetry_and_gradients():
    logp_old = torch.zeros(1, 4, dtype=DT)
    # ratios 1.25 (A>0), 1.25 (A<0), 0.75 (A>0), 0.75 (A<0)
    logp_new = torch.log(torch.tensor([[1.25, 1.25, 0.75, 0.75]], dtype=DT)).requires_grad_()
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]], dtype=DT)
    mask = torch.ones(1, 4, dtype=DT)
    loss, stats = losses.ppo_clip_loss(logp_new, logp_old, adv, mask, eps_low=0.2, eps_high=0.28)
    # per token: -1.25 (inside 1.28), +1.25, -0.75, +0.8 (clipped at 1 - 0.2)
    assert loss.item() == pytest.approx((-1.25 + 1.25 - 0.75 + 0.8) / 4)
    (grad,) = torch.autograd.grad(loss, logp_new)
    assert grad[0, 3] == 0 and grad[0, 0] != 0 and grad[0, 1] != 0 and grad[0, 2] != 0
    assert float(stats["clipfrac"]) == pytest.approx(0.25)
    # symmetric 0.2: the first token is now clipped at 1.2 as well
    loss2, stats2 = losses.ppo_clip_loss(logp_new, logp_old, adv, mask, eps_low=0.2, eps_high=0.2)
    assert loss2.item() == pytest.approx((-1.2 + 1.25 - 0.75 + 0.8) / 4)
    assert float(stats2["clipfrac"]) == pytest.approx(0.5)


def test_token_mean_vs_seq_mean_and_per_sequence_advantages():
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0], [5.0, 0.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]], dtype=DT)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=DT)
    assert float(losses.aggregate(x, mask, "token-mean")) == pytest.approx(9 / 5)
    assert float(losses.aggregate(x, mask, "seq-mean")) == pytest.approx(3.0)  # empty row left out
    with pytest.raises(ValueError):
        losses.aggregate(x, mask, "sum")
    logp_new, logp_old, adv, m = _batch(1)
    seq_adv = adv[:, 0]
    a, _ = losses.ppo_clip_loss(logp_new, logp_old, seq_adv, m)
    b, _ = losses.ppo_clip_loss(logp_new, logp_old, seq_adv[:, None].expand_as(adv), m)
    assert float(a) == pytest.approx(float(b))


def test_gspo_ratio_and_gradient():
    logp_new, logp_old, _, mask = _batch(2)
    logp_new = logp_new.clone().requires_grad_()
    seq_adv = torch.tensor([1.0, -0.5, 2.0, 0.3], dtype=DT)
    # wide clip range so nothing is clipped: gradient per token = -A_i s_i / |y_i| / B
    loss, stats = losses.gspo_loss(logp_new, logp_old, seq_adv, mask, eps_low=10.0, eps_high=10.0)
    (grad,) = torch.autograd.grad(loss, logp_new)
    B = mask.shape[0]
    want_loss = 0.0
    for b in range(B):
        toks = [t for t in range(mask.shape[1]) if mask[b, t] > 0]
        s = math.exp(sum(float(logp_new[b, t].detach() - logp_old[b, t]) for t in toks) / len(toks))
        want_loss += -s * float(seq_adv[b]) / B
        for t in range(mask.shape[1]):
            want = -float(seq_adv[b]) * s / len(toks) / B if t in toks else 0.0
            assert float(grad[b, t]) == pytest.approx(want, abs=1e-12)
    assert loss.item() == pytest.approx(want_loss)
    # default GSPO clip range [1-3e-4, 1+4e-4] clips sequences whose ratio moved more
    _, stats = losses.gspo_loss(logp_new, logp_old, seq_adv, mask)
    assert float(stats["clipfrac"]) > 0


def test_turn_ratio_forward_and_gradient():
    g = torch.Generator().manual_seed(0)
    N = 12
    logp_old = -torch.rand(N, generator=g, dtype=DT)
    logp_new = (logp_old + 0.1 * torch.randn(N, generator=g, dtype=DT)).requires_grad_()
    turn_id = torch.tensor([7, 7, 7, -1, 2, 2, 7, -1, 40, 2, 40, 40])  # not contiguous
    rho = losses.turn_ratio(logp_new, logp_old, turn_id)
    lr = (logp_new - logp_old).detach()
    for i in range(N):
        tid = int(turn_id[i])
        if tid < 0:
            want = 1.0
        else:
            want = math.exp(sum(float(lr[j]) for j in range(N) if int(turn_id[j]) == tid))
        assert rho[i].item() == pytest.approx(want, rel=1e-12)
        (grad,) = torch.autograd.grad(rho[i], logp_new, retain_graph=True)
        expect = torch.zeros(N, dtype=DT)
        if tid >= 0:
            expect[i] = want  # d rho~_i / d logp_new_i = rho_t; nothing flows to other tokens
        assert torch.allclose(grad, expect, rtol=1e-12, atol=0)


def test_turn_ratio_long_turn_is_finite():
    g = torch.Generator().manual_seed(0)
    N = 4000
    logp_old = -5 * torch.rand(N, generator=g)  # float32, as in training
    noise = 1e-3 * torch.randn(N, generator=g)
    logp_new = (logp_old + noise).requires_grad_()
    rho = losses.turn_ratio(logp_new, logp_old, torch.zeros(N, dtype=torch.long))
    want = math.exp(float((logp_new.detach().double() - logp_old.double()).sum()))
    assert torch.isfinite(rho).all()
    assert torch.allclose(rho.double(), torch.full((N,), want, dtype=DT), rtol=1e-4)
    rho.sum().backward()
    assert torch.isfinite(logp_new.grad).all()
    # a turn whose log ratio sum is huge stays finite (clamped), with a finite gradient
    big = losses.turn_ratio(torch.full((N,), 0.1), torch.zeros(N), torch.zeros(N, dtype=torch.long))
    assert torch.isfinite(big).all()


def test_turn_ratio_loss_matches_flat_reference():
    logp_new, logp_old, adv, mask = _batch(3, B=3, L=10)
    turn_index = torch.tensor([[0, 0, 0, -1, 1, 1, 1, -1, 2, 2],
                               [0, 0, -1, -1, 1, 1, 1, 1, -1, -1],
                               [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]])
    mask = mask * (turn_index >= 0)
    loss, stats = losses.turn_ratio_loss(logp_new, logp_old, adv, turn_index, mask, 0.2, 0.2, "token-mean")
    per = torch.zeros_like(adv)
    for b in range(3):
        for t in range(10):
            if mask[b, t] == 0:
                continue
            same = [j for j in range(10) if mask[b, j] > 0 and turn_index[b, j] == turn_index[b, t]]
            r = math.exp(sum(float(logp_new[b, j] - logp_old[b, j]) for j in same))
            a = float(adv[b, t])
            per[b, t] = -min(r * a, min(max(r, 0.8), 1.2) * a)
    assert float(loss) == pytest.approx(ref_aggregate(per, mask, "token-mean"), abs=1e-10)
    # one-token turns reduce to the token-level PPO loss
    one_tok = torch.arange(10).expand(3, 10)
    l1, _ = losses.turn_ratio_loss(logp_new, logp_old, adv, one_tok, mask)
    l2, _ = losses.ppo_clip_loss(logp_new, logp_old, adv, mask)
    assert float(l1) == pytest.approx(float(l2), abs=1e-12)


def test_value_loss_and_clipping():
    values = torch.tensor([[0.5, 1.0, 0.0]], dtype=DT)
    old = torch.tensor([[0.0, 0.9, 0.0]], dtype=DT)
    returns = torch.tensor([[1.0, 1.0, 7.0]], dtype=DT)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=DT)
    loss, _ = losses.value_loss(values, returns, mask)
    assert float(loss) == pytest.approx(0.5 * (0.25 + 0.0) / 2)
    # clip 0.2: token 0 clipped value 0.2 -> (0.8)^2 = 0.64 > 0.25 ; token 1: 1.0 vs 1.0 -> 0
    loss_c, stats = losses.value_loss(values, returns, mask, old_values=old, clip=0.2)
    assert float(loss_c) == pytest.approx(0.5 * (0.64 + 0.0) / 2)
    assert float(stats["critic/clipfrac"]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        losses.value_loss(values, returns, mask, clip=0.2)


def test_kl_k3_nonnegative():
    logp_new, logp_old, _, mask = _batch(5)
    kl = losses.kl_k3(logp_new, logp_old, mask)
    assert (kl >= 0).all()
    assert torch.all(kl[mask == 0] == 0)
    assert torch.all(losses.kl_k3(logp_new, logp_new, mask) == 0)
    d = float(logp_old[0, 0] - logp_new[0, 0])
    assert float(kl[0, 0]) == pytest.approx(math.exp(d) - d - 1)


def test_token_sum_norm_is_trls_dr_grpo_loss():
    """`token-sum-norm` = masked sum / (rows x norm), TRL's loss_type="dr_grpo" with norm =
    max_completion_length; empty rows still count as rows (TRL divides by size(0))."""
    g = torch.Generator().manual_seed(3)
    per_token = torch.randn(5, 9, generator=g)
    mask = (torch.rand(5, 9, generator=g) < 0.6).float()
    mask[2] = 0.0
    trl = (per_token * mask).sum() / (per_token.size(0) * 32)
    torch.testing.assert_close(losses.aggregate(per_token, mask, "token-sum-norm", norm=32), trl)
    # unlike token-mean it does not depend on how many tokens the batch has
    longer = torch.cat([mask, torch.ones(5, 4)], 1), torch.cat([per_token, torch.zeros(5, 4)], 1)
    torch.testing.assert_close(losses.aggregate(longer[1], longer[0], "token-sum-norm", norm=32), trl)
    with pytest.raises(ValueError):
        losses.aggregate(per_token, mask, "token-sum-norm")


def test_token_sum_norm_micro_batches_give_the_one_batch_gradient():
    """Rows split into micro-batches, each loss weighted by its share of rows (what the trainer
    does for per-row aggregations), give the gradient of the whole batch."""
    g = torch.Generator().manual_seed(5)
    B, L = 6, 11
    logp_old = -torch.rand(B, L, generator=g)
    adv = torch.randn(B, L, generator=g)
    mask = (torch.rand(B, L, generator=g) < 0.7).float()
    base = logp_old + 0.1 * torch.randn(B, L, generator=g)
    whole = base.clone().requires_grad_(True)
    loss, _ = losses.ppo_clip_loss(whole, logp_old, adv, mask, agg="token-sum-norm", norm=24)
    loss.backward()
    split = base.clone().requires_grad_(True)
    total = 0.0
    for rows in ([0, 1], [2, 3, 4], [5]):
        part, _ = losses.ppo_clip_loss(split[rows], logp_old[rows], adv[rows], mask[rows],
                                       agg="token-sum-norm", norm=24)
        total = total + part * len(rows) / B
    total.backward()
    torch.testing.assert_close(total, loss)
    torch.testing.assert_close(split.grad, whole.grad)
    assert float(whole.grad.abs().sum()) > 0


def test_dr_grpo_recipe_divides_by_the_runs_generation_cap():
    from agentrl_cli import config

    cfg = config.load(method="dr_grpo")
    assert cfg.algo.agg == "token-sum-norm" and cfg.algo.agg_norm == 0
    assert cfg.agg_norm == min(cfg.env.max_turns * cfg.rollout.max_new_tokens, cfg.rollout.max_tokens)
    cfg = config.load(method="dr_grpo", sets=["env.max_turns=3", "rollout.max_new_tokens=8"])
    assert cfg.agg_norm == 24
    assert config.load(method="dr_grpo", sets=["algo.agg_norm=100"]).agg_norm == 100

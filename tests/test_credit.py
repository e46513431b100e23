"""Credit estimators against plain-Python loop references written independently here, plus
hand-computed values and edge cases. float64 throughout so agreement is checked at 1e-6."""
import math
import random

import pytest
import torch

from agentrl_cli import credit

DT = torch.float64


# ----------------------------------------------------------------------------- plain references


def ref_grpo(rewards, std=True, eps=1e-6):
    G = len(rewards)
    if G == 1:
        return [0.0]
    mean = sum(rewards) / G
    sd = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (G - 1))
    return [(r - mean) / (sd + eps) if std else r - mean for r in rewards]


def ref_rloo(rewards):
    G = len(rewards)
    if G == 1:
        return [0.0]
    return [r - sum(rewards[j] for j in range(G) if j != i) / (G - 1) for i, r in enumerate(rewards)]


def ref_gae(rewards, values, gamma, lam):
    T = len(rewards)
    adv = [0.0] * T
    for t in range(T):  # forward definition: A_t = sum_l (gamma lam)^l delta_{t+l}
        total = 0.0
        for l in range(T - t):
            u = t + l
            nv = values[u + 1] if u + 1 < T else 0.0
            total += (gamma * lam) ** l * (rewards[u] + gamma * nv - values[u])
        adv[t] = total
    return adv, [a + v for a, v in zip(adv, values)]


def ref_mpo(values, R, lam, lam_intra, beta):
    """values: list of lists. Uses the flat token sequence with explicit turn boundaries."""
    T = len(values)
    first = [v[0] for v in values]
    turn_delta = [(R if t == T - 1 else 0.0) + (first[t + 1] if t + 1 < T else 0.0) - first[t]
                  for t in range(T)]
    turn_adv = [sum(lam ** l * turn_delta[t + l] for l in range(T - t)) for t in range(T)]
    out = []
    for t in range(T):
        n = len(values[t])
        nxt_first = first[t + 1] if t + 1 < T else 0.0
        d = []
        for i in range(n):
            if i < n - 1:
                d.append(values[t][i + 1] - values[t][i])
            else:
                d.append((R if t == T - 1 else 0.0) + nxt_first - values[t][i])
        intra = [sum(lam_intra ** (j - i) * d[j] for j in range(i, n)) for i in range(n)]
        mean_intra = sum(intra) / n
        out.append([turn_adv[t] + beta * (a - mean_intra) for a in intra])
    return out


def ref_trace(l, A_out, eps, K, g, lam_term):
    T = len(l) - 1
    d = [-x + eps for x in l]
    delta = [math.log(d[k] / d[k + 1]) for k in range(T)]
    r = []
    for k in range(T):
        h = min(k + K - 1, T - 1)
        num = sum(g ** (u - k) * delta[u] for u in range(k, h + 1))
        den = sum(g ** (u - k) for u in range(k, h + 1))
        r.append(num / den + (lam_term * g ** (T - k) * A_out if h == T - 1 else 0.0))
    return r


def ref_segment_td(V, R, gamma, lam):
    K = len(V)
    delta = [(R if k == K - 1 else gamma * V[k + 1]) - V[k] for k in range(K)]
    return [sum((gamma * lam) ** l * delta[k + l] for l in range(K - k)) for k in range(K)]


def close(a, b, tol=1e-6):
    a = a.tolist() if isinstance(a, torch.Tensor) else a
    return len(a) == len(b) and all(abs(x - y) <= tol * (1 + abs(y)) for x, y in zip(a, b))


# ----------------------------------------------------------------------------- outcome


@pytest.mark.parametrize("seed", range(5))
def test_grpo_and_rloo_vs_reference(seed):
    rng = random.Random(seed)
    G = rng.randint(2, 9)
    rewards = [float(rng.randint(0, 1)) if seed % 2 else rng.gauss(0, 1) for _ in range(G)]
    r = torch.tensor(rewards, dtype=DT)
    assert close(credit.grpo_advantages(r), ref_grpo(rewards))
    assert close(credit.grpo_advantages(r, std=False), ref_grpo(rewards, std=False))
    assert close(credit.rloo_advantages(r), ref_rloo(rewards))


def test_outcome_edge_cases():
    one = torch.tensor([1.0], dtype=DT)
    assert credit.grpo_advantages(one).tolist() == [0.0]
    assert credit.grpo_advantages(one, std=False).tolist() == [0.0]
    assert credit.rloo_advantages(one).tolist() == [0.0]
    for dt in (DT, torch.float32):  # all-equal rewards: exactly 0, no eps-amplified rounding noise
        same = torch.full((6,), 0.7, dtype=dt)
        assert torch.all(credit.grpo_advantages(same) == 0)
        assert torch.all(credit.rloo_advantages(same) == 0)
    # sample std (n - 1): rewards [0, 1] -> std = sqrt(0.5)
    a = credit.grpo_advantages(torch.tensor([0.0, 1.0], dtype=DT), eps=0.0)
    assert a.tolist() == pytest.approx([-0.5 / math.sqrt(0.5), 0.5 / math.sqrt(0.5)])


# ----------------------------------------------------------------------------- gae / segment TD


@pytest.mark.parametrize("seed", range(5))
def test_gae_vs_reference(seed):
    rng = random.Random(seed)
    T = rng.randint(1, 12)
    rewards = [rng.gauss(0, 1) for _ in range(T)]
    values = [rng.gauss(0, 1) for _ in range(T)]
    gamma, lam = rng.uniform(0.5, 1.0), rng.uniform(0.0, 1.0)
    adv, ret = credit.gae(torch.tensor(rewards, dtype=DT), torch.tensor(values, dtype=DT), gamma, lam)
    want_adv, want_ret = ref_gae(rewards, values, gamma, lam)
    assert close(adv, want_adv) and close(ret, want_ret)


def test_gae_single_step_and_lambda_one():
    adv, ret = credit.gae(torch.tensor([1.0], dtype=DT), torch.tensor([0.3], dtype=DT), 1.0, 0.95)
    assert adv.tolist() == pytest.approx([0.7]) and ret.tolist() == pytest.approx([1.0])
    # lam = 1, gamma = 1: return = sum of remaining rewards (Monte Carlo)
    r = torch.tensor([0.0, 0.0, 1.0], dtype=DT)
    _, ret = credit.gae(r, torch.tensor([0.2, 0.5, 0.9], dtype=DT), 1.0, 1.0)
    assert ret.tolist() == pytest.approx([1.0, 1.0, 1.0])


@pytest.mark.parametrize("seed", range(4))
def test_segment_td_vs_reference_and_telescoping(seed):
    rng = random.Random(seed)
    K = rng.randint(1, 8)
    V = [rng.random() for _ in range(K)]
    R = float(rng.randint(0, 1))
    gamma, lam = rng.uniform(0.7, 1.0), rng.random()
    assert close(credit.segment_td_advantages(V, R, gamma, lam), ref_segment_td(V, R, gamma, lam))
    # TD(0) with V~ = V telescopes: sum_k gamma^k A_k = gamma^(K-1) R - V_0
    a0 = credit.segment_td_advantages(V, R, gamma, 0.0)
    assert sum(gamma ** k * a for k, a in enumerate(a0)) == pytest.approx(gamma ** (K - 1) * R - V[0])
    a1 = credit.segment_td_advantages(V, R, 1.0, 0.0)
    assert sum(a1) == pytest.approx(R - V[0])
    # lam = 1, gamma = 1: every segment gets the Monte-Carlo advantage R - V_k
    assert credit.segment_td_advantages(V, R, 1.0, 1.0) == pytest.approx([R - v for v in V])


# ----------------------------------------------------------------------------- MPO


def _rand_turns(rng, T, one_token=False):
    return [[rng.random() for _ in range(1 if one_token else rng.randint(1, 7))] for _ in range(T)]


@pytest.mark.parametrize("seed", range(6))
def test_mpo_vs_reference(seed):
    rng = random.Random(seed)
    vals = _rand_turns(rng, rng.randint(1, 6))
    R = float(rng.randint(0, 1))
    lam, lam_intra, beta = rng.random(), rng.random(), rng.uniform(0, 2)
    got = credit.mpo_advantages([torch.tensor(v, dtype=DT) for v in vals], R, lam, lam_intra, beta)
    want = ref_mpo(vals, R, lam, lam_intra, beta)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert close(g, w)


def test_mpo_invariants():
    rng = random.Random(0)
    vals = _rand_turns(rng, 4)
    R = 1.0
    adv = credit.mpo_advantages([torch.tensor(v, dtype=DT) for v in vals], R, 0.8, 0.95, 1.0)
    turn_only = credit.mpo_advantages([torch.tensor(v, dtype=DT) for v in vals], R, 0.8, 0.95, 0.0)
    for a, b in zip(adv, turn_only):
        assert float(a.mean()) == pytest.approx(float(b[0]))  # beta keeps the turn mean
        assert torch.allclose(b, b[0].expand_as(b))
    # one turn: A^turn = R - V_1
    one = credit.mpo_advantages([torch.tensor([0.25, 0.5, 0.75], dtype=DT)], 1.0, 0.8, 0.95, 0.0)
    assert one[0].tolist() == pytest.approx([0.75] * 3)
    # one-token turns: the intra term vanishes, A_t = A^turn_t
    vals1 = _rand_turns(rng, 5, one_token=True)
    got = credit.mpo_advantages([torch.tensor(v, dtype=DT) for v in vals1], R, 0.8, 0.95, 1.0)
    want = ref_mpo(vals1, R, 0.8, 0.95, 0.0)
    assert close(torch.cat(got), [w[0] for w in want])
    with pytest.raises(ValueError):
        credit.mpo_advantages([torch.tensor([], dtype=DT)], 1.0, 0.8, 0.95, 1.0)


# ----------------------------------------------------------------------------- TRACE


@pytest.mark.parametrize("seed", range(6))
def test_trace_vs_reference(seed):
    rng = random.Random(seed)
    T = rng.randint(1, 9)
    l = [-rng.uniform(0.0, 4.0) for _ in range(T + 1)]
    A = rng.gauss(0, 1)
    K = rng.randint(1, 5)
    got = credit.trace_turn_rewards(torch.tensor(l, dtype=DT), A, 0.1, K, 0.8, 2.0)
    assert close(got, ref_trace(l, A, 0.1, K, 0.8, 2.0))


def test_trace_hand_values():
    # T = 1: r_0 = log(d_0/d_1) + lambda_term * gamma * A
    l = [-1.9, -0.9]
    r = credit.trace_turn_rewards(torch.tensor(l, dtype=DT), 0.5, 0.1, 3, 0.8, 2.0)
    assert r.tolist() == pytest.approx([math.log(2.0 / 1.0) + 2.0 * 0.8 * 0.5])
    # no tool-call turns
    assert credit.trace_turn_rewards(torch.tensor([-1.0], dtype=DT), 1.0).numel() == 0
    # K = 1: c_k = delta_k, only the last turn gets the terminal term
    l = [-2.9, -1.9, -0.9]
    r = credit.trace_turn_rewards(torch.tensor(l, dtype=DT), 1.0, 0.1, 1, 0.5, 2.0)
    assert r.tolist() == pytest.approx([math.log(3 / 2), math.log(2) + 2 * 0.5])


# ----------------------------------------------------------------------------- FOCUS


def test_focus_gain_hand_values():
    for v in (0.0, 0.3, 0.5, 0.9):
        for c in (0.0, 1.0):
            assert credit.focus_gain(v, 1, c) == pytest.approx(5 * (v - c) ** 2 / 36)
    # in flight: n_eff = 2 -> MSE_2 - MSE_3 = 0.49/9 - 0.49/16
    assert credit.focus_gain(0.3, 1, 1.0, n_inflight=1) == pytest.approx(0.49 / 9 - 0.49 / 16)
    # non-binary cbar, v == cbar: only the sampling variance term
    assert credit.focus_gain(0.5, 2, 0.5) == pytest.approx(0.5 / 9 - 0.75 / 16)
    # kappa = 2, n = 1, cbar = 0, v = 0.5: (4*0.25)/9 - (4*0.25)/16
    assert credit.focus_gain(0.5, 1, 0.0, kappa=2.0) == pytest.approx(1 / 9 - 1 / 16)
    # bayes: m = (0.3 + 1)/2 = 0.65
    assert credit.focus_gain(0.3, 1, 1.0, kind="bayes") == pytest.approx(0.65 * 0.35 / 9)
    assert credit.focus_gain(0.3, 1, 1.0, n_inflight=1, kind="bayes") == pytest.approx(0.65 * 0.35 / 16)
    assert credit.focus_gain(0.7, 1, 0.7) < credit.focus_gain(0.1, 1, 1.0)  # grows with critic error
    with pytest.raises(ValueError):
        credit.focus_gain(0.3, 1, 1.0, kind="nope")


TREE_PARENT = [-1, 0, 0, 1, 1, 4, 0]
TREE_LEAF = [None, None, 1.0, 1.0, None, 0.0, None]
TREE_CRITIC = [0.5, 0.4, 0.0, 0.0, 0.2, 0.0, 0.7]


def test_refine_values_hand_tree():
    g, v = credit.refine_values(TREE_PARENT, TREE_LEAF, TREE_CRITIC)
    assert g[2] is None and g[3] is None and g[5] is None and g[6] is None
    assert g[4] == pytest.approx(0.0) and v[4] == pytest.approx(0.1)
    assert g[1] == pytest.approx(0.55) and v[1] == pytest.approx(0.5)
    assert v[6] == pytest.approx(0.7)  # internal node without children: the critic value
    assert g[0] == pytest.approx(2.2 / 3) and v[0] == pytest.approx(0.675)
    assert v[2] == 1.0 and v[3] == 1.0 and v[5] == 0.0


def test_refine_values_kappa2_gamma09():
    g, v = credit.refine_values(TREE_PARENT, TREE_LEAF, TREE_CRITIC, kappa=2.0, gamma=0.9)
    assert g[4] == pytest.approx(0.0) and v[4] == pytest.approx(0.4 / 3)
    assert g[1] == pytest.approx(0.56) and v[1] == pytest.approx(0.48)
    assert g[0] == pytest.approx(2.062 / 3) and v[0] == pytest.approx(3.062 / 5)


def test_refine_values_chain_and_errors():
    # no branching: each node has one child, V~ = (kappa V + target) / (kappa + 1)
    g, v = credit.refine_values([-1, 0, 1], [None, None, 1.0], [0.2, 0.6, 0.0])
    assert v[1] == pytest.approx(0.8) and v[0] == pytest.approx(0.5)
    with pytest.raises(ValueError):
        credit.refine_values([-1, 2, 1], [None, None, 1.0], [0.0] * 3)  # cycle
    with pytest.raises(ValueError):
        credit.refine_values([0, 0], [None, 1.0], [0.0] * 2)  # no root
    with pytest.raises(ValueError):
        credit.refine_values([-1, 0], [1.0, 1.0], [0.0] * 2)  # leaf with a child


# ----------------------------------------------------------------------------- batched vs unbatched


def make_batch(seed, B=7, max_turns=5, one_token=False, min_turns=1):
    """Random right-padded batch; returns tensors and per-episode lists of token positions."""
    rng = random.Random(seed)
    episodes = []  # list of list-of-lists of positions per turn
    rows = []
    for _ in range(B):
        T = rng.randint(min_turns, max_turns)
        mask, turn, turns = [0.0] * rng.randint(1, 3), [-1] * 0, []
        turn = [-1] * len(mask)
        for t in range(T):
            n = 1 if one_token else rng.randint(1, 6)
            turns.append(list(range(len(mask), len(mask) + n)))
            mask += [1.0] * n
            turn += [t] * n
            env = rng.randint(0, 3)
            mask += [0.0] * env
            turn += [-1] * env
        rows.append((mask, turn))
        episodes.append(turns)
    L = max(len(m) for m, _ in rows) + rng.randint(0, 3)
    mask = torch.zeros(B, L, dtype=DT)
    turn_index = torch.full((B, L), -1, dtype=torch.long)
    for b, (m, t) in enumerate(rows):
        mask[b, :len(m)] = torch.tensor(m, dtype=DT)
        turn_index[b, :len(t)] = torch.tensor(t)
    g = torch.Generator().manual_seed(seed)
    values = torch.rand(B, L, generator=g, dtype=DT)
    rewards = torch.randint(0, 2, (B,), generator=g).to(DT)
    group_index = torch.tensor([rng.choice([3, 8, 1]) for _ in range(B)])
    return dict(mask=mask, turn_index=turn_index, values=values, rewards=rewards,
                group_index=group_index, episodes=episodes)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("std", [True, False])
def test_batched_grpo_rloo(seed, std):
    d = make_batch(seed)
    adv = credit.grpo_token_advantages(d["rewards"], d["group_index"], d["mask"], std=std)
    rloo = credit.rloo_token_advantages(d["rewards"], d["group_index"], d["mask"])
    want = torch.zeros(len(d["rewards"]), dtype=DT)
    want_rloo = torch.zeros_like(want)
    for gid in d["group_index"].unique():
        sel = d["group_index"] == gid
        want[sel] = credit.grpo_advantages(d["rewards"][sel], std=std)
        want_rloo[sel] = torch.tensor(ref_rloo(d["rewards"][sel].tolist()), dtype=DT)
    assert torch.allclose(adv, want[:, None] * d["mask"], atol=1e-6)
    assert torch.allclose(rloo, want_rloo[:, None] * d["mask"], atol=1e-6)


def test_batched_group_of_one_and_equal_rewards():
    mask = torch.ones(3, 4, dtype=DT)
    adv = credit.grpo_token_advantages(torch.tensor([1.0, 0.0, 0.0], dtype=DT),
                                       torch.tensor([0, 1, 1]), mask)
    assert torch.all(adv == 0)
    assert torch.all(credit.rloo_token_advantages(torch.tensor([1.0, 0.0, 5.0], dtype=DT),
                                                  torch.tensor([0, 1, 2]), mask) == 0)
    r = torch.full((3,), 0.7)
    mask = torch.ones(3, 4)
    assert torch.all(credit.grpo_token_advantages(r, torch.tensor([5, 5, 5]), mask) == 0)
    assert torch.all(credit.rloo_token_advantages(r, torch.tensor([5, 5, 5]), mask) == 0)


@pytest.mark.parametrize("seed", range(5))
def test_batched_gae(seed):
    d = make_batch(seed, one_token=seed == 4)
    gamma, lam = [(1.0, 0.95), (0.9, 0.5), (1.0, 1.0), (0.99, 0.0), (1.0, 0.95)][seed]
    adv, ret = credit.gae_token_advantages(d["rewards"], d["values"], d["mask"], gamma, lam)
    for b in range(len(d["rewards"])):
        pos = d["mask"][b].nonzero().squeeze(1)
        v = d["values"][b, pos].tolist()
        r = [0.0] * len(v)
        r[-1] = float(d["rewards"][b])
        want_adv, want_ret = ref_gae(r, v, gamma, lam)
        assert close(adv[b, pos], want_adv) and close(ret[b, pos], want_ret)
    assert torch.all(adv[d["mask"] == 0] == 0) and torch.all(ret[d["mask"] == 0] == 0)


@pytest.mark.parametrize("seed", range(5))
def test_batched_mpo(seed):
    d = make_batch(seed, one_token=seed == 3, max_turns=1 if seed == 4 else 5)
    lam, lam_intra, beta = 0.8, 0.95, [1.0, 0.5, 0.0, 1.5, 1.0][seed]
    adv = credit.mpo_token_advantages(d["values"], d["rewards"], d["turn_index"], d["mask"],
                                      lam, lam_intra, beta)
    for b, turns in enumerate(d["episodes"]):
        vals = [d["values"][b, p] for p in turns]
        want = credit.mpo_advantages(vals, float(d["rewards"][b]), lam, lam_intra, beta)
        want_ref = ref_mpo([v.tolist() for v in vals], float(d["rewards"][b]), lam, lam_intra, beta)
        for p, w, wr in zip(turns, want, want_ref):
            assert torch.allclose(adv[b, p], w, atol=1e-6)
            assert close(adv[b, p], wr)
    assert torch.all(adv[d["mask"] == 0] == 0)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("answer_turn", [True, False])
def test_batched_trace(seed, answer_turn):
    d = make_batch(seed, max_turns=6, min_turns=1)  # answer_turn with one turn: T_b = 0
    rng = random.Random(100 + seed)
    B = len(d["episodes"])
    num_turns = torch.tensor([len(t) for t in d["episodes"]])
    T = num_turns - 1 if answer_turn else num_turns
    M = int(T.max()) + 1 + 2  # extra padding columns
    ml = torch.full((B, M), float("nan"), dtype=DT)  # padding must be ignored
    for b in range(B):
        ml[b, :int(T[b]) + 1] = torch.tensor([-rng.uniform(0, 3) for _ in range(int(T[b]) + 1)], dtype=DT)
    A_out = credit.grpo_episode_advantages(d["rewards"], d["group_index"])
    K = [3, 1, 2, 5, 3, 3][seed]
    kw = dict(eps=0.1, K=K, gamma_td=0.8, lambda_term=2.0, alpha_out=1.0, alpha_turn=0.2)
    adv = credit.trace_token_advantages(ml, num_turns, A_out, d["turn_index"], d["mask"],
                                        final_turn_is_answer=answer_turn, **kw)
    for b, turns in enumerate(d["episodes"]):
        Tb = int(T[b])
        l = ml[b, :Tb + 1]
        r = credit.trace_turn_rewards(l, float(A_out[b]), 0.1, K, 0.8, 2.0)
        r_ref = ref_trace(l.tolist(), float(A_out[b]), 0.1, K, 0.8, 2.0)
        assert close(r, r_ref)
        for t, p in enumerate(turns):
            turn_r = r_ref[t] if t < Tb else 0.0
            want = 1.0 * float(A_out[b]) + 0.2 * turn_r
            assert torch.allclose(adv[b, p], torch.full((len(p),), want, dtype=DT), atol=1e-6)
    assert torch.all(adv[d["mask"] == 0] == 0)
    assert not torch.isnan(adv).any()


def test_broadcast_and_whiten():
    d = make_batch(0)
    per_turn = torch.randn(len(d["episodes"]), 5, dtype=DT)
    out = credit.broadcast_turn_values(per_turn, d["turn_index"], d["mask"])
    for b, turns in enumerate(d["episodes"]):
        for t, p in enumerate(turns):
            assert torch.all(out[b, p] == per_turn[b, t])
    assert torch.all(out[d["mask"] == 0] == 0)
    with pytest.raises(ValueError):
        credit.broadcast_turn_values(per_turn[:, :1], d["turn_index"], d["mask"])

    x = torch.randn(4, 6, dtype=DT)
    m = (torch.rand(4, 6) > 0.3).to(DT)
    vals = x[m > 0].tolist()
    mean = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
    w = credit.masked_whiten(x, m)
    assert torch.allclose(w[m > 0], (x[m > 0] - mean) / sd, atol=1e-6)
    assert torch.all(w[m == 0] == 0)
    w2 = credit.masked_whiten(x, m, shift_mean=False)
    assert torch.allclose(w2[m > 0], (x[m > 0] - mean) / sd + mean, atol=1e-6)


def test_batched_float32_default():
    d = make_batch(1)
    adv, _ = credit.gae_token_advantages(d["rewards"].float(), d["values"].float(), d["mask"].float())
    assert adv.dtype == torch.float32
    ref, _ = credit.gae_token_advantages(d["rewards"], d["values"], d["mask"])
    assert torch.allclose(adv.double(), ref, atol=1e-5)


def test_batched_row_without_policy_tokens():
    d = make_batch(2)
    d["mask"][1] = 0.0
    d["turn_index"][1] = -1
    adv, ret = credit.gae_token_advantages(d["rewards"], d["values"], d["mask"])
    mpo = credit.mpo_token_advantages(d["values"], d["rewards"], d["turn_index"], d["mask"])
    assert torch.all(adv[1] == 0) and torch.all(ret[1] == 0) and torch.all(mpo[1] == 0)
    pos = d["mask"][0].nonzero().squeeze(1)
    r = [0.0] * len(pos)
    r[-1] = float(d["rewards"][0])
    assert close(adv[0, pos], ref_gae(r, d["values"][0, pos].tolist(), 1.0, 0.95)[0])
    empty = torch.zeros_like(d["mask"])
    assert torch.all(credit.gae_token_advantages(d["rewards"], d["values"], empty)[0] == 0)
    assert torch.all(credit.mpo_token_advantages(d["values"], d["rewards"], d["turn_index"], empty) == 0)


@pytest.mark.parametrize("W", [1, 63, 64, 65, 300])
def test_blocked_suffix_sum_matches_sequential_loop(W):
    """The blocked scan behind every batched recursion equals the plain right-to-left loop, for
    decays 0, 0.5, 0.9 and 1, with and without restarts, at lengths around the chunk size."""
    from agentrl_cli.credit.batched import _discounted_suffix_sum

    g = torch.Generator().manual_seed(W)
    B = 5
    delta = torch.randn(B, W, generator=g, dtype=torch.float64)
    restart = torch.rand(B, W, generator=g) < 0.2
    for dec in (0.9, 1.0, 0.0, 0.5):
        for rs in (None, restart):
            ref = torch.zeros(B, W, dtype=torch.float64)
            for b in range(B):
                acc = 0.0
                for j in reversed(range(W)):
                    carry = 0.0 if rs is not None and bool(rs[b, j]) else dec * acc
                    acc = delta[b, j].item() + carry
                    ref[b, j] = acc
            got = _discounted_suffix_sum(delta, dec, rs)
            assert got.shape == (B, W)
            assert torch.allclose(got, ref, atol=1e-10, rtol=1e-10)


def test_batched_long_rows_full_rows_and_stray_turn_ids():
    """Rows longer than several scan blocks (a three-level blocked scan), a row where every
    position is a policy token (no environment or padding position to spare), and turn ids on
    tokens outside the mask: gae, mpo and trace still equal the unbatched definitions."""
    g = torch.Generator().manual_seed(7)
    L = 1500
    mask = torch.zeros(3, L, dtype=DT)
    turn_index = torch.full((3, L), -1, dtype=torch.long)
    mask[0] = 1.0                                   # one turn filling the whole row
    turn_index[0] = 0
    bounds = [(0, 400), (430, 900), (905, 1490)]    # three turns with gaps between them
    for t, (a, b) in enumerate(bounds):
        mask[1, a:b] = 1.0
        turn_index[1, a:b] = t
    turn_index[1, 900:905] = 1                      # stray turn id on non-policy tokens
    mask[2, 10:12] = 1.0
    turn_index[2, 10:12] = 0
    values = torch.rand(3, L, generator=g, dtype=DT)
    rewards = torch.tensor([1.0, 0.0, 1.0], dtype=DT)
    adv, ret = credit.gae_token_advantages(rewards, values, mask, 0.99, 0.95)
    mpo = credit.mpo_token_advantages(values, rewards, turn_index, mask, 0.8, 0.95, 1.0)
    for b in range(3):
        pos = mask[b].nonzero().squeeze(1)
        r = torch.zeros(len(pos), dtype=DT)
        r[-1] = rewards[b]
        want_adv, want_ret = credit.gae(r, values[b, pos], 0.99, 0.95)
        assert torch.allclose(adv[b, pos], want_adv, atol=1e-8)
        assert torch.allclose(ret[b, pos], want_ret, atol=1e-8)
        turns = [((turn_index[b] == t) & (mask[b] > 0)).nonzero().squeeze(1)
                 for t in range(int(turn_index[b].max()) + 1)]
        want = credit.mpo_advantages([values[b, p] for p in turns], float(rewards[b]), 0.8, 0.95, 1.0)
        for p, w in zip(turns, want):
            assert torch.allclose(mpo[b, p], w, atol=1e-8)
    assert torch.all(adv[mask == 0] == 0) and torch.all(mpo[mask == 0] == 0)

    ml = -torch.rand(3, 4, generator=g, dtype=DT)
    num_turns = torch.tensor([1, 3, 1])
    A_out = torch.tensor([0.5, -1.0, 2.0], dtype=DT)
    tr = credit.trace_token_advantages(ml, num_turns, A_out, turn_index, mask,
                                       final_turn_is_answer=False)
    for b in range(3):
        r = credit.trace_turn_rewards(ml[b, :int(num_turns[b]) + 1], float(A_out[b]))
        for t in range(int(num_turns[b])):
            p = ((turn_index[b] == t) & (mask[b] > 0)).nonzero().squeeze(1)
            assert torch.allclose(tr[b, p], A_out[b] + 0.2 * r[t], atol=1e-10)
    assert torch.all(tr[mask == 0] == 0)

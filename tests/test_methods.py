"""Every method: estimator entries against plain-loop references on hand-built batches, the DAPO
knobs (overlong shaping, dynamic sampling, budget waves), recipe fields, and a 2-step MICRO
`train(...)` run per recipe."""
from __future__ import annotations

import json
import math
import random

import pytest
import torch

from conftest import MICRO
from agentrl_cli import config
from agentrl_cli.errors import ConfigError
from agentrl_cli.config import AlgoConfig
from agentrl_cli.credit.estimators import ESTIMATORS, SegmentValues, TraceReference
from agentrl_cli.envs.base import StepResult, Task
from agentrl_cli.methods import METHODS
from agentrl_cli.rollout.controllers import (CONTROLLERS, RolloutContext, overlong_penalty,
                                             shape_rewards)
from agentrl_cli.context.episode import append_observation, append_turn, new_episode
from agentrl_cli.train.batch import collate
from agentrl_cli.train.prepare import PREPARERS
from agentrl_cli.train.policy_losses import POLICY_LOSSES



# ----------------------------------------------------------------------------- hand-built batches


def make_episode(rng: random.Random, group: int, reward: float, n_turns: int, final_obs: bool = False):
    """A real Episode built with the runner's bookkeeping: prompt, turns, observations."""
    task = Task(f"t{group}", "q", "gold")
    ep = new_episode(task, group, [1] * rng.randint(2, 4))
    for k in range(n_turns):
        n = rng.randint(1, 4)
        turn = append_turn(ep, [5 + k] * n, [-0.5] * n, "act")
        if k < n_turns - 1 or final_obs:
            m = rng.randint(1, 3)
            append_observation(ep, turn, [2] * m, "obs")
    ep.reward = reward
    return ep


def hand_batch(seed: int = 0, values: bool = True):
    rng = random.Random(seed)
    eps = []
    for g in range(3):
        for _ in range(3):
            eps.append(make_episode(rng, g, float(rng.random() < 0.5) + 0.25 * g, rng.randint(1, 4)))
    eps[-1].reward = eps[-2].reward = eps[-3].reward  # one group with equal rewards
    batch = collate(eps, pad_id=0)
    if values:
        batch.old_values = torch.rand(batch.input_ids.shape, generator=torch.Generator().manual_seed(seed))
    return eps, batch


def policy_positions(ep):
    return [i for i, m in enumerate(ep.response_mask) if m]


def turn_positions(ep):
    return [list(range(t.start, t.end)) for t in ep.turns]


def whiten_plain(per_ep: list[list[float]]) -> list[list[float]]:
    flat = [x for row in per_ep for x in row]
    mean = sum(flat) / len(flat)
    var = sum((x - mean) ** 2 for x in flat) / (len(flat) - 1)
    return [[(x - mean) / math.sqrt(var + 1e-8) for x in row] for row in per_ep]


def scatter(eps, batch, per_ep: list[list[float]]) -> torch.Tensor:
    """Place each episode's per-policy-token values at its policy positions."""
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float64)
    for b, ep in enumerate(eps):
        for i, x in zip(policy_positions(ep), per_ep[b]):
            out[b, i] = x
    return out


def group_rewards(eps):
    groups: dict[int, list[float]] = {}
    for e in eps:
        groups.setdefault(e.group, []).append(e.reward)
    return groups


def ref_outcome(eps, kind: str) -> list[float]:
    groups, out = group_rewards(eps), []
    for e in eps:
        rs = groups[e.group]
        G, mean = len(rs), sum(rs) / len(rs)
        if G == 1 or max(rs) == min(rs):
            out.append(0.0)
        elif kind == "rloo":
            out.append(e.reward - (sum(rs) - e.reward) / (G - 1))
        elif kind == "dr_grpo":
            out.append(e.reward - mean)
        else:
            sd = math.sqrt(sum((r - mean) ** 2 for r in rs) / (G - 1))
            out.append((e.reward - mean) / (sd + 1e-6))
    return out


def check(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-4):
    assert a.shape == b.shape
    assert torch.allclose(a.double(), b.double(), atol=tol), (a - b).abs().max()


# ----------------------------------------------------------------------------- estimators


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_outcome_estimators_match_loops(name):
    eps, batch = hand_batch(1, values=False)
    credit = ESTIMATORS.get(name)(batch, AlgoConfig())
    adv = ref_outcome(eps, name)
    expect = scatter(eps, batch, [[adv[b]] * len(policy_positions(ep)) for b, ep in enumerate(eps)])
    check(credit.advantages, expect)
    assert credit.advantages.abs().sum() > 0


@pytest.mark.parametrize("whiten", [False, True])
def test_gae_estimator_matches_loop(whiten):
    eps, batch = hand_batch(2)
    algo = AlgoConfig(gamma=0.97, lam=0.9, whiten=whiten)
    credit = ESTIMATORS.get("gae")(batch, algo)
    advs, rets = [], []
    for b, ep in enumerate(eps):
        pos = policy_positions(ep)
        v = [float(batch.old_values[b, i]) for i in pos]
        r = [0.0] * (len(pos) - 1) + [ep.reward]
        a, acc = [0.0] * len(pos), 0.0
        for t in reversed(range(len(pos))):
            nv = v[t + 1] if t + 1 < len(pos) else 0.0
            acc = r[t] + algo.gamma * nv - v[t] + algo.gamma * algo.lam * acc
            a[t] = acc
        advs.append(a)
        rets.append([x + y for x, y in zip(a, v)])
    check(credit.advantages, scatter(eps, batch, whiten_plain(advs) if whiten else advs))
    check(credit.returns, scatter(eps, batch, rets))
    check(credit.value_mask, batch.response_mask)


def test_vine_estimator_matches_loop_and_skips_unknown_values():
    eps, batch = hand_batch(3, values=False)
    rng = random.Random(3)
    values = [[rng.random() for _ in ep.turns] for ep in eps]
    values[0][0] = math.nan  # a state that got no continuation (budget spent)
    batch.payload.add(SegmentValues(values, [[1] * len(v) for v in values]))
    gamma = 0.9
    credit = ESTIMATORS.get("vine")(batch, AlgoConfig(gamma=gamma))
    per_ep = []
    for b, ep in enumerate(eps):
        T, row = ep.num_turns, []
        for k in range(T):
            target = ep.reward if k == T - 1 else gamma * values[b][k + 1]
            a = target - values[b][k]
            row += [0.0 if math.isnan(a) else a] * (ep.turns[k].end - ep.turns[k].start)
        per_ep.append(row)
    check(credit.advantages, scatter(eps, batch, per_ep))
    assert credit.returns is None
    first = eps[0].turns[0]
    assert bool((credit.advantages[0, first.start:first.end] == 0).all())


def ref_mpo(v_turns: list[list[float]], R: float, lam: float, lam_intra: float, beta: float):
    T = len(v_turns)
    first = [v[0] for v in v_turns]
    delta_turn = [(R if t == T - 1 else 0.0) + (first[t + 1] if t + 1 < T else 0.0) - first[t]
                  for t in range(T)]
    out = []
    for t in range(T):
        a_turn = sum(lam ** l * delta_turn[t + l] for l in range(T - t))
        v, n = v_turns[t], len(v_turns[t])
        nxt = v[1:] + [first[t + 1] if t + 1 < T else 0.0]
        d = [nxt[i] - v[i] + ((R if t == T - 1 else 0.0) if i == n - 1 else 0.0) for i in range(n)]
        intra = [sum(lam_intra ** (j - i) * d[j] for j in range(i, n)) for i in range(n)]
        mean = sum(intra) / n
        out += [a_turn + beta * (x - mean) for x in intra]
    return out


def test_mpo_estimator_matches_loop():
    eps, batch = hand_batch(4)
    algo = AlgoConfig(lam=0.8, lam_intra=0.95, beta=1.0, whiten=True)
    credit = ESTIMATORS.get("mpo")(batch, algo)
    per_ep = []
    for b, ep in enumerate(eps):
        v_turns = [[float(batch.old_values[b, i]) for i in pos] for pos in turn_positions(ep)]
        per_ep.append(ref_mpo(v_turns, ep.reward, 0.8, 0.95, 1.0))
    check(credit.advantages, scatter(eps, batch, whiten_plain(per_ep)))
    check(credit.returns, scatter(eps, batch, [[ep.reward] * len(policy_positions(ep)) for ep in eps]))
    check(credit.value_mask, batch.response_mask)


def test_trace_estimator_matches_loop():
    eps, batch = hand_batch(5, values=False)
    rng = random.Random(5)
    M = max(ep.num_turns for ep in eps)
    lps = [[-rng.uniform(0.1, 3.0) for _ in range(ep.num_turns)] for ep in eps]
    table = torch.zeros(len(eps), M)
    for b, row in enumerate(lps):
        table[b, :len(row)] = torch.tensor(row)
    batch.payload.add(TraceReference(table, torch.tensor([ep.num_turns for ep in eps])))
    algo = AlgoConfig(trace_eps=0.1, trace_k=2, gamma_td=0.8, lambda_term=2.0, alpha_out=1.0,
                      alpha_turn=0.2)
    credit = ESTIMATORS.get("trace")(batch, algo)
    out = ref_outcome(eps, "grpo")
    per_ep = []
    for b, ep in enumerate(eps):
        T = ep.num_turns - 1  # tool-call turns; the last turn gets the outcome term only
        d = [-l + algo.trace_eps for l in lps[b]]
        delta = [math.log(d[k] / d[k + 1]) for k in range(T)]
        row = []
        for k in range(ep.num_turns):
            r = 0.0
            if k < T:
                h = min(k + algo.trace_k - 1, T - 1)
                w = [algo.gamma_td ** (u - k) for u in range(k, h + 1)]
                r = sum(wi * delta[u] for wi, u in zip(w, range(k, h + 1))) / sum(w)
                if h == T - 1:
                    r += algo.lambda_term * algo.gamma_td ** (T - k) * out[b]
            a = algo.alpha_out * out[b] + algo.alpha_turn * r
            row += [a] * (ep.turns[k].end - ep.turns[k].start)
        per_ep.append(row)
    check(credit.advantages, scatter(eps, batch, per_ep))


# ----------------------------------------------------------------------------- recipes


def test_recipes_are_complete_and_truthful():
    expected = {"grpo", "dr_grpo", "rloo", "dapo", "gspo", "ppo", "vineppo", "mpo", "trace"}
    assert expected <= set(METHODS.names())
    for name in expected:
        r = METHODS.get(name)
        cfg = config.load(method=name)
        ESTIMATORS.get(cfg.algo.estimator)
        POLICY_LOSSES.get(cfg.algo.loss)
        CONTROLLERS.get(cfg.algo.controller)
        assert r.critic == (cfg.algo.estimator in ("gae", "mpo")), name
        assert r.reference == (cfg.algo.estimator in PREPARERS), name
        assert bool(r.extra_rollouts) == (name in ("vineppo", "dapo")), name
    d = config.load(method="dapo").algo
    assert (d.eps_low, d.eps_high, d.dynamic_sampling, d.overlong_shaping, d.agg) == \
        (0.2, 0.28, True, True, "token-mean")
    g = config.load(method="gspo").algo
    assert (g.loss, g.eps_low, g.eps_high, g.agg) == ("gspo", 3e-4, 4e-4, "seq-mean")
    m = config.load(method="mpo").algo
    assert (m.lam, m.lam_intra, m.beta, m.loss, m.whiten) == (0.8, 0.95, 1.0, "turn_ratio", True)
    p = config.load(method="ppo").algo
    assert (p.lam, p.gamma, p.whiten) == (1.0, 1.0, True)
    assert config.load(method="ppo").train.critic_warmup == 10
    assert config.load(method="mpo").train.critic_warmup == 10
    assert config.load(method="dr_grpo").algo.std_normalize is False
    t = config.load(method="trace").algo
    assert (t.trace_eps, t.trace_k, t.gamma_td, t.lambda_term, t.alpha_out, t.alpha_turn) == \
        (0.1, 3, 0.8, 2.0, 1.0, 0.2)
    with pytest.raises(ConfigError):
        config.load(method="dapo", sets=["algo.overlong_cache=10000"])


# ----------------------------------------------------------------------------- DAPO knobs


def test_overlong_penalty_and_shaping():
    assert overlong_penalty(50, 100, 20) == 0.0
    assert overlong_penalty(80, 100, 20) == 0.0
    assert overlong_penalty(90, 100, 20) == pytest.approx(-0.5)
    assert overlong_penalty(100, 100, 20) == pytest.approx(-1.0)
    assert overlong_penalty(101, 100, 20) == -1.0
    assert overlong_penalty(10, 100, 20, cut=True) == -1.0
    rng = random.Random(0)
    eps = [make_episode(rng, 0, 1.0, 3) for _ in range(2)]
    eps[1].finish = "max_tokens"
    n = len(eps[0].token_ids)
    ctx = RolloutContext(None, None, None, None, 2, n + 5, 4, 0, torch.Generator(),
                         AlgoConfig(overlong_shaping=True, overlong_cache=10))
    shape_rewards(eps, ctx)
    shape_rewards(eps, ctx)  # idempotent
    assert eps[0].reward == pytest.approx(1.0 - 0.5)
    assert eps[1].reward == pytest.approx(0.0)
    assert eps[0].meta.reward_raw == 1.0


class _OneShotEnv:
    """Ends at the first action; reward alternates across env instances of 'mixed' tasks."""

    system_prompt = "say anything"

    def __init__(self, serial: int):
        self.serial, self.task = serial, None

    def reset(self, task):
        self.task = task
        return task.prompt

    def step(self, action):
        r = float(self.task.meta["mixed"] and self.serial % 2 == 1)
        return StepResult("", r, True, False, {"tool": "answer", "success": r > 0})

    def snapshot(self):
        return None

    def restore(self, state):
        pass


class _OneShotSpec:
    name = "oneshot"

    def __init__(self, mixed: set[int], n: int = 8):
        self.made = 0
        self._tasks = [Task(f"x{i}", f"q{i}", "a", {"mixed": i in mixed}) for i in range(n)]

    def make(self):
        self.made += 1
        return _OneShotEnv(self.made)

    def tasks(self, split, n=None):
        return self._tasks[:n]


def _ctx(micro_policy, spec, budget=0, batch_size=8, **algo):
    from agentrl_cli.engines.hf import HFEngine
    from agentrl_cli.engines.base import SamplingParams

    model, _, fmt, _ = micro_policy
    return RolloutContext(HFEngine(model, fmt.pad_id), fmt, spec, SamplingParams(max_new_tokens=6),
                          2, 256, batch_size, budget, torch.Generator().manual_seed(0),
                          AlgoConfig(**algo))


def test_dynamic_sampling_drops_and_refills(micro_policy):
    spec = _OneShotSpec(mixed={3, 5, 6})
    ctx = _ctx(micro_policy, spec, dynamic_sampling=True, dynamic_rounds=4)
    tasks = spec.tasks("train")[:2]  # both constant-reward groups
    res = CONTROLLERS.get("linear").run(ctx, tasks)
    groups = group_rewards(res.episodes)
    assert sorted(groups) == [0, 1]
    assert all(max(r) > min(r) for r in groups.values())
    assert {e.task_id for e in res.episodes} <= {"x3", "x5", "x6"}
    generated = spec.made * 6  # every episode is one message of max_new_tokens or fewer
    assert res.extra_tokens > 0 and res.tokens <= generated
    assert res.extra_tokens == res.tokens - sum(e.generated_tokens for e in res.episodes)
    # nothing informative anywhere: the first round comes back unchanged
    spec2 = _OneShotSpec(mixed=set())
    res2 = CONTROLLERS.get("linear").run(_ctx(micro_policy, spec2, dynamic_sampling=True,
                                          dynamic_rounds=2), spec2.tasks("train")[:2])
    assert [e.task_id for e in res2.episodes] == ["x0", "x0", "x1", "x1"]
    assert res2.counters["dynamic/rounds"] == 2


def test_dynamic_sampling_refills_only_what_the_budget_affords(micro_policy):
    """Under a budget a refill round launches only the groups whose expected cost (the step's
    mean tokens per episode so far x group size) fits in what is left: no refill when the first
    round spent nearly all of it, one group when one fits."""
    spec = _OneShotSpec(mixed={3, 5, 6})
    tasks = spec.tasks("train")[:2]
    first = CONTROLLERS.get("linear").run(_ctx(micro_policy, _OneShotSpec(mixed=set()),
                                           dynamic_sampling=False), tasks)
    spent = sum(e.generated_tokens for e in first.episodes)
    per_group = spent / len(first.episodes) * 2
    tight = CONTROLLERS.get("linear").run(_ctx(micro_policy, spec, budget=spent + int(per_group) - 1,
                                           dynamic_sampling=True, dynamic_rounds=4), tasks)
    assert tight.counters["dynamic/rounds"] == 0 and spec.made == 4
    spec = _OneShotSpec(mixed={3, 5, 6})
    one = CONTROLLERS.get("linear").run(_ctx(micro_policy, spec, budget=spent + int(per_group) + 1,
                                         dynamic_sampling=True, dynamic_rounds=1), tasks)
    assert one.counters["dynamic/rounds"] == 1 and spec.made == 6


def test_linear_budget_stops_launching_waves(micro_policy):
    spec = _OneShotSpec(mixed=set())
    tasks = spec.tasks("train")[:6]
    full = CONTROLLERS.get("linear").run(_ctx(micro_policy, spec, batch_size=2), tasks)
    assert len(full.episodes) == 12
    budget = 20
    res = CONTROLLERS.get("linear").run(_ctx(micro_policy, spec, budget=budget, batch_size=2), tasks)
    groups = group_rewards(res.episodes)
    assert 0 < len(groups) < 6 and all(len(g) == 2 for g in groups.values())
    last_wave = sum(e.generated_tokens for e in res.episodes[-2:])
    assert res.tokens - last_wave < budget <= res.tokens or len(groups) == 6


def test_linear_budget_holds_the_run_to_its_tokens_per_step(micro_policy):
    """Over a run (one `ctx.carry` from step to step) the linear controller launches as many
    groups as the step's limit affords at the run's measured cost of a group, so the run's
    total spend stays within about one group of its total budget (`spend_limit`), whatever
    the groups cost; the same rule holds the path scheduler's linear controller."""
    spec = micro_policy[3]
    tasks = spec.tasks("train", 8)
    full = CONTROLLERS.get("linear").run(_ctx(micro_policy, spec, batch_size=4), tasks)
    per_group = full.tokens / 8
    budget = int(full.tokens * 0.55)              # about 4.4 of the step's 8 groups
    carry: dict = {}
    spent, counts = [], []
    for step in range(8):
        ctx = _ctx(micro_policy, spec, budget=budget, batch_size=4)
        ctx.generator.manual_seed(step)
        ctx.carry = carry
        res = CONTROLLERS.get("linear").run(ctx, tasks)
        spent.append(res.tokens)
        counts.append(len(group_rewards(res.episodes)))
    assert carry["linear_spend"] == [float(sum(spent)), 8.0 * budget]
    assert abs(sum(spent) - 8 * budget) <= 2 * per_group, (spent, budget)
    assert all(2 <= c < 8 for c in counts), counts     # whole groups, fewer than the tasks
    assert abs(sum(spent) / 8 - budget) / budget < 0.25


def test_linear_budget_draws_more_tasks_when_its_groups_fall_short(micro_policy):
    """A budget above what the step's own groups cost: the linear controller draws fresh
    training tasks (distinct, none of the step's) in whole groups until the budget is met within
    about one group, so a GRPO whose episodes get shorter still generates what FOCUS does."""
    spec = micro_policy[3]
    tasks = spec.tasks("train", 2)
    full = CONTROLLERS.get("linear").run(_ctx(micro_policy, spec, batch_size=4), tasks)
    assert len(group_rewards(full.episodes)) == 2
    per_group = full.tokens / 2
    budget = int(full.tokens * 3)                  # about six groups' worth
    res = CONTROLLERS.get("linear").run(_ctx(micro_policy, spec, budget=budget, batch_size=4), tasks)
    by_group: dict = {}
    for e in res.episodes:
        by_group.setdefault(e.group, []).append(e.task_id)
    assert sorted(by_group) == list(range(len(by_group))) and len(by_group) > 3
    assert all(len(ids) == 2 and len(set(ids)) == 1 for ids in by_group.values())
    firsts = [by_group[g][0] for g in sorted(by_group)]
    assert firsts[:2] == [t.task_id for t in tasks] and len(set(firsts)) == len(firsts)
    assert res.metrics["rollout/drawn_groups"] == len(by_group) - 2
    assert abs(res.tokens - budget) <= 1.5 * per_group, (res.tokens, budget, per_group)
    # dynamic sampling keeps its own refill rule: no extra draws from the first round
    ds = CONTROLLERS.get("linear").run(_ctx(micro_policy, spec, budget=budget, batch_size=4,
                                        dynamic_sampling=True, dynamic_rounds=0), tasks)
    assert len(group_rewards(ds.episodes)) == 2


# ----------------------------------------------------------------------------- end to end

E2E = MICRO + ["rollout.max_new_tokens=6", "train.steps=2",
               "train.eval_every=0", "train.save_every=0", "train.eval_tasks=1",
               "algo.vine_k=2", "algo.dynamic_rounds=1"]


@pytest.mark.parametrize("method", ["grpo", "dr_grpo", "rloo", "dapo", "gspo", "ppo", "vineppo",
                                    "mpo", "trace"])
def test_every_recipe_trains_two_steps(method, tmp_path):
    from agentrl_cli.app.train import train

    cfg = config.load(method=method, sets=E2E)
    summary = train(cfg, tmp_path, log=lambda s: None)
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert len(steps) == 2 and summary["steps"] == 2
    for r in steps:
        assert math.isfinite(r["loss/policy"]) and math.isfinite(r["adv/mean"])
        assert r["rollout/tokens"] >= r["rollout/tokens_per_episode"] > 0
        if METHODS.get(method).critic:
            assert math.isfinite(r["loss/critic"])
        if method == "vineppo":  # continuations are generated but not trained on
            assert r["rollout/tokens"] > r["rollout/tokens_per_episode"] * 4

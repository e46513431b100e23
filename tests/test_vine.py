"""The VinePPO controller: continuations resume exactly from the recorded state, values are the
means of their rewards, the budget caps them, and the runner hook leaves plain rollouts alone."""
from __future__ import annotations

import math

import pytest
import torch

from agentrl_cli.config import AlgoConfig
from agentrl_cli.credit.estimators import ESTIMATORS, SegmentValues
from agentrl_cli.engines.hf import HFEngine
from agentrl_cli.engines.base import SamplingParams
from agentrl_cli.envs.search import SearchEnv
from agentrl_cli.rollout.controllers import CONTROLLERS, RolloutContext
from agentrl_cli.rollout.runner import run_episodes
from agentrl_cli.train.batch import collate




class _SpyEnv(SearchEnv):
    """Records what a restored env looks like; truncated episodes get a reward that depends on
    the last action, so continuation rewards vary even with an untrained model."""

    restores: list = []

    def restore(self, state):
        super().restore(state)
        _SpyEnv.restores.append([(h["action"], h["observation"]) for h in self.history])

    def step(self, action):
        res = super().step(action)
        if res.truncated:
            res.reward = float(len(action) % 2)
        return res


class _SpySpec:
    def __init__(self, spec):
        self.spec, self.name = spec, spec.name

    def make(self):
        return _SpyEnv(self.spec.world, self.spec.max_turns)

    def tasks(self, split, n=None):
        return self.spec.tasks(split, n)


def _run(micro_policy, K=2, budget=0, batch_size=16, seed=0):
    model, _, fmt, spec = micro_policy
    _SpyEnv.restores = []
    ctx = RolloutContext(HFEngine(model, fmt.pad_id), fmt, _SpySpec(spec),
                         SamplingParams(max_new_tokens=6), 2, 512, batch_size, budget,
                         torch.Generator().manual_seed(seed), AlgoConfig(vine_k=K))
    tasks = spec.tasks("train", 2)
    return CONTROLLERS.get("vine").run(ctx, tasks), tasks


@pytest.fixture(scope="module")
def vine_run(micro_policy):
    res, tasks = _run(micro_policy)
    return res, tasks, list(_SpyEnv.restores)


def test_continuations_resume_from_the_snapshot_state(vine_run):
    res, tasks, restores = vine_run
    conts = res.continuations
    assert len(conts) == len(restores) > 0
    for cont, history in zip(conts, restores):
        src = res.episodes[cont.meta.source]
        k = cont.meta.boundary
        prefix = src.token_ids[:src.turns[k].start]
        # the same observation history as the episode at that boundary ...
        assert history == [(t.action, t.observation) for t in src.turns[:k]]
        # ... and exactly the episode's token prefix, generation starting right after it
        assert cont.token_ids[:len(prefix)] == prefix
        assert cont.turns[0].start == len(prefix)
        assert cont.task_id == src.task_id
        assert sum(cont.response_mask[:len(prefix)]) == 0
        assert all(cont is not ep for ep in res.episodes)  # never trained on


def test_values_are_means_of_continuation_rewards(vine_run):
    res, tasks, _ = vine_run
    conts = res.continuations
    rewards: dict[int, list[float]] = {}
    for c in conts:
        rewards.setdefault(c.meta.vine_state, []).append(c.reward)
    assert len({r for rs in rewards.values() for r in rs}) > 1, "rewards should vary"
    values, counts = res.payload.get(SegmentValues).values, res.payload.get(SegmentValues).counts
    n_states = len(rewards)
    # s_0 is shared by a group; every later boundary is its own state
    assert n_states == len(tasks) + sum(ep.num_turns - 1 for ep in res.episodes)
    assert all(len(rs) == 2 for rs in rewards.values())  # K continuations each
    for b, ep in enumerate(res.episodes):
        assert len(values[b]) == ep.num_turns
        for k in range(ep.num_turns):
            states = {c.meta.vine_state for c in conts
                      if c.meta.boundary == k and (c.meta.source == b or
                                                      (k == 0 and res.episodes[c.meta.source].group == ep.group))}
            assert len(states) == 1
            rs = rewards[states.pop()]
            assert values[b][k] == pytest.approx(sum(rs) / len(rs))
            assert counts[b][k] == len(rs)
    assert res.extra_tokens == sum(c.generated_tokens for c in conts) > 0
    assert res.tokens == sum(e.generated_tokens for e in res.episodes) + res.extra_tokens


def test_vine_values_feed_the_estimator(vine_run):
    res, _, _ = vine_run
    model_free = collate(res.episodes, pad_id=0)
    model_free.payload = res.payload
    credit = ESTIMATORS.get("vine")(model_free, AlgoConfig())
    ep, b = res.episodes[0], 0
    v = res.payload.get(SegmentValues).values[0]
    for k, turn in enumerate(ep.turns):
        target = ep.reward if k == ep.num_turns - 1 else v[k + 1]
        assert torch.allclose(credit.advantages[b, turn.start:turn.end],
                              torch.tensor(target - v[k]), atol=1e-6)


def test_budget_caps_continuations_round_robin(micro_policy, vine_run):
    full, _, _ = vine_run
    main = sum(e.generated_tokens for e in full.episodes)
    budget = main + full.extra_tokens // 3
    res, _ = _run(micro_policy, K=2, budget=budget, batch_size=3)
    conts = res.continuations
    assert 0 < len(conts) < len(full.continuations)
    # the plan never prices the step above the budget (each continuation at its source's cost)
    cost = 0
    for c in conts:
        src = res.episodes[c.meta.source]
        cost += sum(t.end - t.start for t in src.turns[c.meta.boundary:])
    assert sum(e.generated_tokens for e in res.episodes) + cost <= budget
    # round-robin: no state has a second continuation while another has none
    counts = [n for row in res.payload.get(SegmentValues).counts for n in row]
    assert max(counts) - min(counts) <= 1
    assert any(math.isnan(v) for row in res.payload.get(SegmentValues).values for v in row) == (min(counts) == 0)


def test_on_state_hook_sees_every_boundary_and_changes_nothing(micro_policy):
    model, _, fmt, spec = micro_policy
    pairs = [(t, i) for i, t in enumerate(spec.tasks("eval", 2))]
    params = SamplingParams(max_new_tokens=6)
    plain = run_episodes(HFEngine(model, fmt.pad_id), fmt, spec, pairs, params, 512, 2,
                         torch.Generator().manual_seed(3))
    seen: dict[int, list[int]] = {}
    hooked = run_episodes(HFEngine(model, fmt.pad_id), fmt, spec, pairs, params, 512, 2,
                          torch.Generator().manual_seed(3),
                          on_state=lambda ep, env: seen.setdefault(id(ep), []).append(len(ep.token_ids)))
    assert [e.token_ids for e in plain] == [e.token_ids for e in hooked]
    for ep in hooked:
        assert seen[id(ep)] == [t.start for t in ep.turns]


def test_budget_is_reserved_for_values(micro_policy, vine_run):
    """At GRPO's natural cost (the main episodes' tokens) VinePPO must still estimate values:
    it runs fewer main groups and spends the rest on continuations, instead of spending the
    whole budget on episodes (which left no continuations before)."""
    from agentrl_cli.rollout.vine import projected_cost

    full, tasks, _ = vine_run
    main = sum(e.generated_tokens for e in full.episodes)
    res, _ = _run(micro_policy, K=2, budget=main, batch_size=2)
    groups = {e.group for e in res.episodes}
    assert len(groups) < len(tasks)
    assert res.counters["vine/continuations"] > 0
    # the wave that stopped the main episodes projected at least the budget
    assert projected_cost(res.episodes, _states(res.episodes), 2) >= main
    # also when one wave could hold every group of the step (the first wave is one group)
    big, _ = _run(micro_policy, K=2, budget=main, batch_size=64)
    assert len({e.group for e in big.episodes}) < len(tasks)
    assert big.counters["vine/continuations"] > 0


def test_projected_cost_counts_shared_root_once():
    from agentrl_cli.rollout.vine import projected_cost
    from agentrl_cli.types import Episode

    def ep(group, mask, starts):
        return Episode(task_id="t", group=group, token_ids=list(range(len(mask))),
                       response_mask=mask, logprobs=[0.0] * len(mask), turn_index=[0] * len(mask),
                       segment_starts=starts, segment_index=[0] * len(mask), answer="",
                       generated_tokens=sum(mask))
    a = ep(0, [0, 1, 1, 0, 1], [1, 4])      # 3 generated; states: s0 (3 after), s1 (1 after)
    b = ep(0, [0, 1, 0, 1, 1], [1, 3])      # same group: s0 shared (priced at a's 3)
    assert projected_cost([a], _states([a]), 3) == 3 + 3 * 3 + 3 * 1
    assert projected_cost([a, b], _states([a, b]), 3) == (3 + 9 + 3) + (3 + 3 * 2)


def _states(eps):
    """`boundary_states` of episodes whose env was recorded at every segment start."""
    from agentrl_cli.rollout.vine import boundary_states

    return boundary_states(eps, {id(e): [(s, None) for s in e.segment_starts] for e in eps})[0]


def test_what_a_step_leaves_unspent_carries_to_the_next(micro_policy, vine_run):
    """A budgeted step rarely fits a whole group in what is left, so it underspends; the rest
    goes to the next step's limit (as GRPO's and FOCUS's), so a run's mean is the budget."""
    from agentrl_cli.rollout.controllers import spend_limit

    full, _, _ = vine_run
    budget = sum(e.generated_tokens for e in full.episodes) + full.extra_tokens // 2
    model, _, fmt, spec = micro_policy
    ctx = RolloutContext(HFEngine(model, fmt.pad_id), fmt, _SpySpec(spec),
                         SamplingParams(max_new_tokens=6), 2, 512, 3, budget,
                         torch.Generator().manual_seed(0), AlgoConfig(vine_k=2))
    tasks = spec.tasks("train", 2)
    spent = []
    for _ in range(3):
        res = CONTROLLERS.get("vine").run(ctx, tasks)
        spent.append(res.tokens)
    assert ctx.carry["vine_spend"] == [sum(spent), 3 * budget]
    assert spent[0] < budget                     # the first step left some unspent
    assert spend_limit(ctx, "vine_spend") == min(2 * budget, max(0, 4 * budget - sum(spent)))

"""Critic values at token positions (`rollout.values`): the trainer's forward pass's values at the
same positions (value head and separate critic, with and without context windows), the same
numbers for episodes and plain token ids, 0.5 without a critic, and positions checked."""
from __future__ import annotations

import copy

import pytest
import torch

from agentrl_cli.engines.hf import HFEngine
from agentrl_cli.engines.base import SamplingParams
from agentrl_cli.models.critic import SeparateCritic
from agentrl_cli.rollout.runner import run_episodes
from agentrl_cli.rollout.values import NO_CRITIC, CriticValues, critic_values, head_values
from agentrl_cli.train.batch import collate, forward

from conftest import random_value_head


@pytest.fixture(scope="module")
def episodes(micro_policy):
    model, tok, fmt, spec = micro_policy
    pairs = [(t, g) for g, t in enumerate(spec.tasks("train", 3))]
    eps = run_episodes(HFEngine(model, fmt.pad_id), fmt, spec, pairs, SamplingParams(max_new_tokens=8),
                       512, len(pairs), torch.Generator().manual_seed(0))
    eps[1] = _cut(eps[1], len(eps[1].token_ids) - 17)  # rows of different lengths: padding
    return eps


def _cut(e, n):
    """`e`'s first n tokens (the per-token lists the forward passes read)."""
    e = copy.deepcopy(e)
    for name in ("token_ids", "response_mask", "logprobs", "turn_index", "segment_index"):
        setattr(e, name, getattr(e, name)[:n])
    return e


def _critics(model):
    head = random_value_head(model)
    sep = SeparateCritic(model)
    sep.load_head({"weight": head.weight.detach().clone(), "bias": head.bias.detach().clone()})
    with torch.no_grad():
        for p in sep.model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    return {"head": head, "separate": sep}


def _trainer_values(model, critic, eps, pad_id):
    with torch.no_grad():
        _, values = forward(model, critic, collate(eps, pad_id), 1.0)
    return values


def _windowed(eps):
    """The same token sequences, with a context reset in the middle of each episode: a token of
    the second window sees only the prompt and its own window."""
    out = []
    for e in eps:
        e = copy.deepcopy(e)
        e.context, e.window_prefix = "test", e.segment_starts[0]
        e.window_starts = [(e.window_prefix + len(e.token_ids)) // 2]
        out.append(e)
    return out


@pytest.mark.parametrize("form", ["head", "separate"])
@pytest.mark.parametrize("windows", [False, True])
def test_values_equal_the_trainers_forward_at_the_same_positions(micro_policy, episodes, form, windows):
    model, tok, fmt, spec = micro_policy
    critic = _critics(model)[form]
    eps = _windowed(episodes) if windows else episodes
    want = _trainer_values(model, critic, eps, fmt.pad_id)
    if windows:  # the window masks change the values after the reset
        plain = _trainer_values(model, critic, episodes, fmt.pad_id)
        assert not torch.allclose(want, plain, atol=1e-4)
    positions = [list(range(1, len(e.token_ids))) for e in eps]
    got = critic_values(model, critic, eps, positions)
    for b, (e, ps) in enumerate(zip(eps, positions)):
        torch.testing.assert_close(torch.tensor(got[b]), want[b, ps].float(), rtol=0, atol=1e-6)
    # a subset of the positions, and episodes without positions, read the same values
    some = [ps[::3] if b != 1 else [] for b, ps in enumerate(positions)]
    sub = critic_values(model, critic, eps, some)
    assert sub[1] == []
    for b in (0, 2):
        torch.testing.assert_close(torch.tensor(sub[b]), want[b, some[b]].float(), rtol=0, atol=1e-6)


def test_token_ids_read_like_one_window_episodes(micro_policy, episodes):
    model = micro_policy[0]
    for critic in _critics(model).values():
        ends = [[len(e.token_ids)] for e in episodes]
        by_episode = critic_values(model, critic, episodes, ends)
        assert critic_values(model, critic, [list(e.token_ids) for e in episodes], ends) == by_episode
        assert CriticValues(model, critic)(episodes, ends) == by_episode


def test_value_head_on_hidden_states_at_hand(micro_policy, episodes):
    """`head_values` on the policy's last hidden state of a context is the value at its end."""
    from agentrl_cli.models.sequences import hidden_states

    model = micro_policy[0]
    head = _critics(model)["head"]
    e = episodes[0]
    assert not model.training
    with torch.no_grad():
        h = hidden_states(model, torch.tensor([e.token_ids]), torch.ones(1, len(e.token_ids)))
    [want] = critic_values(model, head, [e], [[len(e.token_ids)]])
    assert head_values(head, h[0, -1:]) == pytest.approx(want, abs=1e-6)


def test_no_critic_and_bad_positions(micro_policy, episodes):
    model = micro_policy[0]
    assert critic_values(model, None, episodes[:2], [[1, 2], []]) == [[NO_CRITIC] * 2, []]
    head = _critics(model)["head"]
    assert critic_values(model, head, episodes[:2], [[], []]) == [[], []]
    n = len(episodes[0].token_ids)
    for bad in (0, n + 1):
        with pytest.raises(ValueError, match="positions"):
            critic_values(model, head, episodes[:1], [[bad]])
    was = model.training
    try:
        model.train()
        assert critic_values(model, head, episodes[:1], [[n]]) == critic_values(model.eval(), head, episodes[:1], [[n]])
        model.train()
        critic_values(model, head, episodes[:1], [[n]])
        assert model.training, "the policy's mode is restored"
    finally:
        model.train(was)

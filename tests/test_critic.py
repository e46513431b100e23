"""The critic forms: `model.critic=head` trains the value head and the shared backbone,
`detached` keeps the critic's loss out of the backbone (the head still learns)."""
from __future__ import annotations

import copy

import pytest
import torch

from conftest import MICRO
from agentrl_cli import config
from agentrl_cli.train.loop import DetachedValueHead, build_learner


@pytest.mark.parametrize("form", ["head", "detached"])
def test_critic_loss_reaches_the_backbone_only_when_shared(micro_policy, form):
    model = copy.deepcopy(micro_policy[0])
    cfg = config.load(sets=MICRO + [f"model.critic={form}"], method="focus")
    learner = build_learner(cfg, model)
    assert isinstance(learner.value_head, DetachedValueHead) == (form == "detached")
    with torch.no_grad():          # the head starts at weight 0 (v = 0.5): give it a slope
        learner.value_head.weight.fill_(0.1)
    ids = torch.tensor([[1, 5, 7, 9, 11, 13]])
    h = model.model(input_ids=ids).last_hidden_state
    v = learner.value_head(h).squeeze(-1)
    ((v - 1.0) ** 2).mean().backward()
    assert learner.value_head.weight.grad is not None and learner.value_head.weight.grad.abs().sum() > 0
    backbone = [p.grad for p in model.model.parameters()]
    reached = any(g is not None and g.abs().sum() > 0 for g in backbone)
    assert reached == (form == "head")
    # same parameters, same state-dict keys: checkpoints load into either form
    assert set(learner.value_head.state_dict()) == {"weight", "bias"}


def test_unknown_critic_form_is_a_config_error():
    with pytest.raises(config.ConfigError, match="model.critic"):
        config.load(sets=["model.critic=separate"])


def test_critic_warmup_trains_only_the_value_head(micro_policy):
    """`train.critic_warmup=N`: at steps <= N the backbone (the policy) keeps its weights and the
    value head moves; after it, both move."""
    from test_distributed import _global_episodes
    from agentrl_cli.credit.estimators import ESTIMATORS
    from agentrl_cli.train import loop
    from agentrl_cli.train.batch import collate

    model, tok, fmt, spec = micro_policy
    eps = _global_episodes(micro_policy)
    cfg = config.load(sets=MICRO + ["train.critic_warmup=1", "algo.whiten=false"], method="ppo")
    learner = loop.build_learner(cfg, copy.deepcopy(model), log=lambda s: None)

    def step(n):
        batch = collate(copy.deepcopy(eps), fmt.pad_id)
        loop.score(learner, batch, cfg)
        c = ESTIMATORS.get(cfg.algo.estimator)(batch, cfg.algo)
        batch.advantages, batch.returns, batch.value_mask = c.advantages, c.returns, c.value_mask
        return loop.update(learner, batch, cfg, step=n)

    def moved(module, before):
        return max(float((a.detach() - b).abs().max()) for a, b in zip(module.parameters(), before))

    def snap(module):
        return [p.detach().clone() for p in module.parameters()]

    body, head = snap(learner.model), snap(learner.value_head)
    stats = step(1)                                     # warm-up: the head alone
    assert moved(learner.model, body) == 0.0
    assert moved(learner.value_head, head) > 1e-4
    assert stats["loss/critic"] > 0
    head = snap(learner.value_head)
    step(2)                                             # after it: both
    assert moved(learner.model, body) > 1e-4
    assert moved(learner.value_head, head) > 1e-4

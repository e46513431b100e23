"""The critic forms: `model.critic=head` trains the value head and the shared backbone,
`detached` keeps the critic's loss out of the backbone (the head still learns), `separate` is
its own model (a copy of the initial policy) + head: it reads the same token ids everywhere the
head reads the policy's hidden states (trainer, FOCUS trees in process and on the scheduler,
checkpoints), and the two never share a gradient."""
from __future__ import annotations

import copy

import pytest
import torch

from conftest import MICRO
from agentrl_cli import config
from agentrl_cli.errors import ConfigError
from agentrl_cli.models.critic import DetachedValueHead
from agentrl_cli.train.learner import build_learner


@pytest.mark.parametrize("form", ["head", "detached"])
def test_critic_loss_reaches_the_backbone_only_when_shared(micro_policy, form):
    model = copy.deepcopy(micro_policy[0])
    cfg = config.load(sets=MICRO + [f"model.critic={form}"], method="focus")
    learner = build_learner(cfg, model)
    assert isinstance(learner.critic, DetachedValueHead) == (form == "detached")
    with torch.no_grad():          # the head starts at weight 0 (v = 0.5): give it a slope
        learner.critic.weight.fill_(0.1)
    ids = torch.tensor([[1, 5, 7, 9, 11, 13]])
    h = model.model(input_ids=ids).last_hidden_state
    v = learner.critic(h).squeeze(-1)
    ((v - 1.0) ** 2).mean().backward()
    assert learner.critic.weight.grad is not None and learner.critic.weight.grad.abs().sum() > 0
    backbone = [p.grad for p in model.model.parameters()]
    reached = any(g is not None and g.abs().sum() > 0 for g in backbone)
    assert reached == (form == "head")
    # same parameters, same state-dict keys: checkpoints load into either form
    assert set(learner.critic.state_dict()) == {"weight", "bias"}


def test_unknown_critic_form_is_a_config_error():
    with pytest.raises(ConfigError, match="model.critic"):
        config.load(sets=["model.critic=shared-lora"])


def _ppo_steps(micro_policy, sets):
    """A ppo learner on the micro model and `step(n)`: one update on the same fixed episodes."""
    from test_distributed import _global_episodes
    from agentrl_cli.credit.estimators import ESTIMATORS
    from agentrl_cli.train import learner as learner_mod
    from agentrl_cli.train.batch import collate

    model, tok, fmt, spec = micro_policy
    eps = _global_episodes(micro_policy)
    cfg = config.load(sets=MICRO + sets + ["algo.whiten=false"], method="ppo")
    learner = learner_mod.build_learner(cfg, copy.deepcopy(model), log=lambda s: None)

    def step(n):
        batch = collate(copy.deepcopy(eps), fmt.pad_id)
        learner_mod.score(learner, batch, cfg)
        c = ESTIMATORS.get(cfg.algo.estimator)(batch, cfg.algo)
        batch.advantages, batch.returns, batch.value_mask = c.advantages, c.returns, c.value_mask
        return learner_mod.update(learner, batch, cfg, step=n)

    return learner, step


def _snap(module):
    return [p.detach().clone() for p in module.parameters()]


def _moved(module, before):
    return max(float((a.detach() - b).abs().max()) for a, b in zip(module.parameters(), before))


def test_critic_warmup_trains_only_the_value_head(micro_policy):
    """`train.critic_warmup=N`: at steps <= N the backbone (the policy) keeps its weights and the
    value head moves; after it, both move."""
    learner, step = _ppo_steps(micro_policy, ["train.critic_warmup=1"])
    body, head = _snap(learner.model), _snap(learner.critic)
    stats = step(1)                                     # warm-up: the head alone
    assert _moved(learner.model, body) == 0.0
    assert _moved(learner.critic, head) > 1e-4
    assert stats["loss/critic"] > 0
    head = _snap(learner.critic)
    step(2)                                             # after it: both
    assert _moved(learner.model, body) > 1e-4
    assert _moved(learner.critic, head) > 1e-4


def _separate_like(head, model):
    """A separate critic on a copy of `model` whose head equals `head`: the values of `head` on
    `model`'s hidden states, computed by the separate code paths."""
    from agentrl_cli.models.critic import build_critic

    critic = build_critic("separate", model)
    critic.head.load_state_dict(head.state_dict())
    return critic


def test_separate_critic_is_its_own_model(micro_policy):
    from test_distributed import _global_episodes
    from agentrl_cli.models.critic import SeparateCritic
    from agentrl_cli.train.batch import collate, forward

    model, tok, fmt, spec = micro_policy
    policy = copy.deepcopy(model)
    cfg = config.load(sets=MICRO + ["model.critic=separate"], method="ppo")
    learner = build_learner(cfg, policy, log=lambda s: None)
    critic = learner.critic
    assert isinstance(critic, SeparateCritic) and critic.model is not policy
    ids = {id(p) for p in policy.parameters()}
    assert not any(id(p) in ids for p in critic.parameters())
    assert sum(1 for p in learner.params if id(p) not in ids) == len(list(critic.parameters()))
    batch = collate(_global_episodes(micro_policy), fmt.pad_id)
    with torch.no_grad():
        critic.head.weight.normal_(std=0.05)
    # at step 0 the copy gives exactly the values of the same head on the policy's features
    head = torch.nn.Linear(model.config.hidden_size, 1)
    head.load_state_dict(critic.head.state_dict())
    lp, v = forward(policy, critic, batch, 1.0)
    lp_h, v_h = forward(policy, head, batch, 1.0)
    torch.testing.assert_close(v, v_h, rtol=0, atol=1e-5)
    torch.testing.assert_close(lp, lp_h)
    # the critic's loss reaches its own model and not the policy
    m = batch.attention_mask.float()
    ((v - 1.0) ** 2 * m).sum().backward()
    assert all(p.grad is None for p in policy.parameters())
    assert all(p.grad is not None for p in critic.model.model.parameters())
    assert critic.head.weight.grad.abs().sum() > 0
    # ... and the policy's loss never reaches the critic
    learner.optimizer.zero_grad(set_to_none=True)
    lp, v = forward(policy, critic, batch, 1.0)
    (lp * batch.response_mask).sum().backward()
    assert all(p.grad is None for p in critic.parameters())


def test_separate_critic_warmup_moves_the_critic_model_only(micro_policy):
    learner, step = _ppo_steps(micro_policy, ["model.critic=separate", "train.critic_warmup=2"])
    pol, crit = _snap(learner.model), _snap(learner.critic.model)
    step(1)            # the head starts at weight 0: no gradient reaches the critic model yet
    step(2)
    assert _moved(learner.model, pol) == 0.0
    assert _moved(learner.critic.model, crit) > 1e-5
    crit = _snap(learner.critic.model)
    step(3)
    assert _moved(learner.model, pol) > 1e-5 and _moved(learner.critic.model, crit) > 1e-5


def _trees_equal(ref, res):
    for a, b in zip(ref.episodes, res.episodes):
        assert a.token_ids == b.token_ids
    for ta, tb in zip(ref.trees, res.trees):
        assert [(n.parent, n.position, n.launched) for n in ta.nodes] == \
               [(n.parent, n.position, n.launched) for n in tb.nodes]
        for na, nb in zip(ta.nodes, tb.nodes):
            assert (na.v is None) == (nb.v is None)
            if na.v is not None:
                assert abs(na.v - nb.v) < 1e-4


def test_focus_trees_read_a_separate_critic_at_the_node_states(micro_policy):
    """In process and on the path scheduler, a separate critic that copies the policy (same head)
    gives the trees of the value head: it is read at each node's last context token. A changed
    critic model changes the values (the policy's hidden states are not used)."""
    from conftest import random_value_head
    from agentrl_cli.engines.hf import HFEngine
    from agentrl_cli.engines.base import SamplingParams
    from agentrl_cli.rollout.executors import HFPathExecutor
    from agentrl_cli.rollout.pools import LocalPool
    from agentrl_cli.rollout.scheduler import PathRunner
    from agentrl_cli.rollout.values import CriticValues
    from agentrl_cli.rollout.controllers import CONTROLLERS, RolloutContext

    model, tok, fmt, spec = micro_policy
    params = SamplingParams(max_new_tokens=8)
    algo = config.load(sets=MICRO + ["algo.focus_roots=1"], method="focus").algo
    tasks = spec.tasks("train", 3)

    def ctx(head):
        return RolloutContext(HFEngine(model, fmt.pad_id), fmt, spec, params, 3, 512, 3, 0,
                              torch.Generator().manual_seed(0), algo=algo, critic=head)

    head = random_value_head(model)
    ref = CONTROLLERS.get("focus").run(ctx(head), tasks)
    assert ref.metrics["focus/continuations"] > 0, "the case must branch"
    critic = _separate_like(head, model)
    _trees_equal(ref, CONTROLLERS.get("focus").run(ctx(critic), tasks))
    ex = HFPathExecutor(HFEngine(model, fmt.pad_id), fmt, spec, params, 512, share=3)
    runner = PathRunner(LocalPool(ex), CriticValues(model, critic), ticks=2)
    _trees_equal(ref, CONTROLLERS.get("focus").run_paths(ctx(critic), tasks, runner))
    with torch.no_grad():
        for p in critic.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    changed = CONTROLLERS.get("focus").run(ctx(critic), tasks)
    v0 = [n.v for n in ref.trees[0].nodes[:1]]
    v1 = [n.v for n in changed.trees[0].nodes[:1]]
    assert abs(v0[0] - v1[0]) > 1e-4


def test_separate_critic_checkpoint_round_trip(micro_policy, tmp_path):
    from conftest import random_value_head
    from agentrl_cli.models.critic import SeparateCritic, ValueHead, critic_from_state
    from agentrl_cli.train.batch import collate, forward
    from test_distributed import _global_episodes

    model, tok, fmt, spec = micro_policy
    critic = _separate_like(random_value_head(model, seed=3), model)
    with torch.no_grad():
        for p in critic.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    back = critic_from_state(critic.state_dict(), model)
    assert isinstance(back, SeparateCritic) and not back.training
    batch = collate(_global_episodes(micro_policy), fmt.pad_id)
    with torch.no_grad():
        torch.testing.assert_close(forward(model, back, batch, 1.0)[1],
                                   forward(model, critic, batch, 1.0)[1])
    head = ValueHead(model.config.hidden_size)
    assert isinstance(critic_from_state(head.state_dict(), model), ValueHead)



@pytest.mark.parametrize("form", ["head", "separate"])
def test_critic_lr_is_the_critics_own_rate(micro_policy, form):
    """`train.critic_lr`: the critic's parameters (the head, or the whole separate model) take
    their own rate. With the policy's rate at (almost) 0 only the critic moves."""
    learner, step = _ppo_steps(micro_policy, [f"model.critic={form}", "train.lr=1e-12",
                                              "train.critic_lr=1e-2"])
    groups = learner.optimizer.param_groups
    assert [g["lr"] for g in groups] == [1e-12, 1e-2]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in learner.critic.parameters()}
    pol, crit = _snap(learner.model), _snap(learner.critic)
    step(1)
    step(2)
    assert _moved(learner.model, pol) < 1e-8
    assert _moved(learner.critic, crit) > 1e-3
    # without it: one group at train.lr (the checkpoints of earlier versions resume)
    learner, _ = _ppo_steps(micro_policy, [f"model.critic={form}"])
    assert len(learner.optimizer.param_groups) == 1


def _small_critic_folder(micro_policy, path, extra_token=False):
    """A smaller model of the policy's family (1 layer, hidden 64) saved with the policy's
    tokenizer (`extra_token`: a tokenizer with one more token)."""
    import copy as _copy

    from transformers import AutoModelForCausalLM

    model, tok, fmt, spec = micro_policy
    conf = _copy.deepcopy(model.config)
    conf.num_hidden_layers, conf.hidden_size, conf.intermediate_size = 1, 64, 128
    conf.num_attention_heads, conf.num_key_value_heads, conf.head_dim = 2, 1, 32
    if hasattr(conf, "layer_types") and conf.layer_types is not None:
        conf.layer_types = conf.layer_types[:1]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(conf).save_pretrained(path)
    t = _copy.deepcopy(tok)
    if extra_token:
        t.add_tokens(["<not-in-the-policy>"])
    t.save_pretrained(path)
    return path


def test_separate_critic_from_its_own_model_path(micro_policy, tmp_path):
    """`model.critic_path`: the separate critic is that model (here a smaller one), trained,
    checkpointed with its architecture and rebuilt from the checkpoint alone by diagnose and
    rollout; a critic with another tokenizer is a config error."""
    from agentrl_cli.diagnostics.mc import load_checkpoint_policy
    from agentrl_cli.models.critic import SeparateCritic
    from agentrl_cli.models.loading import model_path
    from agentrl_cli.train import checkpoint
    from agentrl_cli.app.train import train

    folder = _small_critic_folder(micro_policy, tmp_path / "small")
    sets = MICRO + ["model.critic=separate", f"model.critic_path={folder}", "train.steps=2",
                    "train.save_every=2", "train.eval_every=0"]
    cfg = config.load(sets=sets, method="mpo")
    learner = build_learner(cfg, copy.deepcopy(micro_policy[0]),
                            model_path=model_path(cfg), log=lambda s: None)
    assert isinstance(learner.critic, SeparateCritic)
    assert learner.critic.model.config.hidden_size == 64 and learner.critic.head.in_features == 64

    out = tmp_path / "run"
    logs: list[str] = []
    train(cfg, out, log=logs.append)
    assert any(f"from {folder}" in line for line in logs)
    state = checkpoint.load_state(checkpoint.step_dir(out, 2))
    assert state["critic_config"]["hidden_size"] == 64
    pol = load_checkpoint_policy(config.load_saved(out), out)
    assert isinstance(pol.critic, SeparateCritic) and pol.critic.model.config.num_hidden_layers == 1
    back = pol.critic.state_dict()
    assert all(torch.equal(back[k], v) for k, v in state["value_head"].items())

    bad = _small_critic_folder(micro_policy, tmp_path / "other-tok", extra_token=True)
    cfg = config.load(sets=MICRO + ["model.critic=separate", f"model.critic_path={bad}"],
                      method="mpo")
    with pytest.raises(ConfigError, match="different tokenizer"):
        build_learner(cfg, copy.deepcopy(micro_policy[0]),
                      model_path=model_path(cfg), log=lambda s: None)


@pytest.mark.parametrize("form", ["head", "detached", "separate"])
def test_policy_and_critic_gradients_are_clipped_apart(micro_policy, form):
    """`train.grad_clip` clips the policy's gradient and the critic's own parameters' gradient
    each on its own: a large critic gradient leaves the policy's step as it is (a joint clip
    scaled it down with the critic's)."""
    from agentrl_cli.train.learner import clip_grads

    model = copy.deepcopy(micro_policy[0])
    cfg = config.load(sets=MICRO + [f"model.critic={form}"], method="focus")
    learner = build_learner(cfg, model, log=lambda s: None)
    torch.manual_seed(0)
    for p in learner.model.parameters():
        p.grad = torch.randn_like(p)
    policy_norm = float(torch.linalg.vector_norm(
        torch.cat([p.grad.flatten() for p in learner.model.parameters()])))
    scale = 0.5 / policy_norm                               # the policy's norm: 0.5, under the clip
    for p in learner.model.parameters():
        p.grad.mul_(scale)
    for p in learner.critic.parameters():
        p.grad = torch.full_like(p, 10.0)                   # the critic's: far over it
    before = [p.grad.clone() for p in learner.model.parameters()]
    stats = clip_grads(learner, 1.0)
    assert stats["grad_norm"] == pytest.approx(0.5, rel=1e-4)
    assert stats["critic/grad_norm"] > 10.0
    assert all(torch.equal(a, p.grad) for a, p in zip(before, learner.model.parameters()))
    critic_after = torch.linalg.vector_norm(
        torch.cat([p.grad.flatten() for p in learner.critic.parameters()]))
    assert float(critic_after) == pytest.approx(1.0, rel=1e-3)


def test_a_ppo_step_logs_both_gradient_norms(micro_policy):
    learner, step = _ppo_steps(micro_policy, [])
    stats = step(1)
    assert stats["grad_norm"] > 0 and stats["critic/grad_norm"] > 0

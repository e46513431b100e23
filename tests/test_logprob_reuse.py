"""Old log-probs without a scoring pass (`train.old_logprobs=engine`): a single-pass update takes
the engine's log-probs where their gap to its own forward is within `train.logprob_tolerance`,
falls back to its own log-probs elsewhere, and gives the scored update's loss and gradients;
the scoring pass computes only what is still needed."""
from __future__ import annotations

import copy

import pytest
import torch
from conftest import MICRO

from agentrl_cli import config
from agentrl_cli.errors import ConfigError
from agentrl_cli.credit.estimators import ESTIMATORS
from agentrl_cli.train import learner as learner_mod
from agentrl_cli.train.batch import collate, microbatches

BASE = MICRO + ["train.grad_clip=0", "algo.whiten=false"]


def _episodes(micro_policy):
    from test_distributed import _global_episodes

    return _global_episodes(micro_policy)


def _step(micro_policy, eps, sets, method="grpo", engine_shift=None):
    """One update of a fresh learner on `eps` as the trainer's loop runs it; -> (stats,
    gradients, batch)."""
    model, _, fmt, _ = micro_policy
    cfg = config.load(method=method, sets=BASE + sets)
    learner = learner_mod.build_learner(cfg, copy.deepcopy(model), log=lambda s: None)
    batch = collate(copy.deepcopy(eps), fmt.pad_id)
    if engine_shift is not None:
        batch.engine_logprobs = batch.engine_logprobs + engine_shift * batch.response_mask
    learner_mod.score(learner, batch, cfg, deferred=True)
    c = ESTIMATORS.get(cfg.algo.estimator)(batch, cfg.algo)
    batch.advantages, batch.returns, batch.value_mask = c.advantages, c.returns, c.value_mask
    stats = learner_mod.update(learner, batch, cfg, step=1)
    return stats, [p.grad.clone() for p in learner.params], batch


@pytest.mark.parametrize("method", ["grpo", "ppo"])
def test_engine_logprobs_give_the_scored_update(micro_policy, method):
    eps = _episodes(micro_policy)
    s_eng, g_eng, b_eng = _step(micro_policy, eps, ["train.old_logprobs=engine"], method)
    s_sc, g_sc, b_sc = _step(micro_policy, eps, ["train.old_logprobs=score"], method)
    assert s_eng["old_logprobs/engine"] == 1.0 and s_sc["old_logprobs/engine"] == 0.0
    for k in ("loss/policy", "clipfrac", "ratio/mean"):
        assert s_eng[k] == pytest.approx(s_sc[k], rel=1e-5, abs=1e-6), k
    assert sum(float(g.abs().sum()) for g in g_sc) > 1e-3      # an update that moves
    for a, b in zip(g_eng, g_sc):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    # the batch keeps the trainer's log-probs (the step's logged gap reads them): the scoring
    # pass's values, from the update's own forward
    mask = b_sc.response_mask.bool()
    torch.testing.assert_close(b_eng.old_logprobs[mask], b_sc.old_logprobs[mask], atol=1e-6, rtol=0)
    gap = (b_eng.engine_logprobs - b_eng.old_logprobs)[mask].abs().mean()
    assert 0 < float(gap) < 1e-4          # the engine's are close, not the same numbers


def test_gap_over_tolerance_falls_back_to_the_trainers_own(micro_policy):
    eps = _episodes(micro_policy)
    # a 0.01 offset on every engine log-prob: over the default tolerance (1e-3)
    s_off, g_off, _ = _step(micro_policy, eps, ["train.old_logprobs=engine"], engine_shift=0.01)
    s_sc, g_sc, _ = _step(micro_policy, eps, ["train.old_logprobs=score"])
    assert s_off["old_logprobs/engine"] == 0.0
    assert s_off["loss/policy"] == pytest.approx(s_sc["loss/policy"], rel=1e-6, abs=1e-8)
    assert s_off["ratio/mean"] == 1.0                    # the trainer's own: ratio exactly 1
    for a, b in zip(g_off, g_sc):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-5)
    # a looser tolerance takes the shifted engine log-probs: ratios exp(-0.01), the update moves
    s_tol, g_tol, _ = _step(micro_policy, eps, ["train.old_logprobs=engine",
                                                "train.logprob_tolerance=0.05"], engine_shift=0.01)
    assert s_tol["old_logprobs/engine"] == 1.0
    assert s_tol["ratio/mean"] == pytest.approx(float(torch.exp(torch.tensor(-0.01))), rel=1e-4)


def test_the_decision_is_per_micro_batch(micro_policy):
    """Episodes in several micro-batches, the engine log-probs of some of them off: the metric
    is the share of policy tokens that used the engine's."""
    eps = _episodes(micro_policy)
    model, _, fmt, _ = micro_policy
    cfg = config.load(method="grpo", sets=BASE + ["train.old_logprobs=engine",
                                                  "train.max_tokens_per_microbatch=64"])
    learner = learner_mod.build_learner(cfg, copy.deepcopy(model), log=lambda s: None)
    batch = collate(copy.deepcopy(eps), fmt.pad_id)
    groups = microbatches(batch, 64)
    assert len(groups) >= 3
    off = groups[0]
    shift = torch.zeros(batch.size)
    shift[off] = 0.5
    batch.engine_logprobs = batch.engine_logprobs + shift[:, None] * batch.response_mask
    learner_mod.score(learner, batch, cfg, deferred=True)
    batch.advantages = ESTIMATORS.get("grpo")(batch, cfg.algo).advantages
    stats = learner_mod.update(learner, batch, cfg, step=1)
    tokens = batch.response_mask.sum(1)
    want = 1.0 - float(tokens[off].sum() / tokens.sum())
    assert 0.0 < want < 1.0
    assert stats["old_logprobs/engine"] == pytest.approx(want)


def test_scoring_pass_computes_only_what_is_left(micro_policy, monkeypatch):
    eps = _episodes(micro_policy)
    model, _, fmt, _ = micro_policy
    calls = []
    real = learner_mod.forward

    def counting(*a, **kw):
        calls.append(a[1] is not None)
        return real(*a, **kw)

    monkeypatch.setattr(learner_mod, "forward", counting)

    def scored(method, sets):
        cfg = config.load(method=method, sets=BASE + sets)
        learner = learner_mod.build_learner(cfg, copy.deepcopy(model), log=lambda s: None)
        batch = collate(copy.deepcopy(eps), fmt.pad_id)
        calls.clear()
        learner_mod.score(learner, batch, cfg, deferred=True)
        return batch, list(calls)

    b, c = scored("grpo", [])                        # auto = engine with the hf engine
    assert b.old_logprobs is None and b.old_values is None and c == []
    b, c = scored("ppo", [])                         # GAE reads the critic's values
    assert b.old_logprobs is None and b.old_values is not None and c and all(c)
    b, c = scored("focus", [])                       # FOCUS reads its critic in the trees
    assert b.old_values is None and c == []
    b, c = scored("focus", ["algo.value_clip=0.2"])  # value clipping needs the old values
    assert b.old_values is not None
    b, c = scored("trace", [])                       # no KL term: no reference log-probs
    assert b.ref_logprobs is None and c == []
    b, c = scored("grpo", ["algo.kl_coef=0.1"])
    assert b.ref_logprobs is not None
    b, c = scored("grpo", ["train.old_logprobs=score"])
    assert b.old_logprobs is not None
    b, c = scored("grpo", ["train.ppo_epochs=2"])   # a second pass: old log-probs scored first
    assert b.old_logprobs is not None


def test_auto_and_multi_pass(micro_policy):
    vllm = config.load(method="grpo", sets=MICRO + ["rollout.engine=vllm"])
    hf = config.load(method="grpo", sets=MICRO)
    assert learner_mod.engine_logprobs(hf) and not learner_mod.engine_logprobs(vllm)
    assert not learner_mod.engine_logprobs(config.load(method="grpo",
                                                sets=MICRO + ["train.minibatches=2"]))
    with pytest.raises(ConfigError, match="train.old_logprobs"):
        config.load(sets=MICRO + ["train.old_logprobs=trainer"])
    # an update asked to run twice over a batch without old log-probs refuses
    model, _, fmt, _ = micro_policy
    cfg = config.load(method="grpo", sets=MICRO + ["train.ppo_epochs=2"])
    learner = learner_mod.build_learner(cfg, copy.deepcopy(model), log=lambda s: None)
    batch = collate(copy.deepcopy(_episodes(micro_policy)), fmt.pad_id)
    batch.advantages = torch.zeros(batch.input_ids.shape)
    with pytest.raises(ValueError, match="multi-pass"):
        learner_mod.update(learner, batch, cfg, step=1)

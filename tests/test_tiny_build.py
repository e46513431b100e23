"""The tiny build's warm-up: checks on dev questions the demonstrations leave out, and the best
checkpoint kept."""
from __future__ import annotations

import random

import torch

from agentrl_cli.engines.hf import HFEngine
from agentrl_cli.models.tiny import TinyRecipe
from agentrl_cli.app import tiny_build


def test_dev_questions_are_never_demonstrated():
    recipe = TinyRecipe()
    spec = tiny_build.recipe_spec(recipe)
    train = spec.tasks("train")
    shown, dev = tiny_build._split_dev(recipe, train)
    assert len(dev) == recipe.dev_tasks and sorted(shown + dev, key=train.index) == train
    # spread through the split: both kinds of question (the split ends with 3-hop ones only)
    assert {t.meta["hops"] for t in dev} == {2, 3}
    (world, demo_tasks), = tiny_build._demo_worlds(recipe, spec)
    assert demo_tasks == shown
    assert not {t.prompt for t in dev} & {t.prompt for t in demo_tasks}
    # a small split gives at most a fifth of its questions to the checks
    assert len(tiny_build._split_dev(recipe, train[:20])[1]) == 4
    assert tiny_build._split_dev(TinyRecipe(dev_tasks=0), train) == (train, [])


def _scripted(monkeypatch, model, successes):
    """`_sft_step` writes the step number into one weight; `_success` returns `successes` in
    order, so the kept checkpoint is readable off that weight."""
    weight = next(model.parameters())
    steps = iter(range(1, 10**6))

    def sft_step(*args, **kwargs):
        with torch.no_grad():
            weight.view(-1)[0] = float(next(steps))
        return torch.tensor(0.0)

    checks = iter(successes)
    monkeypatch.setattr(tiny_build, "_sft_step", sft_step)
    monkeypatch.setattr(tiny_build, "_success", lambda *a, **k: next(checks))
    return weight


def _warm_up(model, fmt, spec, recipe, log=lambda s: None):
    demos = [None] * 32
    return tiny_build._warm_up(recipe, model, HFEngine(model, fmt.pad_id), fmt, spec, demos,
                               ["dev question"], random.Random(0), torch.Generator(), log)


def test_warm_up_keeps_the_best_dev_checkpoint(micro_policy, monkeypatch):
    model, _, fmt, spec = micro_policy
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        recipe = TinyRecipe(max_steps=10, eval_start=4, eval_every=2, batch_size=4, target_success=0.9)
        # checks at steps 4, 6, 8, 10: the best is step 6; a tie (step 8 later) keeps the later
        weight = _scripted(monkeypatch, model, [0.2, 0.5, 0.1, 0.3])
        step, dev, history = _warm_up(model, fmt, spec, recipe)
        assert (step, dev) == (6, 0.5) and float(weight.detach().view(-1)[0]) == 6.0
        assert [h["step"] for h in history] == [4, 6, 8, 10]
        weight = _scripted(monkeypatch, model, [0.2, 0.5, 0.5, 0.3])
        step, dev, _ = _warm_up(model, fmt, spec, recipe)
        assert (step, dev) == (8, 0.5) and float(weight.detach().view(-1)[0]) == 8.0
        # a check at `target_success` stops the warm-up there
        weight = _scripted(monkeypatch, model, [0.2, 0.95, 0.1, 0.3])
        step, dev, history = _warm_up(model, fmt, spec, recipe)
        assert (step, dev, len(history)) == (6, 0.95, 2) and float(weight.detach().view(-1)[0]) == 6.0
    finally:
        model.load_state_dict(saved)


def test_a_warm_up_that_never_reaches_its_target_says_so(micro_policy, monkeypatch):
    model, _, fmt, spec = micro_policy
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        recipe = TinyRecipe(max_steps=8, eval_start=4, eval_every=2, batch_size=4, target_success=0.3)
        said = []
        _scripted(monkeypatch, model, [0.1, 0.2, 0.15])
        step, dev, _ = _warm_up(model, fmt, spec, recipe, said.append)
        assert (step, dev) == (6, 0.2)
        warning, = [s for s in said if "warning" in s]
        assert "0.30" in warning and "best 0.20, step 6" in warning and "env.n_train" in warning
        # a build that reaches its target says nothing of the kind
        said.clear()
        _scripted(monkeypatch, model, [0.1, 0.35])
        _warm_up(model, fmt, spec, recipe, said.append)
        assert not [s for s in said if "warning" in s]
    finally:
        model.load_state_dict(saved)


def test_a_check_far_above_the_target_goes_back_to_a_snapshot_in_the_band(micro_policy, monkeypatch):
    """A small env learnt in a few steps: the stopping check is above the ceiling (0.5), so the
    warm-up bisects the snapshots since the check before and keeps the one nearest
    [target_success, 0.5]; when none is under the ceiling it keeps the earliest and says what to
    try."""
    model, _, fmt, spec = micro_policy
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        recipe = TinyRecipe(max_steps=10, eval_start=8, eval_every=8, batch_size=4, target_success=0.3)
        # snapshots at steps 1-7; the check at 8 gives 0.9, then the bisection asks step 4
        # (0.7: too good), step 2 (0.2: too weak), step 3 (0.4: in the band)
        weight = _scripted(monkeypatch, model, [0.9, 0.7, 0.2, 0.4])
        said = []
        step, dev, history = _warm_up(model, fmt, spec, recipe, said.append)
        assert (step, dev) == (3, 0.4) and float(weight.detach().view(-1)[0]) == 3.0
        assert [h["step"] for h in history] == [8, 4, 2, 3]
        assert any("above 0.50" in s for s in said) and not any("note" in s for s in said)
        # every snapshot too good: the earliest asked is kept, with the one line of what to try
        weight = _scripted(monkeypatch, model, [0.9, 0.8, 0.7, 0.6])
        said.clear()
        step, dev, _ = _warm_up(model, fmt, spec, recipe, said.append)
        assert (step, dev) == (1, 0.6) and float(weight.detach().view(-1)[0]) == 1.0
        note, = [s for s in said if "note" in s]
        assert "model.tiny_error_rate" in note
        # a target above the ceiling is the user's: the check that reaches it is kept
        weight = _scripted(monkeypatch, model, [0.9])
        step, dev, history = _warm_up(model, fmt, spec, TinyRecipe(
            max_steps=10, eval_start=8, eval_every=8, batch_size=4, target_success=0.8))
        assert (step, dev, len(history)) == (8, 0.9, 1)
    finally:
        model.load_state_dict(saved)

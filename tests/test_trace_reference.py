"""TRACE's preparer: batched reference log-probs of the gold answer after every boundary equal
one-prefix-at-a-time forward passes of the full model."""
from __future__ import annotations

import copy

import pytest
import torch

from conftest import MICRO
from agentrl_cli import config
from agentrl_cli.credit.estimators import TraceReference
from agentrl_cli.errors import ConfigError
from agentrl_cli.engines.hf import HFEngine
from agentrl_cli.engines.base import SamplingParams
from agentrl_cli.rollout.runner import run_episodes
from agentrl_cli.train.batch import collate
from agentrl_cli.train.prepare import PREPARERS
from agentrl_cli.train.prepare.trace_reference import answer_mean_logprobs




class _Learner:
    def __init__(self, reference):
        self.reference = reference


@pytest.fixture(scope="module")
def episodes(micro_policy):
    model, _, fmt, spec = micro_policy
    pairs = [(t, i // 2) for i, t in enumerate(spec.tasks("train", 3)) for _ in range(2)]
    eps = run_episodes(HFEngine(model, fmt.pad_id), fmt, spec, pairs,
                       SamplingParams(max_new_tokens=6), 512, 6, torch.Generator().manual_seed(1))
    assert max(e.num_turns for e in eps) >= 2
    return eps


def _one_at_a_time(model, prefix, answer):
    ids = torch.tensor([prefix + answer])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    n = len(prefix)
    return float(torch.stack([logp[n + j - 1, t] for j, t in enumerate(answer)]).mean())


@pytest.mark.parametrize("budget", [150])  # several micro-batches of a few rows
def test_batched_reference_logprobs_equal_single_passes(micro_policy, episodes, budget):
    model, _, fmt, _ = micro_policy
    reference = copy.deepcopy(model).eval()
    cfg = config.load(method="trace", sets=MICRO + [f"train.max_tokens_per_microbatch={budget}"])
    batch = collate(episodes, fmt.pad_id)
    PREPARERS.get("trace")(_Learner(reference), batch, episodes, fmt, cfg)
    table, num_turns = batch.payload.get(TraceReference).mean_logprobs, batch.payload.get(TraceReference).num_turns
    assert num_turns.tolist() == [e.num_turns for e in episodes]
    assert table.shape == (len(episodes), max(e.num_turns for e in episodes))
    for b, ep in enumerate(episodes):
        answer = fmt.encode(f"answer({ep.answer})")
        for k, turn in enumerate(ep.turns):
            expect = _one_at_a_time(reference, ep.token_ids[:turn.start], answer)
            assert table[b, k].item() == pytest.approx(expect, abs=1e-4)
        assert bool((table[b, ep.num_turns:] == 0).all())
    # the states differ, so the reference's confidence differs across boundaries
    assert len({round(x, 5) for x in table[table != 0].tolist()}) > 1


def test_microbatches_respect_the_token_budget(micro_policy, monkeypatch):
    model, _, fmt, _ = micro_policy
    import agentrl_cli.train.prepare.trace_reference as tr

    shapes = []
    real = tr.hidden_states

    def spy(m, ids, attn):
        shapes.append(tuple(ids.shape))
        return real(m, ids, attn)

    monkeypatch.setattr(tr, "hidden_states", spy)
    rows = [[5] * n for n in (3, 9, 4, 12, 7, 30)]
    out = answer_mean_logprobs(model, rows, [1] * len(rows), fmt.pad_id, max_tokens=24)
    assert len(out) == 6 and sum(b for b, _ in shapes) == 6
    assert all(b * w <= 24 or b == 1 for b, w in shapes)
    assert len(shapes) > 1


def test_trace_needs_a_reference(micro_policy, episodes):
    _, _, fmt, _ = micro_policy
    cfg = config.load(method="trace", sets=MICRO)
    with pytest.raises(ConfigError):
        PREPARERS.get("trace")(_Learner(None), collate(episodes, fmt.pad_id), episodes, fmt, cfg)

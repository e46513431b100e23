"""The CUDA paths of the product: sampling with per-episode CPU generators on GPU logits, and
every method's training step on a GPU (the batch is built on the CPU and moved per micro-batch).

The `gpu`-marked tests run only with a GPU and `AGENTRL_TEST_CUDA=1` (conftest hides CUDA from
the CPU suite): `AGENTRL_TEST_CUDA=1 python -m pytest -m gpu tests/test_cuda.py`. The inverse-CDF
sampler they rely on is tested here on the CPU too.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from agentrl_cli import config
from agentrl_cli.engines.sampling import inverse_cdf, sample, sample_rows
from agentrl_cli.engines.base import SamplingParams

from conftest import MICRO

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="needs CUDA (and AGENTRL_TEST_CUDA=1)")


def test_inverse_cdf_follows_the_probabilities_and_skips_zero_mass():
    probs = torch.tensor([[0.0, 0.1, 0.0, 0.6, 0.3, 0.0]] * 4, dtype=torch.float64)
    u = torch.tensor([0.0, 0.0999, 0.1001, 0.999999])
    assert inverse_cdf(probs, u).tolist() == [1, 1, 3, 4]
    n = 200_000
    g = torch.Generator().manual_seed(0)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    toks = inverse_cdf(probs[:1].expand(n, -1) * 7.0, u)  # unnormalised mass is fine
    freq = torch.bincount(toks, minlength=6).double() / n
    sd = (probs[0] * (1 - probs[0]) / n).sqrt()
    assert bool(((freq - probs[0]).abs() <= 5 * sd + 1e-12).all()), freq
    assert freq[[0, 2, 5]].sum() == 0


def test_inverse_cdf_matches_multinomial_in_distribution_under_top_p():
    from agentrl_cli.engines.sampling import _sampling_probs

    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(3))
    params = SamplingParams(temperature=0.7, top_p=0.8)
    _, probs = _sampling_probs(logits, params)
    n = 100_000
    u = torch.rand(n, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ours = torch.bincount(inverse_cdf(probs.expand(n, -1), u), minlength=50).double() / n
    ref = torch.bincount(torch.multinomial(probs[0], n, replacement=True,
                                           generator=torch.Generator().manual_seed(2)),
                         minlength=50).double() / n
    assert bool((ours[probs[0] == 0] == 0).all())
    assert float((ours - ref).abs().max()) < 0.01


@pytest.mark.gpu
@cuda_only
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_cuda_rows_sample_from_their_own_generators(top_p):
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(0)).cuda()
    params = SamplingParams(temperature=1.0, top_p=top_p)
    gens = lambda: [torch.Generator().manual_seed(100 + i) for i in range(6)]
    tok, lp = sample_rows(logits, params, gens())
    assert tok.device.type == "cuda"
    # the same row alone, with the same generator: the same token (rows are independent)
    alone = [sample(logits[i:i + 1], params, g)[0].item() for i, g in enumerate(gens())]
    assert tok.tolist() == alone
    # and the same token the CPU inverse CDF gives for that generator's uniform
    from agentrl_cli.engines.sampling import _sampling_probs

    _, probs = _sampling_probs(logits.float().cpu(), params)
    u = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in gens()])
    assert tok.tolist() == inverse_cdf(probs, u).tolist()
    ref = torch.log_softmax(logits.float(), -1).gather(-1, tok[:, None]).squeeze(-1)
    torch.testing.assert_close(lp, ref)


CUDA_E2E = MICRO + ["model.device=cuda", "rollout.max_new_tokens=6", "train.steps=2",
                    "train.eval_every=0", "train.save_every=1", "train.eval_tasks=2",
                    "algo.vine_k=2", "algo.dynamic_rounds=1"]


@pytest.mark.gpu
@cuda_only
@pytest.mark.parametrize("method", ["grpo", "dr_grpo", "rloo", "dapo", "gspo", "ppo", "vineppo",
                                    "mpo", "trace", "focus", "focus:model.critic=separate",
                                    "ppo:model.critic=detached"])
def test_every_method_trains_on_cuda(method, tmp_path):
    """Two steps on the GPU: finite losses, and the engine's log-probs (sampled on the GPU) agree
    with the trainer's (scored on the GPU from the CPU-built batch). `method:KEY=VALUE` adds an
    override (mpo's recipe already has a separate critic; focus reads it inside its trees)."""
    from agentrl_cli.app.train import train

    method, *extra = method.split(":")
    cfg = config.load(method=method, sets=CUDA_E2E + extra)
    summary = train(cfg, tmp_path, log=lambda s: None)
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert len(steps) == 2 and summary["steps"] == 2
    for r in steps:
        assert math.isfinite(r["loss/policy"])
        assert r["rollout/logprob_gap"] < 1e-3, r["rollout/logprob_gap"]
        if "loss/critic" in r:
            assert math.isfinite(r["loss/critic"])


@pytest.mark.gpu
@cuda_only
def test_cuda_run_resumes_and_evaluates(tmp_path):
    """Resume a GPU run from its step-1 checkpoint (optimiser state back on the GPU) and evaluate
    the result with `agentrl eval --checkpoint` on the GPU."""
    from typer.testing import CliRunner

    from agentrl_cli.cli.main import app
    from agentrl_cli.train import checkpoint
    from agentrl_cli.app.train import train

    cfg = config.load(method="ppo", sets=CUDA_E2E)
    train(cfg, tmp_path / "a", log=lambda s: None)
    full = [json.loads(l) for l in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    train(cfg, tmp_path / "a", resume=str(checkpoint.step_dir(tmp_path / "a", 1)), log=lambda s: None)
    again = [json.loads(l) for l in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in again] == [r["step"] for r in full]
    args = ["eval", "--checkpoint", str(tmp_path / "a"), "--tasks", "2"]
    for s in MICRO + ["model.device=cuda"]:
        args += ["--set", s]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output

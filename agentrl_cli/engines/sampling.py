"""Sampling for the `hf` engine: tokens and their log-probs from next-token logits under
`SamplingParams` (temperature, top-p, greedy), for one generator per batch (`sample`) or one per
row (`sample_rows`, vectorised through `inverse_cdf`)."""
from __future__ import annotations

from typing import Sequence

import torch

from .base import SamplingParams


def _sampling_probs(logits: torch.Tensor, params: SamplingParams):
    """-> (log-probs under softmax(logits / temperature), the probabilities to sample from:
    the same, with the nucleus filter applied when top_p < 1)."""
    logp = torch.log_softmax(logits / params.temperature, dim=-1)
    probs = logp.exp()
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        keep = (sorted_p.cumsum(-1) - sorted_p) < params.top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
    return logp, probs


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None):
    """logits [R, V] -> (tokens [R], logprobs [R]) under softmax(logits / temperature)."""
    logits = logits.float()
    if params.greedy:
        logp = torch.log_softmax(logits, dim=-1)
        tok = logp.argmax(-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
    if generator is not None and generator.device != logits.device:
        # a CPU generator (the per-episode ones) with logits on an accelerator: one uniform
        # per row from the generator, inverted through the CDF on the device
        u = torch.rand(logits.shape[0], generator=generator, dtype=torch.float64)
        return _sample_uniforms(logits, params, u)
    logp, probs = _sampling_probs(logits, params)
    tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def _sample_uniforms(logits: torch.Tensor, params: SamplingParams, u: torch.Tensor):
    """(tokens, log-probs) of float logits [R, V], row r drawn by `inverse_cdf` from u[r]."""
    logp, probs = _sampling_probs(logits, params)
    tok = inverse_cdf(probs, u)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """probs [R, V] (unnormalised, >= 0), u [R] uniforms in [0, 1) -> tokens [R]: the first
    token whose cumulative mass exceeds u x the row's total. Tokens of zero mass are never
    chosen (their cumulative sum does not rise past any threshold)."""
    cdf = probs.double().cumsum(-1)
    target = (u.to(cdf.device, torch.float64) * cdf[:, -1])[:, None]
    tok = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return tok.clamp_(max=probs.shape[-1] - 1)


def sample_rows(logits: torch.Tensor, params: SamplingParams,
                generators: Sequence[torch.Generator | None]):
    """Like `sample`, but row i draws from its own `generators[i]`: each row's tokens then depend
    only on its own logits and generator, never on which other rows share the batch (what an
    asynchronous scheduler needs for reproducible episodes).

    Each row draws one uniform from its own generator and the whole batch is sampled at once by
    `inverse_cdf` (on the logits' device): one vectorised draw instead of one softmax and
    `torch.multinomial` call per row (which cost a FOCUS rollout a sixth of its CPU time). A
    row without a generator draws from the default one."""
    if params.greedy:
        return sample(logits, params, None)
    u = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in generators])
    return _sample_uniforms(logits.float(), params, u)

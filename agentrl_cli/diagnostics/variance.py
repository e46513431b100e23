"""MPO's variance decomposition of the critic within an episode (docs/methods.md).

For one episode with critic values `V_{t,i}` at the policy tokens of each turn t, weighting
every token equally (token-weighted), the total variance around the episode's token mean splits
exactly into between-turn variance (of the turn means, each weighted by its token count) and
within-turn variance (the token-weighted mean of each turn's variance around its own mean):
`total = between + within`. MPO reports the median share `between / total` over trajectories
(89.5% in the paper) and the share of trajectories with `between > within` (93.8%): the critic
mostly changes from turn to turn, so turn-level credit loses little.

Episodes with one turn (no between-turn variance to speak of) or a constant critic (total 0)
are left out of both statistics and counted separately.
"""
from __future__ import annotations

from typing import Sequence

from ..errors import ConfigError
from ..config import RunConfig
from .audit import median
from .mc import critic_at_tokens, load_checkpoint_policy, sample_episodes


def decompose(turn_values: Sequence[Sequence[float]]) -> tuple[float, float, float]:
    """(total, between, within) token-weighted variances of one episode's critic values."""
    turns = [list(t) for t in turn_values if len(t)]
    n = sum(len(t) for t in turns)
    if n == 0:
        return 0.0, 0.0, 0.0
    mean = sum(sum(t) for t in turns) / n
    total = sum((v - mean) ** 2 for t in turns for v in t) / n
    between = within = 0.0
    for t in turns:
        m = sum(t) / len(t)
        between += len(t) * (m - mean) ** 2 / n
        within += sum((v - m) ** 2 for v in t) / n
    return total, between, within


def summarize(episodes_values: Sequence[Sequence[Sequence[float]]], tol: float = 1e-12) -> dict:
    """MPO's two statistics over episodes (see the module docstring)."""
    shares, dominates, single, flat = [], [], 0, 0
    for ep in episodes_values:
        if sum(1 for t in ep if len(t)) < 2:
            single += 1
            continue
        total, between, within = decompose(ep)
        if total <= tol:
            flat += 1
            continue
        shares.append(between / total)
        dominates.append(between > within)
    return {
        "episodes": len(episodes_values), "used": len(shares), "single_turn": single,
        "constant_critic": flat,
        "median_between_share": median(shares) if shares else None,
        "share_between_exceeds_within": sum(dominates) / len(dominates) if dominates else None,
        "shares": shares,
    }


def variance_report(cfg: RunConfig, checkpoint, episodes: int = 64, seed: int = 0) -> dict:
    """Sample `episodes` episodes (one per held-out task, cycling if there are fewer tasks) with
    the checkpoint's policy and decompose its critic's values on them."""
    pol = load_checkpoint_policy(cfg, checkpoint)
    if pol.critic is None:
        raise ConfigError(f"{pol.name} has no critic (value head): the variance decomposition "
                          "needs a method that trains one (ppo, mpo, focus)")
    tasks = pol.spec.tasks("eval")
    pairs = [(tasks[i % len(tasks)], i) for i in range(episodes)]
    eps, _ = sample_episodes(pol, pairs, seed)
    out = summarize(critic_at_tokens(pol, eps))
    out.update(checkpoint=pol.name, mean_turns=sum(e.num_turns for e in eps) / len(eps),
               success=sum(e.success for e in eps) / len(eps))
    return out

"""Critic ranking over training (docs/methods.md): does the critic order states the way their
Monte-Carlo values do?

Per checkpoint `checkpoints/step-N/` of a run that trains a critic: `episodes` episodes on the
first held-out tasks (one each, the same tasks and seed at every checkpoint), every
segment-boundary state s_k of them (k = 0..T-1), `continuations` fresh continuations from each
state with that checkpoint's policy (MCTS-style targets: their mean reward), and the Spearman
rank correlation between the critic's V(s_k) and those targets over all the states.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..errors import ConfigError
from ..config import RunConfig
from ..metrics import spearman
from ..train.checkpoint import STATE_FILE, find
from .mc import continue_from, critic_at_states, load_checkpoint_policy, sample_episodes


def run_checkpoints(run: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every checkpoint of a run, by step."""
    root = Path(run) / "checkpoints"
    out = []
    for d in sorted(root.glob("step-*")) if root.is_dir() else []:
        if (d / STATE_FILE).is_file():
            try:
                out.append((int(d.name.split("-", 1)[1]), d))
            except ValueError:
                continue
    if not out:
        raise ConfigError(f"no checkpoints in {run} (expected {root}/step-N/)")
    return sorted(out)


def rank_checkpoint(cfg: RunConfig, ckpt: Path, episodes: int, continuations: int, seed: int) -> dict:
    pol = load_checkpoint_policy(cfg, ckpt)
    if pol.critic is None:
        raise ConfigError(f"{ckpt} has no critic (value head): critic ranking needs a method that "
                          "trains one (ppo, mpo, focus)")
    tasks = pol.spec.tasks("eval", episodes)
    eps, states = sample_episodes(pol, [(t, g) for g, t in enumerate(tasks)], seed)
    flat = [s for row in states for s in row]
    conts = continue_from(pol, flat, continuations, seed + 1)
    targets = [sum(e.reward for e in c) / len(c) for c in conts]
    critic = [v for row in critic_at_states(pol, eps) for v in row]
    n = len(flat)
    return {
        "checkpoint": str(ckpt), "states": n, "spearman": spearman(critic, targets),
        "mean_critic": sum(critic) / n, "mean_target": sum(targets) / n,
        "mae": sum(abs(a - b) for a, b in zip(critic, targets)) / n,
        "episode_success": sum(e.success for e in eps) / len(eps),
        "critic": critic, "targets": targets,
    }


def critic_rank(cfg: RunConfig, run: Path, episodes: int = 8, continuations: int = 16,
                seed: int = 0, log: Callable[[str], None] = lambda s: None) -> dict:
    """Spearman correlation of critic and Monte-Carlo values at every checkpoint of `run`."""
    rows = []
    ckpts = [(step, find(c, log)) for step, c in run_checkpoints(run)]  # all verified first
    for step, ckpt in ckpts:
        row = {"step": step, **rank_checkpoint(cfg, ckpt, episodes, continuations, seed)}
        rho = row["spearman"]
        log(f"step {step}: spearman {'n/a' if rho is None else f'{rho:.3f}'} over {row['states']} states")
        rows.append(row)
    return {"run": str(run), "episodes": episodes, "continuations": continuations, "seed": seed,
            "checkpoints": rows}

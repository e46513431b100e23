"""The recipes. A method = rollout controller + advantage estimator + loss + what it needs
(critic, reference model, extra rollouts) + its paper's defaults. The trainer never branches on
a method's name: it reads these fields. Every default can be overridden with `--set`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .registry import Registry


@dataclass(frozen=True)
class Recipe:
    name: str
    summary: str                  # one line for the README / --help
    defaults: dict = field(default_factory=dict)  # dotted config overrides (algo.*, rollout.*)
    critic: bool = False          # trains a value function
    reference: bool = False       # needs a frozen copy of the initial policy
    extra_rollouts: str = ""      # what extra generation (or forward passes) it spends, for the README table
    # starts from the tiny build's fitted value head (`app.tiny_build.fit_value_head`). That
    # head is fitted on turn-start states only, so only credit that reads the critic at segment
    # boundaries (FOCUS) may start from it; token-level GAE (ppo) and MPO's intra-turn trace read
    # it at every policy token, where the fit does not hold (measured: critic loss 0.76 at PPO's
    # first step vs 0.17-0.25 for the constant 0.5), so they start cold.
    warm_critic: bool = False


METHODS: Registry[Recipe] = Registry("method")


def _add(r: Recipe) -> None:
    METHODS.register(r.name, r)


_add(Recipe(
    "grpo", "group-normalised outcome advantage, token-mean PPO-clip",
    {"algo.estimator": "grpo", "algo.loss": "ppo_clip", "algo.controller": "linear"},
))

_add(Recipe(
    "dr_grpo", "GRPO without the std division (Dr. GRPO), PPO-clip summed over tokens / a constant",
    # token-sum-norm: masked sum / (episodes x algo.agg_norm), the divisor being the run's
    # per-episode generation cap when agg_norm is 0 (TRL's loss_type="dr_grpo")
    {"algo.estimator": "dr_grpo", "algo.std_normalize": False, "algo.loss": "ppo_clip",
     "algo.controller": "linear", "algo.agg": "token-sum-norm"},
))
_add(Recipe(
    "rloo", "leave-one-out baseline R_i - mean_{j!=i} R_j, token-mean PPO-clip",
    {"algo.estimator": "rloo", "algo.loss": "ppo_clip", "algo.controller": "linear"},
))
_add(Recipe(
    "dapo", "GRPO + clip-higher, dynamic sampling, overlong shaping, token-mean",
    {"algo.estimator": "grpo", "algo.loss": "ppo_clip", "algo.controller": "linear",
     "algo.eps_low": 0.2, "algo.eps_high": 0.28, "algo.dynamic_sampling": True,
     "algo.overlong_shaping": True, "algo.agg": "token-mean"},
    extra_rollouts="refill groups dropped by dynamic sampling (up to algo.dynamic_rounds rounds)",
))
_add(Recipe(
    "gspo", "GRPO advantage with a clipped sequence-level ratio, sequence-mean",
    {"algo.estimator": "grpo", "algo.loss": "gspo", "algo.controller": "linear",
     "algo.eps_low": 3e-4, "algo.eps_high": 4e-4, "algo.agg": "seq-mean"},
))
_add(Recipe(
    "ppo", "token-level GAE on a value head (gamma 1, lam 1), whitened, PPO-clip, critic warm-up",
    # lam 1 (verl's default) and a critic warm-up, not the paper's lam 0.95: with lam < 1 the
    # critic's own value differences become credit, and on the built-in agent every lam 0.95
    # variant (cold, warm, detached + warm-up) drifted into long episodes and collapsed
    # (docs/results.md, "Recipe departures and their evidence"); `--set algo.lam=0.95` restores it.
    {"algo.estimator": "gae", "algo.loss": "ppo_clip", "algo.controller": "linear",
     "algo.gamma": 1.0, "algo.lam": 1.0, "algo.whiten": True, "train.critic_warmup": 10},
    critic=True,
))
_add(Recipe(
    "vineppo", "Monte-Carlo values from K continuations per segment boundary, segment TD, PPO-clip",
    {"algo.estimator": "vine", "algo.loss": "ppo_clip", "algo.controller": "vine",
     "algo.gamma": 1.0},
    extra_rollouts="algo.vine_k continuations per segment boundary (paper: 9), values only",
))
_add(Recipe(
    "mpo", "turn-level GAE + centred intra-turn trace on a critic, turn-level ratio",
    {"algo.estimator": "mpo", "algo.loss": "turn_ratio", "algo.controller": "linear",
     "algo.lam": 0.8, "algo.lam_intra": 0.95, "algo.beta": 1.0, "algo.whiten": True,
     # trainer settings, not MPO ones (docs/results.md, "Recipe departures and their evidence"): with a
     # value head on the policy's backbone seed 2 degenerated into long episodes with or
     # without warm-up; a separate critic model (verl's PPO critic) learns on seeds 0/1/2
     # (+9.6/+12.5/+9.6). `--set model.critic=head` gives the shared head back.
     "train.critic_warmup": 10, "model.critic": "separate"},
    critic=True,
))
_add(Recipe(
    "trace", "GRPO outcome advantage + turn credit from a frozen reference's gold-answer log-probs",
    {"algo.estimator": "trace", "algo.loss": "ppo_clip", "algo.controller": "linear",
     "algo.trace_eps": 0.1, "algo.trace_k": 3, "algo.gamma_td": 0.8, "algo.lambda_term": 2.0,
     "algo.alpha_out": 1.0, "algo.alpha_turn": 0.2},
    reference=True,  # extra compute: one teacher-forced reference pass per tool-call boundary
))
_add(Recipe(
    "focus", "tree rollouts branching where the critic is most wrong, refined-value TD(1) credit, PPO-clip",
    {"algo.estimator": "focus", "algo.loss": "ppo_clip", "algo.controller": "focus",
     # focus_lam 1 (each segment's advantage is R - V~(s_k)), not the paper's TD(0): with the
     # built-in agent's weak critic, TD(0) put a failed path's credit on its last segments and
     # the policy learned to postpone answering (docs/results.md); `--set
     # algo.focus_lam=0` restores it, and the paper-scale experiments/focus-*.yaml pin it.
     "algo.gamma": 1.0, "algo.focus_lam": 1.0, "algo.kappa": 1.0, "algo.focus_max_inflight": 2,
     # focus_norm: the paper's raw residuals (the config default, none). Per-tree normalisation
     # (`--set algo.focus_norm=tree`) was the recipe while the critic sat on the policy's
     # backbone; with the detached critic it no longer earns its place (level with none, three
     # seeds: docs/results.md, "The paper's own credit, re-tested").
     # the critic's loss kept out of the policy's backbone (a value head reading the policy's
     # features): on the shared backbone the critic's gradient was 5-7x the policy's and steered
     # the policy's features, and FOCUS learned 3-4 points behind GRPO (docs/results.md);
     # `--set model.critic=head` gives the shared head back.
     "model.critic": "detached",
     # the budget is what FOCUS allocates: by default a GRPO step's worth (rollout.budget_match)
     "rollout.budget_match": True},
    critic=True, warm_critic=True,
    extra_rollouts="none beyond the budget: continuations from tree nodes replace independent episodes",
))

_add(Recipe(
    "tree_grpo", "Tree-GRPO: trees with random expansion at turn boundaries, intra- + inter-tree group-relative leaf advantages, no critic, PPO-clip",
    # Tree-GRPO (arXiv 2509.21240) on the FOCUS tree engine: the controller's random allocator
    # expands a uniformly drawn node of the step's trees (a turn-boundary state) until the
    # budget is spent; the root episodes are the paper's M initial chains. Credit is
    # `credit.tree_grpo`. The budget is a GRPO step's, as for FOCUS (rollout.budget_match).
    {"algo.estimator": "tree_grpo", "algo.loss": "ppo_clip", "algo.controller": "focus",
     "algo.focus_allocator": "random", "algo.focus_max_inflight": 2, "rollout.budget_match": True},
    extra_rollouts="none beyond the budget: continuations from random tree nodes replace independent episodes",
))

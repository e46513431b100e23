"""Credit assignment: pure tensor math turning rewards (and critic or reference-model signals)
into advantages.

Unbatched, readable reference definitions (the public math API):
`grpo_advantages`, `rloo_advantages`, `gae`, `segment_td_advantages`, `mpo_advantages`,
`trace_turn_rewards`, `focus_gain`, `refine_values`.
Batched token-level versions used by the trainer live in `credit.batched` and are re-exported
here; they agree with the references exactly (see tests/test_credit.py).
"""
from .batched import (
    broadcast_turn_values,
    gae_token_advantages,
    grpo_episode_advantages,
    grpo_token_advantages,
    masked_mean,
    masked_whiten,
    mpo_token_advantages,
    rloo_token_advantages,
    trace_token_advantages,
)
from .focus import calibrated_mse, focus_gain, refine_values
from .gae import gae, segment_td_advantages
from .mpo import mpo_advantages
from .outcome import grpo_advantages, rloo_advantages
from .trace import trace_turn_rewards
from . import estimators, focus_credit, tree_grpo  # noqa: F401  (the estimators register themselves)

__all__ = [
    "broadcast_turn_values",
    "calibrated_mse",
    "focus_gain",
    "gae",
    "gae_token_advantages",
    "grpo_advantages",
    "grpo_episode_advantages",
    "grpo_token_advantages",
    "masked_mean",
    "masked_whiten",
    "mpo_advantages",
    "mpo_token_advantages",
    "refine_values",
    "rloo_advantages",
    "rloo_token_advantages",
    "segment_td_advantages",
    "trace_token_advantages",
    "trace_turn_rewards",
]

"""The critic V(s) of the methods that train one (ppo, mpo, focus): `model.critic` picks its form.

- `head`: a linear value head on the policy's last hidden states, trained with the policy (the
  critic loss reaches the shared backbone). Cheapest: no extra forward pass.
- `detached`: the same head, its loss kept out of the backbone (a probe of the policy's features).
- `separate`: its own transformer, a copy of the initial policy, plus a linear head, as verl's
  and OpenRLHF's PPO critics are. It costs a second forward/backward per micro-batch and the
  memory of a second model (its LM head is kept but unused), and the policy and the critic share
  nothing after step 0: the critic's loss cannot move the policy's features, and the policy's
  update cannot move the critic's.

Every form is an `nn.Module` whose `forward(h)` maps hidden states [..., H] to values [..., 1];
`critic_hidden` says which hidden states: the policy's, or (separate) the critic's own forward
over the same token ids. Checkpoints store the module's `state_dict` under `value_head`;
`critic_from_state` rebuilds the right form from its keys.
"""
from __future__ import annotations

import copy

import torch

from .sequences import hidden_states

CRITIC_FORMS = ("head", "detached", "separate")


class ValueHead(torch.nn.Linear):
    """`model.critic=head`: values from the policy's hidden states, trained with the policy."""

    separate = False

    def __init__(self, hidden_size: int):
        super().__init__(hidden_size, 1)


class DetachedValueHead(ValueHead):
    """`model.critic=detached`: a linear value head on the policy's hidden states whose
    regression loss does not reach the backbone (a probe of the policy's features; the critic
    cannot pull the shared features away from what the policy needs)."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return super().forward(h.detach())


class SeparateCritic(torch.nn.Module):
    """`model.critic=separate`: a copy of the initial policy (`model`), or with `copy=False`
    `model` itself (a critic loaded from `model.critic_path`), with a linear value head on its
    last hidden states. `forward(h)` takes the hidden states of `self.model` (`critic_hidden`
    computes them)."""

    separate = True

    def __init__(self, model: torch.nn.Module, copy_model: bool = True):
        super().__init__()
        self.model = copy.deepcopy(model) if copy_model else model
        self.head = torch.nn.Linear(model.config.hidden_size, 1)
        self.head.to(next(self.model.parameters()).device)

    @property
    def weight(self) -> torch.Tensor:  # the head's, so init and warm starts treat all forms alike
        return self.head.weight

    @property
    def bias(self) -> torch.Tensor:
        return self.head.bias

    def load_head(self, state: dict) -> None:
        """Load a `head`-form state (`weight`, `bias`) into the value head: the tiny build's
        fitted head reads the initial policy's features, which this copy starts from."""
        self.head.load_state_dict(state)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(h)


def build_critic(form: str, model: torch.nn.Module,
                 base: torch.nn.Module | None = None) -> torch.nn.Module:
    """A fresh critic of `form` for `model` (value head initialised to 0 weight, 0.5 bias:
    V = 0.5 everywhere, the prior of a 0/1 reward). `base`: a separate critic's own model
    (`model.critic_path`), used as it is instead of a copy of `model`."""
    if form not in CRITIC_FORMS:
        raise ValueError(f"model.critic must be one of {', '.join(CRITIC_FORMS)}, got '{form}'")
    if form == "separate":
        critic = SeparateCritic(model) if base is None else SeparateCritic(base, copy_model=False)
    else:
        critic = (DetachedValueHead if form == "detached" else ValueHead)(model.config.hidden_size)
        critic.to(next(model.parameters()).device)
    with torch.no_grad():
        critic.weight.zero_()
        critic.bias.fill_(0.5)
    return critic


def load_head_state(critic: torch.nn.Module, state: dict) -> None:
    """A fitted `head`-form state into any form (a separate critic takes it as its head)."""
    if is_separate(critic):
        critic.load_head(state)
    else:
        critic.load_state_dict(state)


def critic_from_state(state: dict, model: torch.nn.Module,
                      config: dict | None = None) -> torch.nn.Module:
    """Rebuild a checkpoint's critic (the `value_head` entry) next to `model`, in eval mode. A
    separate critic's state names its own model's weights (`model.*`), a head's only
    `weight`/`bias`; a detached head loads as a plain head (the same values). `config` (the
    checkpoint's `critic_config`): a separate critic's architecture when it is not the
    policy's (`model.critic_path`)."""
    if any(k.startswith("model.") for k in state):
        if config is None:
            critic = SeparateCritic(model)
        else:
            # deferred: transformers takes seconds to import
            from transformers import AutoConfig, AutoModelForCausalLM

            conf = dict(config)
            arch = AutoConfig.for_model(conf.pop("model_type"), **conf)
            base = AutoModelForCausalLM.from_config(arch)
            base.to(next(model.parameters()).dtype)
            critic = SeparateCritic(base, copy_model=False)
    else:
        critic = ValueHead(model.config.hidden_size)
    critic.load_state_dict(state)
    critic.to(next(model.parameters()).device)
    return critic.eval()


def critic_from_checkpoint(state: dict, model: torch.nn.Module) -> torch.nn.Module | None:
    """The critic of a loaded checkpoint state (`train.checkpoint.load_state`), rebuilt next to
    `model` (`critic_from_state`), or None for a critic-free method."""
    if state.get("value_head") is None:
        return None
    return critic_from_state(state["value_head"], model, state.get("critic_config"))


def critic_config(critic: torch.nn.Module | None) -> dict | None:
    """What a checkpoint stores to rebuild a separate critic's architecture (else None)."""
    return critic.model.config.to_dict() if is_separate(critic) else None


def is_separate(critic: torch.nn.Module | None) -> bool:
    """Whether `critic` reads its own model's hidden states (any other module is a head)."""
    return bool(getattr(critic, "separate", False))


def critic_hidden(critic: torch.nn.Module, h: torch.Tensor | None, ids: torch.Tensor,
                  attn: torch.Tensor, window: torch.Tensor | None = None) -> torch.Tensor:
    """The hidden states [B, L, H] the critic reads for a right-padded batch `ids`: the policy's
    `h` (computed by the caller on the same ids) for a head, the critic's own forward for a
    separate critic."""
    if is_separate(critic):
        return hidden_states(critic.model, ids, attn, window)
    if h is None:
        raise ValueError("a value head needs the policy's hidden states")
    return h


def critic_mode(critic: torch.nn.Module | None, training: bool) -> None:
    """Train/eval mode of a separate critic's model (a head has no mode-dependent layers)."""
    if is_separate(critic):
        critic.train(training)

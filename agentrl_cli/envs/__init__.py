"""Environments. Importing this package registers the built-ins (and, with gymnasium
installed, registers them with Gymnasium as `agentrl/NAME-v0`)."""
import importlib.util

from .base import ENVS, SPEC_ADAPTERS, EnvSpec, StepResult, Task, TextEnv
from . import search  # noqa: F401  (registers "search")
from . import locate  # noqa: F401  (registers "locate")
from . import mathword  # noqa: F401  (registers "math")
from . import rules  # noqa: F401  (registers "rules")
from . import allocation  # noqa: F401  (registers "allocation")
from . import bfcl  # noqa: F401  (registers "bfcl-multi-turn-*"; bfcl-eval is imported on use)
from . import benchmarks  # noqa: F401  (registers the data-backed benchmark envs)
from . import gym_env, rgym

ENVS.register_scheme("gym", gym_env.gym_id_factory)    # --env gym:ID (gymnasium imported on use)
ENVS.register_scheme(rgym.PREFIX, rgym.make_factory)   # --env reasoning-gym:NAME (imported on use)
SPEC_ADAPTERS.append(gym_env.GymAdapter())             # FILE.py:make returning a gymnasium.Env
if importlib.util.find_spec("gymnasium") is not None:
    from .as_gymnasium import register_envs

    register_envs(ENVS.names())

__all__ = ["ENVS", "EnvSpec", "StepResult", "Task", "TextEnv"]

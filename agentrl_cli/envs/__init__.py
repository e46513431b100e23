"""Environments. Importing this package registers the built-ins (and, with gymnasium
installed, registers them with Gymnasium as `agentrl/NAME-v0`)."""
import functools
import importlib.util

from .base import ENVS, SPEC_ADAPTERS, EnvSpec, StepResult, Task, TextEnv
from . import search  # noqa: F401  (registers "search")
from . import locate  # noqa: F401  (registers "locate")
from . import mathword  # noqa: F401  (registers "math")
from . import rules  # noqa: F401  (registers "rules")
from . import allocation  # noqa: F401  (registers "allocation")
from . import bfcl  # noqa: F401  (registers "bfcl-multi-turn-*"; bfcl-eval is imported on use)
from . import benchmarks  # noqa: F401  (registers the data-backed benchmark envs)
from . import gym_env, remote, rgym

ENVS.register_scheme("gym", gym_env.gym_id_factory)    # --env gym:ID (gymnasium imported on use)
ENVS.register_scheme(rgym.PREFIX, rgym.make_factory)   # --env reasoning-gym:NAME (imported on use)
for _scheme in ("http", "https"):   # --env http://HOST:PORT: an env served by `agentrl serve-env`
    ENVS.register_scheme(_scheme, functools.partial(remote.factory_of, _scheme))
del _scheme
SPEC_ADAPTERS.append(gym_env.GymAdapter())             # FILE.py:make returning a gymnasium.Env
if importlib.util.find_spec("gymnasium") is not None:
    from .as_gymnasium import register_envs

    register_envs(ENVS.names())

__all__ = ["ENVS", "EnvSpec", "StepResult", "Task", "TextEnv"]

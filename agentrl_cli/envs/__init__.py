"""Environments. Importing this package registers the built-ins."""
from .base import ENVS, EnvSpec, StepResult, Task, TextEnv
from . import search  # noqa: F401  (registers "search")
from . import locate  # noqa: F401  (registers "locate")
from . import mathword  # noqa: F401  (registers "math")
from . import rules  # noqa: F401  (registers "rules")
from . import allocation  # noqa: F401  (registers "allocation")
from . import bfcl  # noqa: F401  (registers "bfcl-multi-turn-*"; bfcl-eval is imported on use)
from . import benchmarks  # noqa: F401  (registers the data-backed benchmark envs)
from . import remote

for _scheme in remote.SCHEMES:   # `--env http://HOST:PORT`: an env served by `agentrl serve-env`
    ENVS.add_scheme(_scheme, remote.connect)
del _scheme

__all__ = ["ENVS", "EnvSpec", "StepResult", "Task", "TextEnv"]

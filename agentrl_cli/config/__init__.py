"""One source of truth for configuration: frozen dataclasses, YAML presets, dotted overrides.

Precedence (later wins): dataclass defaults < the method's recipe defaults < a benchmark's
presets (`--benchmark`) < YAML file <
`--set key=value` overrides < explicit CLI flags (`--seed`, `--out`, `--method`, ...).
A field's docstring (the string literal after it) is its help text; `agentrl train --help`
points at `describe()`. Every user mistake raises `ConfigError` with one line.

- `schema`: the dataclasses, their defaults and field docs, the flat dotted view (`flatten`,
  `LEAF_TYPES`), the documented caps and `describe()`;
- `loading`: YAML files, presets, `--set` overrides, a run folder's saved config (`load`,
  `build`, `load_saved`);
- `validation`: value checks (ranges, caps, choices, keys and sections, `train.log`'s sinks,
  LoRA options), each a one-line `ConfigError`. Config knows values, not plugins: a plugin a
  config names is checked where plugins are built (`app.preflight.check_names`).

This package's face gathers the names its importers use (`from ..config import RunConfig,
load`); nothing here imports `reporting` or anything above this layer.
"""
from .loading import (
    RESERVED_REWARD_NAMES,
    REWARD_NAME,
    YAML_BYTES_CAP,
    YAML_NODES_CAP,
    build,
    check_yaml,
    env_name,
    load,
    load_saved,
    parse_sets,
    read_yaml,
    reward_specs,
    user_env,
)
from .schema import (
    CAPS,
    ENV_BOUNDARY_KEYS,
    ENV_FIELDS,
    LEAF_TYPES,
    SECTIONS,
    AlgoConfig,
    ContextConfig,
    EnvConfig,
    ModelConfig,
    RolloutConfig,
    RunConfig,
    TrainConfig,
    describe,
    flatten,
    step_seed,
)
# two private names too: `_check_key` (ablate checks a sweep's keys), `_CHOICES` (a test)
from .validation import (  # noqa: F401
    _CHOICES,
    BATCH_CELLS_CAP,
    RESUME_KEYS,
    SINKS,
    _check_key,
    check_lora,
    check_model,
    check_model_folder,
    parse_sinks,
    resume_changes,
)

__all__ = [
    "AlgoConfig", "BATCH_CELLS_CAP", "CAPS", "ContextConfig", "ENV_BOUNDARY_KEYS", "ENV_FIELDS",
    "EnvConfig", "LEAF_TYPES", "ModelConfig", "RESERVED_REWARD_NAMES", "RESUME_KEYS",
    "REWARD_NAME", "RolloutConfig", "RunConfig", "SECTIONS", "SINKS", "TrainConfig",
    "YAML_BYTES_CAP", "YAML_NODES_CAP", "build", "check_lora", "check_model",
    "check_model_folder", "check_yaml", "describe", "env_name", "flatten", "load", "load_saved",
    "parse_sets", "parse_sinks", "read_yaml", "resume_changes", "reward_specs", "step_seed",
    "user_env",
]

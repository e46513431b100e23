"""Building a `RunConfig`: YAML files and presets, `--set` dotted overrides, a method's recipe
defaults and CLI flags in their order of precedence (`load`), a run folder's saved config
(`load_saved`); values converted to each field's type, user env options and reward specs
gathered; every config built is checked (`validation`)."""
from __future__ import annotations

import ast
import json
import math
import os
import re
from dataclasses import replace
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from ..methods import METHODS
from .schema import ENV_BOUNDARY_KEYS, ENV_FIELDS, LEAF_TYPES, SECTIONS, EnvConfig, RunConfig
from .validation import _check_given_key, _check_key, _check_section, _validate, check_model


def _coerce(key: str, value: Any) -> Any:
    """Convert a YAML or `--set` value to the field's type, or raise ConfigError."""
    t = LEAF_TYPES[key]
    if isinstance(value, str) and t is not str:
        text = value.strip()
        if t is bool:
            low = text.lower()
            if low in ("true", "1", "yes", "on"):
                return True
            if low in ("false", "0", "no", "off"):
                return False
            raise ConfigError(f"{key} expects true/false, got '{value}'")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise ConfigError(f"{key} expects {t.__name__}, got '{value}'") from None
    if t is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} expects true/false, got {value!r}")
        return value
    if t is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not value.is_integer()
        ):
            raise ConfigError(f"{key} expects an integer, got {value!r}")
        return int(value)
    if t is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} expects a number, got {value!r}")
        if not math.isfinite(float(value)):
            raise ConfigError(f"{key} must be finite, got {value!r}")
        return float(value)
    if t is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key} expects a string, got {value!r}")
        return str(value)
    return value


def user_env(name: str) -> bool:
    """Whether env `name` is a user env: `module:attr`, `file.py:attr`, or the name of an
    installed package's `agentrl.envs` entry point (read from package metadata; nothing is
    imported: loading it is the env registry's business)."""
    if ":" in name:
        return True

    try:
        return any(ep.name == name for ep in entry_points(group="agentrl.envs"))
    except Exception:  # noqa: BLE001  (broken metadata of some package)
        return False


def env_name(name: str) -> str:
    """`env.name` as a run records it: a `file.py:attr` env with its file path made absolute
    (so resume, eval, subprocesses and workers find it from any folder), others as given."""
    target, _, attr = name.rpartition(":")
    if target.endswith(".py") and attr:
        return f"{os.path.abspath(os.path.expanduser(target))}:{attr}"
    return name


REWARD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*$")
RESERVED_REWARD_NAMES = ("mean", "env")   # reward/mean and reward/env are the run's own metrics


def _reward_item(item: Any) -> dict[str, Any]:
    """One `algo.rewards` entry -> {"name", "fn", "weight"}: `[NAME=]SPEC[:WEIGHT]` or a mapping
    with `fn` (and optional `weight`, `name`); a `file.py:fn` path made absolute (`env_name`)."""
    if isinstance(item, str):
        name, eq, rest = item.partition("=")
        if not eq or ":" in name:
            name, rest = "", item
        head, _, tail = rest.rpartition(":")
        try:
            weight, spec = (float(tail), head) if ":" in head else (1.0, rest)
        except ValueError:                # FILE.py:fn:WEIGHT with a WEIGHT that is no number
            raise ConfigError(f"algo.rewards: the weight '{tail}' of '{rest}' is not a number "
                              "([NAME=]FILE.py:fn[:WEIGHT])") from None
        item = {"fn": spec.strip(), "weight": weight, **({"name": name.strip()} if name else {})}
    if not isinstance(item, dict) or not isinstance(item.get("fn"), str):
        raise ConfigError(f"algo.rewards: each entry is FILE.py:fn[:WEIGHT], module:fn or "
                          f"{{fn: ..., weight: ...}}, got {item!r}")
    unknown = sorted(set(item) - {"fn", "weight", "name"})
    if unknown:
        raise ConfigError(f"algo.rewards: unknown field '{unknown[0]}' in {item!r} (fields: fn, "
                          "weight, name)")
    target, _, attr = item["fn"].rpartition(":")
    if not target or not attr:
        raise ConfigError(f"algo.rewards: '{item['fn']}' is not FILE.py:fn or module:fn")
    weight = item.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise ConfigError(f"algo.rewards: the weight of {item['fn']} must be a finite number, "
                          f"got {weight!r}")
    name = str(item.get("name") or attr.rsplit(".", 1)[-1])
    if not REWARD_NAME.match(name) or name in RESERVED_REWARD_NAMES:
        raise ConfigError(f"algo.rewards: '{name}' cannot name a reward (its metric is "
                          f"reward/{name}); give the entry another name")
    return {"name": name, "fn": env_name(item["fn"]), "weight": float(weight)}


def reward_specs(value: Any) -> list[dict[str, Any]]:
    """`algo.rewards` as given (a YAML list, a `--set` literal, or `--set` specs separated by
    commas) -> [{"name", "fn", "weight"}, ...]; names unique."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = [p for p in text.split(",") if p.strip()]
    if isinstance(value, (str, dict)):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"algo.rewards expects a list of reward functions, got {value!r}")
    out = [_reward_item(item) for item in value]
    names = [r["name"] for r in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"algo.rewards: two reward functions are named '{twice[0]}'; name one "
                          f"of them (NAME=FILE.py:fn or name: ...)")
    return out


def _option_value(value: Any) -> Any:
    """A user env option's value: a `--set` string read as true/false or as a Python literal
    when it is one (`3`, `0.5`, `[1, 2]`, `'x'`), else kept as the string (`add`)."""
    if not isinstance(value, str):
        return value
    if value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    try:
        v = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value
    return v if isinstance(v, (int, float, str, list, dict, type(None))) else value


def _env_options(overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` with `env.options.NAME` keys, and a user env's `env.NAME` keys that are not
    `EnvConfig` fields, gathered into one `env.options` dict; `env.name` as `env_name` records
    it, and so `algo.focus_allocator` (a `FILE.py:NAME` allocator's path made absolute). An
    unknown `env.NAME` of a built-in env stays, for `build`'s one-line error."""
    out = dict(overrides)
    for key in ("env.name", "algo.focus_allocator"):
        if key in out:
            out[key] = env_name(str(out[key]))
    options = out.pop("env.options", None)
    options = _option_value(options) if options is not None else {}
    if not isinstance(options, dict):
        raise ConfigError(f"env.options expects a mapping of option names to values, got {options!r}")
    options = dict(options)
    name = str(out.get("env.name", EnvConfig.name))
    extra = [k for k in out if k.startswith("env.") and k not in LEAF_TYPES]
    for key in extra:
        sub = key[len("env."):]
        if sub.startswith("options."):
            sub = sub[len("options."):]
        elif not user_env(name):
            continue
        value = out.pop(key)
        if sub in ("name", "seed", "options"):
            raise ConfigError(f"{key}: give env.{sub} itself")
        options[sub] = _coerce(f"env.{sub}", value) if sub in ENV_FIELDS else _option_value(value)
    if options or "env.options" in overrides:
        out["env.options"] = options
    return out


def _user_env_fields(values: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """For a user env, each `EnvConfig` field the user set (`env.max_turns`, ...) is also one
    of its options (`env.options.max_turns`): the factory gets exactly the keys given."""
    name = str(values.get("env.name", name or EnvConfig.name))
    given = [k for k in values if k.startswith("env.") and k[4:] in ENV_FIELDS
             and k[4:] not in ("name", "seed", "options", *ENV_BOUNDARY_KEYS)]
    if not given or not user_env(name):
        return values
    return {**values, **{f"env.options.{k[4:]}": values[k] for k in given}}


def parse_sets(items: list[str] | None) -> dict[str, Any]:
    """['train.lr=1e-4', ...] -> {'train.lr': '1e-4'} (values converted later, by type)."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got '{item}'")
        key, value = item.split("=", 1)
        key = key.strip()
        _check_given_key(key)
        out[key] = value
    return out


# What a YAML file may make us read and build, checked before it is parsed: its size, and the
# nodes it holds once every alias is expanded (a few KB of nested aliases, "billion laughs",
# would otherwise expand to gigabytes in whatever walks the result).
YAML_BYTES_CAP = 1 << 20
YAML_NODES_CAP = 100_000


def check_yaml(text: str, where: str) -> None:
    """A one-line error if `text` expands to more than YAML_NODES_CAP nodes (aliases counted
    at their full size); counted on the parser's event stream, which never builds the nodes."""
    sizes: dict[str, int] = {}            # anchor -> expanded size of its node
    stack: list[list] = []                # open collections: [anchor, size so far]
    total = 0

    def done(size: int, anchor: str | None) -> None:
        nonlocal total
        if anchor is not None:
            sizes[anchor] = size
        if stack:
            stack[-1][1] += size
        else:
            total += size
        if total + sum(c[1] for c in stack) > YAML_NODES_CAP:
            raise ConfigError(f"{where} expands to more than {YAML_NODES_CAP:,} YAML nodes "
                              "(nested aliases?); refused before parsing")

    try:
        for ev in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(ev, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                stack.append([ev.anchor, 1])
            elif isinstance(ev, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                anchor, size = stack.pop()
                done(size, anchor)
            elif isinstance(ev, yaml.ScalarEvent):
                done(1, ev.anchor)
            elif isinstance(ev, yaml.AliasEvent):
                done(sizes.get(ev.anchor, 1), None)
    except yaml.YAMLError:
        return                            # the loader reports it, with its line


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML preset into flat dotted keys (nested sections or dotted keys both work).
    At most YAML_BYTES_CAP bytes and YAML_NODES_CAP nodes (`check_yaml`)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {p} is a folder; give a YAML file")
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    if p.stat().st_size > YAML_BYTES_CAP:
        raise ConfigError(f"config file {p} has {p.stat().st_size:,} bytes; a config is at most "
                          f"{YAML_BYTES_CAP:,}")
    with p.open("rb") as f:
        raw = f.read(YAML_BYTES_CAP + 1)
    if len(raw) > YAML_BYTES_CAP:         # grew since the stat (or a pipe)
        raise ConfigError(f"config file {p} has more than {YAML_BYTES_CAP:,} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ConfigError(f"{p} is not UTF-8 text (byte 0x{raw[e.start]:02x} on line {line})") from None
    check_yaml(text, str(p))
    try:
        data = yaml.load(text, Loader=_unique_key_loader()) or {}
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"malformed YAML in {p}{where}: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a mapping of config keys, got {type(data).__name__}")
    flat: dict[str, Any] = {}

    def walk(d: dict, prefix: str) -> None:
        for k, v in d.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict) and key in SECTIONS:
                walk(v, key + ".")
            elif key in SECTIONS:         # `train:` left empty sets nothing; a value is a slip
                if v is not None:
                    raise ConfigError(f"{p}: '{key}' is a config section: give its keys under "
                                      f"it ({key}: {{...}}), got {v!r:.60}")
            elif isinstance(v, dict) and not prefix and key not in LEAF_TYPES:
                _check_section(key)       # `trian:` holding keys: the nearest section
            else:
                _check_given_key(key)
                if key in flat:           # `train.lr: x` and `train: {lr: y}` in one file
                    raise ConfigError(f"{p}: key '{key}' is given twice")
                flat[key] = v

    walk(data, "")
    return flat


def _unique_key_loader():
    """yaml's SafeLoader, except that a key given twice in one mapping is a one-line error
    (plain YAML keeps the last one silently)."""
    class Loader(yaml.SafeLoader):
        pass

    def mapping(loader, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise ConfigError(f"line {key_node.start_mark.line + 1}: a key must be a name, "
                                  f"got {type(key).__name__}")
            if key in seen:
                raise ConfigError(f"key '{key}' is given twice (lines {seen[key]} and "
                                  f"{key_node.start_mark.line + 1})")
            seen[key] = key_node.start_mark.line + 1
        return loader.construct_mapping(node, deep=deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return Loader


def build(overrides: dict[str, Any]) -> RunConfig:
    """RunConfig from flat dotted overrides (already ordered by precedence)."""
    grouped: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for key, value in _env_options(overrides).items():
        _check_key(key)
        v = reward_specs(value) if key == "algo.rewards" else _coerce(key, value)
        if "." in key:
            sec, name = key.split(".", 1)
            grouped.setdefault(sec, {})[name] = v
        else:
            top[key] = v
    base = RunConfig()
    kwargs = {sec: replace(getattr(base, sec), **vals) for sec, vals in grouped.items()}
    cfg = replace(base, **kwargs, **top)
    _validate(cfg)
    return cfg


def load(
    config_file: str | None = None,
    sets: list[str] | None = None,
    method: str | None = None,
    presets: dict[str, Any] | None = None,
    **flags: Any,
) -> RunConfig:
    """The one loader every command uses. `flags` are explicit CLI options (None = not given);
    `presets` (a benchmark's settings, dotted keys) rank above the recipe, below the YAML file."""
    file_values = read_yaml(config_file) if config_file else {}
    set_values = parse_sets(sets)
    chosen = method or set_values.get("method") or file_values.get("method") or RunConfig.method
    recipe = METHODS.get(str(chosen))  # raises a one-line RegistryError for unknown names
    merged: dict[str, Any] = {}
    merged.update(recipe.defaults)
    for key in presets or {}:
        _check_key(key)
    merged.update(presets or {})
    merged.update(file_values)
    merged.update(set_values)
    merged["method"] = chosen
    for key, value in flags.items():
        if value is not None:
            merged[key] = value
    cfg = build(_user_env_fields(merged))
    check_model(cfg)
    return cfg


def load_saved(run_dir: str | Path, sets: list[str] | None = None) -> RunConfig:
    """The config a run folder was started with (its config.json), plus `--set` overrides."""
    p = Path(run_dir) / "config.json"
    if not p.is_file():
        raise ConfigError(f"no run found at {run_dir} (missing config.json)")
    flat: dict[str, Any] = {}

    def walk(d: dict, prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict) and f"{prefix}{k}" != "env.options":
                walk(v, f"{prefix}{k}.")
            else:
                flat[f"{prefix}{k}"] = v

    try:
        saved = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p} is damaged ({type(e).__name__}); it cannot be resumed") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"{p} is damaged (not a JSON object); it cannot be resumed")
    walk(saved, "")
    flat.update(_user_env_fields(parse_sets(sets), flat.get("env.name")))
    return build(flat)

"""agentrl as a library: the commands' library functions, called from Python (docs/python-api.md).

    from agentrl_cli.api import load_config, train, evaluate, rollout, serve_env

Each function calls what its command calls (`agentrl train`: `app.train.launch`; `agentrl
eval`: `app.evaluate.eval_checkpoint`; `agentrl rollout`: `app.rollout.collect_rollout`),
so a run started here has the same folder, files and checks as one started on the command line,
and `agentrl train --resume`, `agentrl eval` and `agentrl view` read it. The arguments are
checked as the command checks its options (types and bounds), and every user mistake raises
`errors.ConfigError` (one line); a step callback stops a run with `errors.StopTraining` or by
returning False. `env=` also takes a Python factory, spec or env class, and `rewards=` Python
functions (`envs.plugins.object_spec` records them by name).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .app.evaluate import EvalRequest, eval_checkpoint
from .app.preflight import load_checked, load_config as command_config
from .app.rollout import RolloutRequest, collect_rollout
from .app.train import TrainRequest, launch
from .config import RunConfig, build, flatten
from .envs.env_server import EnvServer, serve_in_thread
from .envs.plugins import object_spec
from .errors import ConfigError
from .types import Episode

PathLike = (str, Path)
PLAIN = (str, int, float, bool, type(None), list, tuple, dict)


def _shown(value: Any) -> str:
    return f"{type(value).__name__} {value!r:.60}"


def _expect(call: str, name: str, value: Any, types: tuple, what: str) -> None:
    """A one-line ConfigError unless `value` is None or of `types` (a bool is no number)."""
    if value is None or (isinstance(value, types) and not (isinstance(value, bool)
                                                           and bool not in types)):
        return
    raise ConfigError(f"{call}: {name} expects {what}, got {_shown(value)}")


def _count(call: str, name: str, value: Any, low: int = 1) -> None:
    """None, or an integer >= `low` (the bound of the command's option), else one line."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{call}: {name} must be an integer >= {low}, got {_shown(value)}")


def _sets(call: str, sets: Any) -> list[str]:
    """`--set` strings from a mapping ({"train.steps": 3}), a list ("train.steps=3") or one
    such string; anything else is one line."""
    if sets is None:
        return []
    if isinstance(sets, str):
        sets = [sets]
    if isinstance(sets, Mapping):
        out = []
        for k, v in sets.items():
            _expect(call, "a key of sets", k, (str,), "a dotted config key (str)")
            if not isinstance(v, PLAIN):
                raise ConfigError(f"{call}: sets['{k}'] is a {type(v).__name__}; a config value "
                                  "is plain data (Python objects go to env= and rewards=)")
            out.append(f"{k}={v!r}" if isinstance(v, (list, dict, tuple)) else f"{k}={v}")
        return out
    if isinstance(sets, (list, tuple)) and all(isinstance(x, str) for x in sets):
        return list(sets)
    raise ConfigError(f"{call}: sets expects a mapping {{'train.steps': 3}} or a list of "
                      f"'key=value' strings, got {_shown(sets)}")


def _reward_entry(call: str, item: Any) -> Any:
    """One `rewards` item as `algo.rewards` takes it: a spec string as it is, a function as
    its recorded spec (`object_spec`), a mapping with its `fn` so converted."""
    if isinstance(item, str):
        return item
    if callable(item):
        return object_spec(item)
    if isinstance(item, Mapping) and (isinstance(item.get("fn"), str) or callable(item.get("fn"))):
        entry = {**item, "fn": _reward_entry(call, item["fn"])}
        _expect(call, f"the weight of {entry['fn']}", entry.get("weight"), (int, float), "a number")
        return {k: float(v) if k == "weight" else v for k, v in entry.items()}
    raise ConfigError(f"{call}: rewards takes functions, 'FILE.py:fn[:WEIGHT]' strings or "
                      f"{{'fn': ..., 'weight': ...}} mappings (one, or a list), got {_shown(item)}")


def _rewards(call: str, rewards: Any) -> list[str]:
    """`rewards` (one or a list) -> the `--set algo.rewards=[...]` string, or []."""
    if rewards is None:
        return []
    items = list(rewards) if isinstance(rewards, (list, tuple)) else [rewards]
    return [f"algo.rewards={[_reward_entry(call, x) for x in items]!r}"] if items else []


def _env(call: str, env: Any) -> str | None:
    """`env` as `--env` takes it: a name or spec string as it is; a factory, an env spec
    (make() and tasks()) or an env class as its recorded spec (`object_spec`)."""
    if env is None or isinstance(env, str):
        return env
    if callable(env) or (callable(getattr(env, "make", None)) and callable(getattr(env, "tasks", None))):
        return object_spec(env)
    raise ConfigError(f"{call}: env expects a name, 'module:factory', 'FILE.py:factory', a "
                      f"factory, an env spec or an env class, got {_shown(env)}")


def _options(call: str, **given: Any) -> None:
    """The string options (a name, a model, a method...) and the seed, checked as typed."""
    for name, value in given.items():
        if name == "seed":
            _count(call, name, value, low=0)
        else:
            _expect(call, name, value, (str,), "a string")


def load_config(config: str | Path | None = None, sets: Mapping[str, Any] | Sequence[str] | None = None,
                *, method: str | None = None, env: Any = None, benchmark: str | None = None,
                model: str | None = None, engine: str | None = None, seed: int | None = None,
                rewards: Any = None) -> RunConfig:
    """The checked config `agentrl train` would run: `config` a YAML file (`--config`), `sets`
    the `--set` overrides as a mapping or a list of "key=value", `env` a name or spec
    (`--env`) or a Python factory, env spec or env class, `rewards` reward functions (one or a
    list: Python functions, `--reward`'s "file.py:fn[:weight]" strings, or {"fn", "weight",
    "name"} mappings); the other arguments are the command's options."""
    call = "load_config"
    _expect(call, "config", config, PathLike, "a YAML file's path")
    _options(call, method=method, benchmark=benchmark, model=model, engine=engine, seed=seed)
    env_spec = _env(call, env)
    return command_config(config, _sets(call, sets) + _rewards(call, rewards),
                          benchmark=benchmark, method=method, env=env_spec, model=model,
                          engine=engine, seed=seed)


def _run_config(cfg: Any) -> RunConfig:
    """`cfg` checked as a config `load_config` gives: a RunConfig whose values pass the same
    checks (one changed with `dataclasses.replace` passes them again: rebuilt, then dropped)."""
    if not isinstance(cfg, RunConfig):
        raise ConfigError(f"train: cfg expects the RunConfig load_config(...) returns, got "
                          f"{_shown(cfg)} (e.g. train(load_config(sets={{'train.steps': 3}}), out))")
    build(flatten(cfg))
    return cfg


def _callback(call: str, name: str, fn: Any) -> None:
    if fn is not None and not callable(fn):
        raise ConfigError(f"{call}: {name} expects a function, got {_shown(fn)}")


def train(cfg: RunConfig, out: str | Path | None = None, *,
          on_step: Callable[[int, dict], object] | None = None, overwrite: bool = False,
          log: Callable[[str], None] = print) -> dict:
    """Train `cfg` into the run folder `out` (default: `cfg.out`, else runs/<time>-<method>-<env>)
    -> the run's summary (summary.json) with `out`. `on_step(step, metrics)` is called after
    each step with its metrics.jsonl row; returning False or raising `errors.StopTraining`
    ends the run there with a checkpoint of that step (`resume` continues it)."""
    cfg = _run_config(cfg)
    _expect("train", "out", out, PathLike, "a folder's path")
    _expect("train", "overwrite", overwrite, (bool,), "True or False")
    _callback("train", "on_step", on_step)
    _callback("train", "log", log)
    req = TrainRequest(out=Path(out) if out is not None else None, overwrite=overwrite,
                       run_config=cfg)
    run, summary = launch(req, log=log, on_step=on_step)
    return {**summary, "out": str(run)}


def resume(run: str | Path, steps: int | None = None, *,
           on_step: Callable[[int, dict], object] | None = None,
           log: Callable[[str], None] = print) -> dict | None:
    """Continue a run folder from its newest checkpoint (`agentrl train --resume RUN`), to
    `steps` steps in all when given -> its summary with `out`, or None when it had already run
    its steps."""
    _expect("resume", "run", run, PathLike, "a run folder's path")
    if run is None:
        raise ConfigError("resume: run expects a run folder's path, got None")
    _count("resume", "steps", steps)
    _callback("resume", "on_step", on_step)
    _callback("resume", "log", log)
    req = TrainRequest(resume=Path(run), sets=[f"train.steps={steps}"] if steps is not None else [])
    folder, summary = launch(req, log=log, on_step=on_step)
    return None if summary is None else {**summary, "out": str(folder)}


def evaluate(checkpoint: str | Path | None = None, *, model: str | None = None,
             tasks: int | None = None, n: int | None = None, pass_k: int | None = None,
             greedy: bool = False, env: Any = None,
             sets: Mapping[str, Any] | Sequence[str] | None = None,
             seed: int | None = None) -> dict:
    """A held-out evaluation (`agentrl eval`) of a run's checkpoint (`<run>/checkpoints/step-N`,
    or the run folder: its newest) with the run's own settings, or of `model` -> the results:
    `mean@1`, `mean@1_se`, `pass@k`, `pass^k`, `tokens_per_question`, `tool_calls`, ..."""
    call = "evaluate"
    _expect(call, "checkpoint", checkpoint, PathLike, "a checkpoint's or run folder's path")
    for name, value in (("tasks", tasks), ("n", n), ("pass_k", pass_k)):
        _count(call, name, value)
    _expect(call, "greedy", greedy, (bool,), "True or False")
    _options(call, model=model, seed=seed)
    req = EvalRequest(pass_k=pass_k, n=n, tasks=tasks,
                      checkpoint=Path(checkpoint) if checkpoint is not None else None,
                      greedy=greedy, env=_env(call, env), model=model, sets=_sets(call, sets),
                      seed=seed)
    return eval_checkpoint(req)[1]


def rollout(out: str | Path, n: int = 64, *, method: str | None = None,
            checkpoint: str | Path | None = None, model: str | None = None,
            env: Any = None, split: str = "eval", group_size: int | None = None,
            policy: str = "model", sets: Mapping[str, Any] | Sequence[str] | None = None,
            seed: int | None = None, overwrite: bool = False,
            log: Callable[[str], None] = print) -> list[Episode]:
    """Roll out episodes (`agentrl rollout`) and write them to the JSONL file `out` -> the
    episodes (`types.Episode`); with `method` naming a tree method (focus), one tree per
    task."""
    call = "rollout"
    _expect(call, "out", out, PathLike, "a JSONL file's path")
    if out is None:
        raise ConfigError("rollout: out expects a JSONL file's path, got None")
    _count(call, "n", n)
    _count(call, "group_size", group_size)
    _expect(call, "checkpoint", checkpoint, PathLike, "a checkpoint's or run folder's path")
    _options(call, method=method, model=model, seed=seed)
    for name, value, choices in (("split", split, ("train", "eval")),
                                 ("policy", policy, ("model", "expert"))):
        if value not in choices:
            raise ConfigError(f"{call}: {name} must be {' or '.join(choices)}, got {_shown(value)}")
    _expect(call, "overwrite", overwrite, (bool,), "True or False")
    _callback(call, "log", log)
    req = RolloutRequest(out=Path(out), n=n, policy=policy, split=split, group_size=group_size,
                         checkpoint=Path(checkpoint) if checkpoint is not None else None,
                         method=method, env=_env(call, env), model=model,
                         sets=_sets(call, sets), seed=seed, overwrite=overwrite)
    return collect_rollout(req, log=log).episodes


def serve_env(env: str, port: int = 0, *, host: str = "127.0.0.1",
              sets: Mapping[str, Any] | Sequence[str] | None = None, max_episodes: int = 4096,
              max_snapshots: int = 20000):
    """Serve `env` over HTTP (`agentrl serve-env`) on a background thread of this process ->
    the running server: its `url` (give it as `env=` to `load_config`), `close()`; a context
    manager. `port` 0 picks a free one."""
    cfg = load_checked(None, _sets(sets, None), **{"env.name": env})
    return serve_in_thread(EnvServer(cfg.env, max_episodes=max_episodes,
                                     max_snapshots=max_snapshots), host, port)

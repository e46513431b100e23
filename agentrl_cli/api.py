"""agentrl as a library: the commands' library functions, called from Python (docs/python-api.md).

    from agentrl_cli.api import load_config, train, evaluate, rollout, serve_env

Each function calls what its command calls (`agentrl train`: `train.launch.launch`; `agentrl
eval`: `train.held_out.eval_checkpoint`; `agentrl rollout`: `train.rollout_command.collect_rollout`),
so a run started here has the same folder, files and checks as one started on the command line,
and `agentrl train --resume`, `agentrl eval` and `agentrl view` read it. User mistakes raise
`errors.ConfigError` (one line); a step callback stops a run with `errors.StopTraining` or by
returning False.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .config import RunConfig
from .types import Episode


def _sets(sets: Mapping[str, Any] | Sequence[str] | None, rewards: Sequence[str] | None) -> list[str]:
    """`--set` strings from a mapping ({"train.steps": 3}) or a list ("train.steps=3"), and the
    reward functions (`--reward`)."""
    if isinstance(sets, Mapping):
        out = [f"{k}={v!r}" if isinstance(v, (list, dict, tuple)) else f"{k}={v}"
               for k, v in sets.items()]
    else:
        out = list(sets or [])
    if rewards:
        out.append(f"algo.rewards={list(rewards)!r}")
    return out


def load_config(config: str | Path | None = None,
                sets: Mapping[str, Any] | Sequence[str] | None = None, *,
                method: str | None = None, env: str | None = None,
                benchmark: str | None = None, model: str | None = None,
                engine: str | None = None, seed: int | None = None,
                rewards: Sequence[str] | None = None) -> RunConfig:
    """The checked config `agentrl train` would run: `config` a YAML file (`--config`), `sets`
    the `--set` overrides as a mapping or a list of "key=value", `rewards` the `--reward`
    functions ("file.py:fn[:weight]"); the other arguments are the command's options."""
    from .train.preflight import load_config as command_config

    return command_config(config, _sets(sets, rewards), benchmark=benchmark, method=method,
                          env=env, model=model, engine=engine, seed=seed)


def train(cfg: RunConfig, out: str | Path | None = None, *,
          on_step: Callable[[int, dict], object] | None = None, overwrite: bool = False,
          log: Callable[[str], None] = print) -> dict:
    """Train `cfg` into the run folder `out` (default: `cfg.out`, else runs/<time>-<method>-<env>)
    -> the run's summary (summary.json) with `out`. `on_step(step, metrics)` is called after
    each step with its metrics.jsonl row; returning False or raising `errors.StopTraining`
    ends the run there with a checkpoint of that step (`resume` continues it)."""
    from .train.launch import TrainRequest, launch

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
    from .train.launch import TrainRequest, launch

    req = TrainRequest(resume=Path(run), sets=[f"train.steps={steps}"] if steps else [])
    folder, summary = launch(req, log=log, on_step=on_step)
    return None if summary is None else {**summary, "out": str(folder)}


def evaluate(checkpoint: str | Path | None = None, *, model: str | None = None,
             tasks: int | None = None, n: int | None = None, pass_k: int | None = None,
             greedy: bool = False, env: str | None = None,
             sets: Mapping[str, Any] | Sequence[str] | None = None,
             seed: int | None = None) -> dict:
    """A held-out evaluation (`agentrl eval`) of a run's checkpoint (`<run>/checkpoints/step-N`,
    or the run folder: its newest) with the run's own settings, or of `model` -> the results:
    `mean@1`, `mean@1_se`, `pass@k`, `pass^k`, `tokens_per_question`, `tool_calls`, ..."""
    from .train.held_out import EvalRequest, eval_checkpoint

    req = EvalRequest(pass_k=pass_k, n=n, tasks=tasks,
                      checkpoint=Path(checkpoint) if checkpoint is not None else None,
                      greedy=greedy, env=env, model=model, sets=_sets(sets, None), seed=seed)
    return eval_checkpoint(req)[1]


def rollout(out: str | Path, n: int = 64, *, method: str | None = None,
            checkpoint: str | Path | None = None, model: str | None = None,
            env: str | None = None, split: str = "eval", group_size: int | None = None,
            policy: str = "model", sets: Mapping[str, Any] | Sequence[str] | None = None,
            seed: int | None = None, overwrite: bool = False,
            log: Callable[[str], None] = print) -> list[Episode]:
    """Roll out episodes (`agentrl rollout`) and write them to the JSONL file `out` -> the
    episodes (`types.Episode`); with `method` naming a tree method (focus), one tree per
    task."""
    from .train.rollout_command import RolloutRequest, collect_rollout

    req = RolloutRequest(Path(out), n, policy, split, group_size,
                         Path(checkpoint) if checkpoint is not None else None, method, env,
                         None, model, None, None, tuple(_sets(sets, None)), seed, overwrite)
    return collect_rollout(req, log=log).episodes


def serve_env(env: str, port: int = 0, *, host: str = "127.0.0.1",
              sets: Mapping[str, Any] | Sequence[str] | None = None, max_episodes: int = 4096,
              max_snapshots: int = 20000):
    """Serve `env` over HTTP (`agentrl serve-env`) on a background thread of this process ->
    the running server: its `url` (give it as `env=` to `load_config`), `close()`; a context
    manager. `port` 0 picks a free one."""
    from .envs.env_server import EnvServer, serve_in_thread
    from .train.preflight import load_checked

    cfg = load_checked(None, _sets(sets, None), **{"env.name": env})
    return serve_in_thread(EnvServer(cfg.env, max_episodes=max_episodes,
                                     max_snapshots=max_snapshots), host, port)

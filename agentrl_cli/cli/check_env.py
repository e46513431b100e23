"""agentrl check-env"""
from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from .options import ConfigOpt, SetOpt, user_errors


QUIET_S = 1.0   # a factory that returns (or fails) sooner prints nothing before its result


def _say(line: str) -> None:
    """A progress line on stderr, flushed at once: it shows while the check runs."""
    print(line, file=sys.stderr, flush=True)


@user_errors
def check_env_cmd(
    env: Annotated[str, typer.Argument(help="The env: a built-in name, an installed agentrl.envs entry point, module:factory or path/to/file.py:factory.")],
    config: ConfigOpt = None,
    set_: SetOpt = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Seed of the env's world (default env.seed).")] = None,
):
    """Check that an env meets the protocol the trainer relies on (types, rewards, step limit, snapshot/restore at the states the expert and random play reach, determinism, gold answers, malformed actions, env.step_timeout_s): each check named on stderr as it starts, then one line per problem and exit code 2, or a one-line OK. The factory, the task lists and every reset and step run within env.step_timeout_s. Example: agentrl check-env examples/calculator_env.py:make --set env.n_ops=1"""
    from ..envs.base import make_env_spec
    from ..envs.checker import check_env
    from ..envs.guard import EnvContractError, StepTimeout, call_with_timeout
    from ..train.preflight import load_checked

    sets = list(set_ or []) + ([f"env.seed={seed}"] if seed is not None else [])
    cfg = load_checked(str(config) if config else None, sets, **{"env.name": env})
    timeout = cfg.env.step_timeout_s
    said: list[str] = []

    def header() -> None:
        said.append(f"checking env '{cfg.env.name}' (seed {cfg.env.seed}; its factory and each "
                    f"reset and step within env.step_timeout_s={timeout:g} s)")
        _say(said[-1])

    def slow_factory() -> None:           # a factory still busy after QUIET_S: say so now
        header()
        _say("  factory: loading the env and calling its factory with the options given")

    try:                                  # a spec that does not build: its one-line error
        call_with_timeout(make_env_spec, cfg.env, timeout, slow=(QUIET_S, slow_factory))
    except StepTimeout as e:
        raise EnvContractError(cfg.env.name, f"its factory {e} (env.step_timeout_s)") from None
    if not said:
        header()
    try:
        report = check_env(lambda s: make_env_spec(cfg.env, s), seed=cfg.env.seed,
                           max_turns=cfg.env.max_turns, timeout_s=timeout,
                           max_chars=cfg.env.max_observation_chars,
                           progress=lambda line: _say(f"  {line}"))
    except EnvContractError as e:         # a reset, step or factory that did not return in time
        raise EnvContractError(cfg.env.name, e.problem, e.task, e.step) from None
    for line in report.problems:
        typer.echo(line)
    if report.problems:
        typer.echo(f"{len(report.problems)} problem(s) with env '{cfg.env.name}' "
                   "(docs/your-env.md describes the protocol)", err=True)
        raise typer.Exit(2)
    typer.echo(report.summary(cfg.env.name))

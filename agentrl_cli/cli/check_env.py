"""agentrl check-env"""
from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from .options import ConfigOpt, SetOpt, user_errors


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
    # deferred: CLI start-up
    from ..app.check_env import check_env_named

    name, report = check_env_named(env, str(config) if config else None, set_, seed, say=_say)
    for line in report.problems:
        typer.echo(line)
    if report.problems:
        typer.echo(f"{len(report.problems)} problem(s) with env '{name}' "
                   "(docs/your-env.md describes the protocol)", err=True)
        raise typer.Exit(2)
    typer.echo(report.summary(name))

"""Shared command options (Annotated aliases; `run_options`: the block every run command
declares once) and the one-line error handling."""
from __future__ import annotations

import errno
import functools
import inspect
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="YAML preset (flat dotted keys or nested sections).")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="Override a config key: --set train.lr=1e-4 (repeatable).")]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="Run seed.")]
MethodOpt = Annotated[Optional[str], typer.Option("--method", "-m", help="Recipe: focus, grpo, dr_grpo, rloo, dapo, gspo, ppo, vineppo, mpo, trace.")]
EnvOpt = Annotated[Optional[str], typer.Option("--env", "-e", help="Environment: a built-in name (default: search), an installed agentrl.envs entry point, module:factory, path/to/file.py:factory, or http://HOST:PORT (an env `agentrl serve-env` serves; docs/your-env.md).")]
ModelOpt = Annotated[Optional[str], typer.Option("--model", help="'tiny' (built in), a local Hugging Face folder, or a hub id.")]
EngineOpt = Annotated[Optional[str], typer.Option("--engine", help="Generation engine: hf (default) or vllm (GPU).")]
BenchmarkOpt = Annotated[Optional[str], typer.Option("--benchmark", "-b", help="A benchmarks.yaml entry: its env and settings (list: agentrl benchmarks).")]

# the options of every command that builds a run's config (train, eval, rollout), in their order
# on the command line and in `--help`; `set_` reaches the command as `sets`
RUN_OPTIONS = {"method": MethodOpt, "env": EnvOpt, "benchmark": BenchmarkOpt, "model": ModelOpt,
               "engine": EngineOpt, "config": ConfigOpt, "set_": SetOpt, "seed": SeedOpt}
RunOptions = dict[str, Any]


def run_options(fn=None, *, without: tuple[str, ...] = ()):
    """Declare `RUN_OPTIONS` (less `without`) once: they take the place of the command's `run`
    parameter in the signature Typer reads, and the command gets their values as one dict
    `run` (`sets` a list, [] when not given), the fields of an `app.request.RunRequest`. Use as
    `@run_options` or `@run_options(without=("method",))`."""
    if fn is None:
        return functools.partial(run_options, without=without)
    names = [n for n in RUN_OPTIONS if n not in without]
    params = []
    for p in inspect.signature(fn, eval_str=True).parameters.values():
        params += ([inspect.Parameter(n, p.KEYWORD_ONLY, annotation=RUN_OPTIONS[n], default=None)
                    for n in names] if p.name == "run" else [p.replace(kind=p.KEYWORD_ONLY)])

    @functools.wraps(fn)
    def wrapper(**kwargs):
        run = {n.rstrip("_"): kwargs.pop(n) for n in names}
        run["sets"] = list(run.pop("set") or [])
        return fn(run=run, **kwargs)

    wrapper.__signature__ = inspect.Signature(params)
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


def disk_full(e: OSError) -> bool:
    """True when `e` is a write that found the disk or the user's quota full."""
    return e.errno in (errno.ENOSPC, errno.EDQUOT)


def user_errors(fn=None, *, interrupted: str = "interrupted"):
    """User mistakes -> one line on stderr and exit code 2; tracebacks only with AGENTRL_DEBUG=1.
    Ctrl-C -> `interrupted` (what is true of the command's output then) and exit code 130.
    Use as `@user_errors` or `@user_errors(interrupted="...")`."""
    if fn is None:
        return functools.partial(user_errors, interrupted=interrupted)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        # deferred: CLI start-up
        from ..errors import ConfigError
        # deferred: CLI start-up
        from ..registry import RegistryError

        try:
            return fn(*args, **kwargs)
        except (ConfigError, RegistryError) as e:
            if os.environ.get("AGENTRL_DEBUG") == "1":
                raise
            print(f"error: {e}", file=sys.stderr)
            raise typer.Exit(2)
        except KeyboardInterrupt:
            print(interrupted, file=sys.stderr)
            raise typer.Exit(130)
        except typer.Exit:  # a command's own exit code (e.g. ablate: some runs failed)
            raise
        except Exception as e:  # an unexpected failure: still one line unless debugging
            if os.environ.get("AGENTRL_DEBUG") == "1":
                raise
            if isinstance(e, OSError) and disk_full(e):   # any save: docs/run-folder.md
                print(f"error: cannot write {e.filename or 'a file'} ({e.strerror}): the disk "
                      "is full; free space and run the command again (a training run "
                      "continues with --resume)", file=sys.stderr)
                raise typer.Exit(2)
            print(f"error: {type(e).__name__}: {e} (set AGENTRL_DEBUG=1 for the traceback)", file=sys.stderr)
            raise typer.Exit(1)

    return wrapper

"""Shared command options (Annotated aliases) and the one-line error handling."""
from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="YAML preset (flat dotted keys or nested sections).")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="Override a config key: --set train.lr=1e-4 (repeatable).")]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="Run seed.")]
MethodOpt = Annotated[Optional[str], typer.Option("--method", "-m", help="Recipe: focus, grpo, dr_grpo, rloo, dapo, gspo, ppo, vineppo, mpo, trace.")]
EnvOpt = Annotated[Optional[str], typer.Option("--env", "-e", help="Environment: a built-in name (default: search), an installed agentrl.envs entry point, module:factory or path/to/file.py:factory (docs/your-env.md).")]
ModelOpt = Annotated[Optional[str], typer.Option("--model", help="'tiny' (built in), a local Hugging Face folder, or a hub id.")]
EngineOpt = Annotated[Optional[str], typer.Option("--engine", help="Generation engine: hf (default) or vllm (GPU).")]
BenchmarkOpt = Annotated[Optional[str], typer.Option("--benchmark", "-b", help="A benchmarks.yaml entry: its env and settings (list: agentrl benchmarks).")]


def flags(method=None, env=None, model=None, engine=None, seed=None, out=None) -> dict:
    """CLI flags as dotted config keys (None = not given)."""
    return {"env.name": env, "model.name": model, "rollout.engine": engine, "seed": seed,
            "out": None if out is None else str(out), "_method": method}


def load_config(config: Path | None, sets: list[str] | None, benchmark: str | None = None, **kw):
    """The RunConfig of a command. `benchmark` (a benchmarks.yaml entry) sets the env and its
    presets, after checking that the benchmark can run here (else a one-line error); `--env`
    naming a benchmark's env applies the same presets."""
    from ..errors import ConfigError
    from ..envs.benchmarks import get_benchmark, load_benchmarks
    from ..train.preflight import load_checked

    f = flags(**kw)
    method = f.pop("_method")
    presets = None
    if benchmark is not None:
        if f["env.name"] is not None:
            raise ConfigError("give --benchmark or --env, not both")
        b = get_benchmark(benchmark)
        b.check()
        presets = b.presets()
    elif f["env.name"] is not None:
        try:
            table = load_benchmarks()
        except ConfigError:
            table = {}
        # the entry named like the env first (`search`, not its variant `search-long`)
        same = sorted((b for b in table.values() if b.env == f["env.name"]),
                      key=lambda b: b.name != f["env.name"])
        presets = same[0].presets() if same else None
    cfg = load_checked(str(config) if config else None, sets, method=method, presets=presets, **f)
    user_env_needs(cfg, forks=method is not None)
    return cfg


def user_env_needs(cfg, forks: bool = True) -> None:
    """What a user env must offer for this command, checked before any model loads: a scripted
    expert for `--model tiny`; with `forks`, the fork check when the method's controller forks
    episodes (FOCUS, VinePPO; training checks its own method in any case)."""
    from ..envs.base import check_tiny_env
    from ..envs.checker import require_fork
    from ..methods import FORKING_CONTROLLERS

    if cfg.model.name == "tiny":
        check_tiny_env(cfg.env)
    if forks and cfg.algo.controller in FORKING_CONTROLLERS:
        require_fork(cfg.env, f"method {cfg.method}")


def default_out(cfg) -> Path:
    if cfg.out:
        return Path(cfg.out)
    return Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.method}-{cfg.env.name}"


def user_errors(fn):
    """User mistakes -> one line on stderr and exit code 2; tracebacks only with AGENTRL_DEBUG=1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from ..errors import ConfigError
        from ..registry import RegistryError

        try:
            return fn(*args, **kwargs)
        except (ConfigError, RegistryError) as e:
            if os.environ.get("AGENTRL_DEBUG") == "1":
                raise
            print(f"error: {e}", file=sys.stderr)
            raise typer.Exit(2)
        except KeyboardInterrupt:
            print("interrupted (resume with --resume <out dir>)", file=sys.stderr)
            raise typer.Exit(130)
        except typer.Exit:  # a command's own exit code (e.g. ablate: some runs failed)
            raise
        except Exception as e:  # an unexpected failure: still one line unless debugging
            if os.environ.get("AGENTRL_DEBUG") == "1":
                raise
            print(f"error: {type(e).__name__}: {e} (set AGENTRL_DEBUG=1 for the traceback)", file=sys.stderr)
            raise typer.Exit(1)

    return wrapper

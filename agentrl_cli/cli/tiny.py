"""agentrl build-tiny"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer

from .options import BenchmarkOpt, ConfigOpt, EnvOpt, SetOpt, user_errors


def train_command(out: Path, env: str, benchmark: str | None, config: Path | None,
                  sets: list[str] | None) -> str:
    """The `agentrl train` command that trains on the build in the world it was made for: the
    same --benchmark, --config or --env, and the same env.* settings."""
    parts = ["agentrl", "train", "--model", str(out)]
    if config is not None:
        parts += ["--config", str(config)]
    if benchmark is not None:
        parts += ["--benchmark", benchmark]
    else:
        parts += ["--env", env]
    for item in sets or []:
        if item.startswith("env."):
            parts += ["--set", item]
    return " ".join(shlex.quote(p) for p in parts)


@user_errors
def build_tiny_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="A new folder for the build (a Hugging Face model folder, its value head and recipe.json).")],
    env: EnvOpt = None,
    benchmark: BenchmarkOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    threads: Annotated[Optional[int], typer.Option("--threads", min=1, help="Torch threads of the build (default: OMP_NUM_THREADS, else 2, the shipped builds' count; another count may give other weights).")] = None,
):
    """Remake the tiny built-in agent from its recipe (the env's `env.*` keys and `model.tiny_*`), and say whether it equals the build that ships with the package. Its first lines estimate the build's time from measured warm-up steps; its last is the train command for the build. Example: agentrl build-tiny --env rules --out runs/tiny-rules --threads 1"""
    # deferred: CLI start-up
    from ..models.loading import tiny_recipe
    from ..models.tiny import shipped_path
    from ..app.preflight import load_config
    from ..app.tiny_build import build_threads, rebuild

    cfg = load_config(config, set_, benchmark, env=env)
    recipe = tiny_recipe(cfg)
    shipped = shipped_path(recipe)
    typer.echo(f"agentrl build-tiny env={recipe.env.name} recipe key {recipe.key()} -> {out} "
               f"on {build_threads(threads)} thread(s)"
               + (f" (the package ships this recipe's build: {shipped})" if shipped else
                  " (no build of this recipe ships with the package)"))
    info = rebuild(recipe, out, log=typer.echo, threads=threads)
    typer.echo(f"built in {info['build_seconds']:.0f}s: warm-up step {info['warmup_steps']}, dev "
               f"success {info['dev_success']}, held-out success {info['base_success']} "
               f"(the build's own check)")
    if info["identical"] is not None:
        typer.echo("the same weights as the shipped build, byte for byte" if info["identical"] else
                   "different weights from the shipped build: float kernels and thread counts "
                   "move the warm-up's late jump; other commands keep using the shipped build for --model tiny")
    typer.echo("train on it: " + train_command(out, cfg.env.name, benchmark, config, set_))

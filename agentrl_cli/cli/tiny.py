"""agentrl build-tiny"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .options import BenchmarkOpt, ConfigOpt, EnvOpt, SetOpt, user_errors


@user_errors
def build_tiny_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="A new folder for the build (a Hugging Face model folder, its value head and recipe.json).")],
    env: EnvOpt = None,
    benchmark: BenchmarkOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
):
    """Remake the tiny built-in agent from its recipe (the env's `env.*` keys and `model.tiny_*`), and say whether it equals the build that ships with the package. Train on it with agentrl train --model OUT. Example: agentrl build-tiny --out runs/tiny-search"""
    from ..models.loading import tiny_recipe
    from ..models.tiny import shipped_path
    from ..train.preflight import load_config
    from ..train.tiny_build import rebuild

    cfg = load_config(config, set_, benchmark, env=env)
    recipe = tiny_recipe(cfg)
    shipped = shipped_path(recipe)
    typer.echo(f"agentrl build-tiny env={recipe.env.name} recipe key {recipe.key()} -> {out}"
               + (f" (the package ships this recipe's build: {shipped})" if shipped else
                  " (no build of this recipe ships with the package)"))
    info = rebuild(recipe, out, log=typer.echo)
    typer.echo(f"built in {info['build_seconds']:.0f}s: warm-up step {info['warmup_steps']}, dev "
               f"success {info['dev_success']}, held-out success {info['base_success']} "
               f"(the build's own check)")
    if info["identical"] is not None:
        typer.echo("the same weights as the shipped build, byte for byte" if info["identical"] else
                   "different weights from the shipped build: float kernels and thread counts "
                   "move the warm-up's late jump; other commands keep using the shipped build for --model tiny")
    typer.echo(f"train on it: agentrl train --model {out}")

"""agentrl widen"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .options import BenchmarkOpt, ConfigOpt, EnvOpt, ModelOpt, SetOpt, user_errors


@user_errors
def widen_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="A new folder for the wide model (a Hugging Face model folder with the source's tokenizer).")],
    model: ModelOpt = None,
    factor: Annotated[int, typer.Option("--factor", min=2, max=16, help="How many times wider the hidden size (and the MLP) becomes.")] = 2,
    noise: Annotated[float, typer.Option("--noise", min=0.0, max=1.0, help="Zero-sum noise between the copies, relative to each weight's std (breaks their symmetry; the function is unchanged).")] = 0.01,
    mlp: Annotated[bool, typer.Option("--mlp/--no-mlp", help="Widen the MLP's inner width too.")] = True,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the noise.")] = 0,
    env: EnvOpt = None,
    benchmark: BenchmarkOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
):
    """Write a wider copy of a model that computes the same function (function-preserving widening of a Llama/Qwen-style decoder): a critic with more capacity that starts from what the policy reads. Use it with --set model.critic=separate --set model.critic_path=OUT. Example: agentrl widen --benchmark search-long --out runs/critic-x2"""
    # deferred: CLI start-up
    from ..errors import ConfigError
    from ..models.widen import widen_folder
    from ..app.preflight import load_config
    from ..app.tiny_build import ensure_model

    cfg = load_config(config, set_, benchmark, env=env, model=model)
    src = ensure_model(cfg, log=typer.echo)
    try:
        info = widen_folder(src, out, factor=factor, noise=noise, widen_mlp=mlp, seed=seed)
    except (FileExistsError, ValueError) as e:
        raise ConfigError(f"widen: {e}") from None
    typer.echo(f"agentrl widen {src} -> {out}: hidden size {info['hidden_size']}, MLP "
               f"{info['intermediate_size']}, {info['parameters']:,} parameters (from "
               f"{info['source_parameters']:,}); hidden states equal the source's to "
               f"{info['hidden_state_rel_diff']:.1e} (relative)")
    typer.echo(f"train with it as the critic: agentrl train --method focus --set model.critic=separate "
               f"--set model.critic_path={out}")

"""agentrl eval"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from .options import (BenchmarkOpt, ConfigOpt, EngineOpt, EnvOpt, ModelOpt, SeedOpt, SetOpt,
                      load_config, user_errors)


@user_errors
def eval_cmd(
    pass_k: Annotated[int, typer.Option("--pass-k", "-k", help="Largest k of pass@k (k = 1, 2, 4, ... K).", min=1)] = 8,
    n: Annotated[Optional[int], typer.Option("--n", help="Samples per task (default: K; must be >= K).")] = None,
    tasks: Annotated[int, typer.Option("--tasks", help="Held-out tasks.", min=1)] = 50,
    checkpoint: Annotated[Optional[Path], typer.Option("--checkpoint", help="Checkpoint or run folder (its latest checkpoint).")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the results as JSON here.")] = None,
    greedy: Annotated[bool, typer.Option("--greedy", help="Argmax decoding (then n = 1 is enough).")] = False,
    env: EnvOpt = None,
    benchmark: BenchmarkOpt = None,
    model: ModelOpt = None,
    engine: EngineOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    seed: SeedOpt = None,
):
    """Evaluate pass@k, pass^k, mean@1 and tokens per question. Example: agentrl eval --pass-k 32 --checkpoint runs/x"""
    from ..config import ConfigError
    from ..evaluation.runner import run_eval
    from ..reporting.live import eval_table

    n = n if n is not None else pass_k
    if n < pass_k:
        raise ConfigError(f"--n ({n}) must be >= --pass-k ({pass_k})")
    if json_path is not None:             # before the work, so results are never lost at the end
        from ..train.run_folder import check_output_file
        check_output_file(json_path, "--json")
    if checkpoint is not None:
        from ..train.checkpoint import find
        model = str(find(checkpoint))
    cfg = load_config(config, set_, benchmark=benchmark, env=env, model=model, engine=engine,
                      seed=seed)
    res = run_eval(cfg, n=n, k_max=pass_k, n_tasks=tasks, greedy=greedy)
    name = Path(cfg.model.name).name if cfg.model.name != "tiny" else "tiny"
    Console().print(eval_table(res, f"{name} on {cfg.env.name} (held-out)"))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = json_path.with_name(f".{json_path.name}.tmp")
        tmp.write_text(json.dumps(res, indent=2))
        tmp.replace(json_path)

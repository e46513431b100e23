"""`agentrl`: rollout | train | eval | diagnose | ablate | view | benchmarks | build-tiny | serve-env. Commands are thin: parse, build a
RunConfig with the one loader, call one library function."""
from __future__ import annotations

import typer

from . import ablate, benchmarks, diagnose, evaluate, rollout, tiny, train, view
from . import check_env, serve_env, widen

app = typer.Typer(
    name="agentrl",
    help="Reinforcement learning for long-horizon, tool-using LLM agents (FOCUS, MPO, TRACE and "
         "fair baselines). Start with: agentrl train --method focus",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("train")(train.train_cmd)
app.command("rollout")(rollout.rollout_cmd)
app.command("eval")(evaluate.eval_cmd)
app.add_typer(diagnose.app, name="diagnose")
app.command("ablate")(ablate.ablate_cmd)
app.command("view")(view.view_cmd)
app.command("benchmarks")(benchmarks.benchmarks_cmd)
app.command("build-tiny")(tiny.build_tiny_cmd)
app.command("check-env")(check_env.check_env_cmd)
app.command("widen")(widen.widen_cmd)
app.command("serve-env")(serve_env.serve_env_cmd)


if __name__ == "__main__":
    app()

"""agentrl benchmarks"""
from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from .options import user_errors


@user_errors
def benchmarks_cmd(
    name: Annotated[Optional[str], typer.Argument(help="A benchmark: show its data, splits and the papers' numbers.")] = None,
):
    """List the benchmarks of benchmarks.yaml: env, data status, CPU stand-in, papers. Example: agentrl benchmarks browsecomp-plus"""
    # deferred: CLI start-up
    from ..envs.benchmarks import get_benchmark, load_benchmarks

    console = Console()
    if name is None:
        table = load_benchmarks()
        t = Table(title="benchmarks (run one: --benchmark NAME; the env of each has its name)")
        t.add_column("benchmark", no_wrap=True, min_width=max(len(n) for n in table))
        for c in ("adapter", "data", "CPU stand-in", "papers"):
            t.add_column(c)
        for b in table.values():
            name = b.name if b.env == b.name else f"{b.name} (env {b.env})"
            t.add_row(name, b.adapter, b.data_status(), b.cpu_env, ", ".join(b.papers))
        console.print(t)
        return
    b = get_benchmark(name)
    console.print(f"[bold]{b.name}[/]: {b.title}", highlight=False)
    console.print(f"env {b.env} (adapter {b.adapter}) · CPU stand-in {b.cpu_env} · data "
                  f"{b.data_status()} ({b.data['source']}: {b.data_path or b.data.get('module') or '-'})"
                  f" · get: {b.data['get']}", highlight=False)
    splits = ", ".join(f"{k}={v['split']}" + (f" ({v['size']})" if "size" in v else "")
                       for k, v in b.splits.items())
    console.print(f"splits {splits} · metrics {', '.join(b.metrics)}", highlight=False)
    rows = b.reference_rows()
    if rows:
        t = Table(title="reported in the papers")
        for c in ("paper", "model", "metric", "method", "value"):
            t.add_column(c)
        for r in rows:
            t.add_row(*r)
        console.print(t)

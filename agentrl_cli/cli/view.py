"""agentrl view"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from .options import user_errors


@user_errors
def view_cmd(
    folder: Annotated[Path, typer.Argument(help="A run folder (agentrl train --out) or a sweep folder (agentrl ablate --out).")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="HTML file to write (default <folder>/report.html).")] = None,
    text: Annotated[bool, typer.Option("--text", help="Print a traced step, tree or episode in the terminal instead of writing the report.")] = False,
    step: Annotated[Optional[int], typer.Option("--step", help="With --text: the traced step (default: the last one).")] = None,
    tree: Annotated[Optional[int], typer.Option("--tree", help="With --text: print the step's K-th traced FOCUS tree.")] = None,
    episode: Annotated[Optional[int], typer.Option("--episode", help="With --text: print the step's K-th traced episode, turn by turn.")] = None,
):
    """See what the agent did: a self-contained HTML report (learning curves, FOCUS trees, episodes with the tokens each loss trains on, the critic) that opens from disk. Example: agentrl view runs/f0"""
    # deferred: CLI start-up
    from ..app.view import view
    from ..reporting.view import printable

    report = view(folder, out, text, step, tree, episode)
    if text:
        print(report)
        return
    console = Console()
    console.print(f"wrote {report.path} ({report.size / 1e6:.2f} MB): open it in a browser "
                  "(no network needed)", highlight=False, markup=False)
    n = len(report.problems) + report.more
    if n:
        first = report.problems[0]
        console.print(printable(f"{n} file problem{'s' if n > 1 else ''} listed in it under "
                                f"\"could not read\" (first: {first['file']}: {first['reason']})"),
                      highlight=False, markup=False, soft_wrap=True)

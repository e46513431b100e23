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
    from ..errors import ConfigError

    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder; give a run folder or an agentrl ablate folder")
    if tree is not None and episode is not None:
        raise ConfigError("give --tree or --episode, not both")
    if not text and (step, tree, episode) != (None, None, None):
        raise ConfigError("--step, --tree and --episode choose what --text prints; add --text")
    if text:
        # deferred: CLI start-up
        from ..reporting.trace_text import text_view

        print(text_view(folder, step, tree, episode))
        return
    # deferred: CLI start-up
    from ..reporting.view import printable, write_report
    from ..train.run_folder import check_output_file

    check_output_file(out if out is not None else folder / "report.html")
    report = write_report(folder, out)
    console = Console()
    console.print(f"wrote {report.path} ({report.size / 1e6:.2f} MB): open it in a browser "
                  "(no network needed)", highlight=False, markup=False)
    n = len(report.problems) + report.more
    if n:
        first = report.problems[0]
        console.print(printable(f"{n} file problem{'s' if n > 1 else ''} listed in it under "
                                f"\"could not read\" (first: {first['file']}: {first['reason']})"),
                      highlight=False, markup=False, soft_wrap=True)

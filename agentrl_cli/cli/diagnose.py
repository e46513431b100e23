"""agentrl diagnose"""
from __future__ import annotations

import sys
from typing import Annotated

import typer


def diagnose_cmd(
    what: Annotated[str, typer.Argument(help="audit-tree | critic-rank | variance | tool-calls")] = "audit-tree",
):
    """Critic and allocation diagnostics (audit tree, critic ranking, variance, tool-call trends).

    Not implemented yet: this command arrives with the diagnostics capability. It prints nothing
    fake; it exits with code 2.
    """
    print(f"error: 'agentrl diagnose {what}' is not available yet in this version "
          "(it arrives with the diagnostics capability)", file=sys.stderr)
    raise typer.Exit(2)

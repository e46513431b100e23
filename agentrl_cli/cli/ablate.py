"""agentrl ablate"""
from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer


def ablate_cmd(
    grid: Annotated[Optional[list[str]], typer.Option("--grid", help="key=v1,v2 (repeatable).")] = None,
):
    """Sweeps over config keys, methods and seeds.

    Not implemented yet: this command arrives with the ablation capability. It prints nothing
    fake; it exits with code 2.
    """
    print("error: 'agentrl ablate' is not available yet in this version "
          "(it arrives with the ablation capability)", file=sys.stderr)
    raise typer.Exit(2)

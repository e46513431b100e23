"""`agentrl view`'s library function: a run or sweep folder -> its self-contained HTML report
(`reporting.view.write_report`), or one traced step, tree or episode as text
(`reporting.trace_text.text_view`), after the checks of what was asked."""
from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from ..reporting.trace_text import text_view
from ..reporting.view import Report, write_report
from ..train.run_folder import check_output_file


def view(folder: Path, out: Path | None = None, text: bool = False, step: int | None = None,
         tree: int | None = None, episode: int | None = None) -> str | Report:
    """The text view (a str) with `text`, else the written report (`out`, default
    <folder>/report.html). A folder that is not one, `--tree` with `--episode`, or a choice
    of what to print without `--text` is one `ConfigError` line, before any file is read."""
    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder; give a run folder or an agentrl ablate folder")
    if tree is not None and episode is not None:
        raise ConfigError("give --tree or --episode, not both")
    if not text and (step, tree, episode) != (None, None, None):
        raise ConfigError("--step, --tree and --episode choose what --text prints; add --text")
    if text:
        return text_view(folder, step, tree, episode)
    check_output_file(out if out is not None else folder / "report.html")
    return write_report(folder, out)

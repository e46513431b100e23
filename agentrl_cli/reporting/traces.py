"""Trace files of a run folder (`<run>/traces/step-NNNNNN.json`, docs/traces.md): their names,
their size cap, and reading them back (a run folder may come from someone else: plain JSON, at
most twice the cap, no symbolic link followed, checked against the trace schema,
`trace_schema`). `train.traces` writes them."""
from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import ConfigError
from .folder_reader import FolderReader, Unreadable, loads, read_regular
from .trace_schema import check_trace

TRACES = "traces"
TRACE_CAP = 300_000               # bytes of one trace file (train.traces.fit keeps to it)
_NAME = re.compile(r"step-(\d{6,})\.json")


def trace_path(run: Path, step: int) -> Path:
    return Path(run) / TRACES / f"step-{step:06d}.json"


def trace_steps(run: Path, reader: FolderReader | None = None) -> dict[int, Path]:
    """Step -> trace file, for every trace the run folder holds (in step order). Symbolic
    links are skipped (and listed as problems of `reader`, when given)."""
    folder = Path(run) / TRACES
    reader = reader or FolderReader(run)
    found = {}
    try:
        entries = list(os.scandir(reader.check(folder))) if os.path.lexists(folder) else []
    except (Unreadable, OSError) as e:
        reader.refuse(folder, e if isinstance(e, Unreadable) else e.strerror)
        return {}
    for e in entries:
        if not (m := _NAME.fullmatch(e.name)):
            continue
        if e.is_symlink():
            reader.refuse(e.path, "a symbolic link (not followed)")
        elif e.is_file(follow_symlinks=False):
            found[int(m.group(1))] = Path(e.path)
    return dict(sorted(found.items()))


def load_trace(path: Path) -> dict:
    """One trace file; Unreadable or ValueError (one line) when it is too big, not JSON
    (nested at most `folder_reader.MAX_NESTING` deep) or not a trace (`trace_schema`).
    Non-finite numbers read as None."""
    data = loads(read_regular(path, 2 * TRACE_CAP).decode("utf-8"))
    if isinstance(data, dict):
        for key in ("trees", "episodes"):
            data.setdefault(key, [])
    check_trace(data)
    return data


def read_trace(path: Path) -> dict:
    """`load_trace`, a file that cannot be read a one-line ConfigError."""
    try:
        return load_trace(path)
    except ValueError as e:            # Unreadable and UnicodeDecodeError are ValueErrors
        raise ConfigError(f"{path}: not a readable trace ({e})") from None


def pick_steps(steps: list[int], most: int) -> list[int]:
    """At most `most` of `steps` (sorted), evenly spread, the first and the last kept."""
    if len(steps) <= most:
        return list(steps)
    if most <= 1:
        return steps[-1:]
    idx = sorted({round(i * (len(steps) - 1) / (most - 1)) for i in range(most)})
    return [steps[i] for i in idx]

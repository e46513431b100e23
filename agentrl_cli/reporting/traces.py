"""Trace files of a run folder (`<run>/traces/step-NNNNNN.json`, docs/traces.md): their names,
their size cap, and reading them back (plain JSON, at most twice the cap: a run folder may come
from someone else). `train.traces` writes them."""
from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import ConfigError

TRACES = "traces"
TRACE_CAP = 300_000               # bytes of one trace file (train.traces.fit keeps to it)
_NAME = re.compile(r"step-(\d{6,})\.json")


def trace_path(run: Path, step: int) -> Path:
    return Path(run) / TRACES / f"step-{step:06d}.json"


def trace_steps(run: Path) -> dict[int, Path]:
    """Step -> trace file, for every trace the run folder holds (in step order)."""
    folder = Path(run) / TRACES
    if not folder.is_dir():
        return {}
    found = {int(m.group(1)): p for p in folder.iterdir()
             if (m := _NAME.fullmatch(p.name)) and p.is_file() and not p.is_symlink()}
    return dict(sorted(found.items()))


def read_trace(path: Path) -> dict:
    """One trace file; a file that is too big or not a trace is a one-line ConfigError."""
    path = Path(path)
    try:
        if path.stat().st_size > 2 * TRACE_CAP:
            raise ValueError(f"larger than {2 * TRACE_CAP} bytes")
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("step"), int):
            raise ValueError("not a trace")
        for key in ("trees", "episodes"):
            if not isinstance(data.setdefault(key, []), list):
                raise ValueError(f"'{key}' is not a list")
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a readable trace ({e})") from None
    return data


def pick_steps(steps: list[int], most: int) -> list[int]:
    """At most `most` of `steps` (sorted), evenly spread, the first and the last kept."""
    if len(steps) <= most:
        return list(steps)
    if most <= 1:
        return steps[-1:]
    idx = sorted({round(i * (len(steps) - 1) / (most - 1)) for i in range(most)})
    return [steps[i] for i in idx]

"""A run's `metrics.jsonl` for `agentrl view`: at most a cap of rows spread over the whole run,
read in bounded time and memory whatever the file's size (docs/traces.md, "Caps").

A file up to SCAN_BYTES is read whole and its rows thinned evenly, held-out checks (rows with
`eval/success`) and the other rows each spread over the run, the first and last of each kept.
A larger file is read in `cap // 2` windows evenly spaced from its first byte to its last
(SCAN_BYTES in all); each window gives one held-out check and one other row. A row longer
than MAX_LINE bytes is skipped; an unfinished last line (a run still writing) is dropped.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from .folder_reader import FolderReader, Unreadable, loads, open_regular
from .traces import pick_steps

SCAN_BYTES = 8 << 20              # bytes of one metrics.jsonl read at most
MAX_LINE = 8 << 10                # bytes of one row (a FOCUS row is about 1.6 KB)
EVAL_MARK = b'"eval/success"'


def clean_number(x) -> float | None:
    """A metric value for the page: finite numbers (6 significant digits), else None."""
    if isinstance(x, bool):
        return float(x)
    if not isinstance(x, (int, float)):
        return None
    x = float(f"{x:.6g}")
    return x if math.isfinite(x) else None


def thin(lines: list[bytes], cap: int) -> list[bytes]:
    """At most `cap` of `lines` in file order: held-out checks (at most half the cap) and the
    other rows, each evenly spread with their first and last kept."""
    if len(lines) <= cap:
        return lines
    evals = [i for i, line in enumerate(lines) if EVAL_MARK in line]
    kept = set(pick_steps(evals, min(len(evals), cap // 2)))
    others = [i for i, line in enumerate(lines) if EVAL_MARK not in line]
    kept.update(pick_steps(others, cap - len(kept)))
    return [lines[i] for i in sorted(kept)]


def _window(f, start: int, width: int, last: bool) -> list[bytes]:
    """One held-out check and one other row from the complete lines of a window (the last
    window: its last ones)."""
    f.seek(start)
    lines = f.read(width).split(b"\n")[(1 if start else 0):-1]
    pick = (lambda xs: xs[-1:]) if last else (lambda xs: xs[:1])
    lines = [x for x in lines if x.strip() and len(x) <= MAX_LINE]
    chosen = {*pick([x for x in lines if EVAL_MARK in x]),
              *pick([x for x in lines if EVAL_MARK not in x])}
    return [x for x in lines if x in chosen]


def sample_lines(f, size: int, cap: int) -> tuple[list[bytes], int]:
    """(at most `cap` complete rows spread over the file, rows skipped as too long)."""
    if size <= SCAN_BYTES:
        data = f.read(SCAN_BYTES)
        complete = data.split(b"\n")
        lines = complete[:-1] + ([complete[-1]] if _whole_row(complete[-1]) else [])
        long = sum(len(x) > MAX_LINE for x in lines)
        return thin([x for x in lines if x.strip() and len(x) <= MAX_LINE], cap), long
    n = max(2, cap // 2)
    width = SCAN_BYTES // n
    out = []
    for k in range(n):
        out += _window(f, (size - width) * k // (n - 1), width, last=k == n - 1)
    return out[:cap], 0


def _whole_row(tail: bytes) -> bool:
    """Whether an unterminated last line is a whole row (a file written without a final
    newline) rather than one being written."""
    try:
        return isinstance(loads(tail.decode("utf-8")), dict)
    except (Unreadable, ValueError):
        return False


def _row(line: bytes, keys: tuple[str, ...] | None) -> dict | None:
    try:
        raw = loads(line.decode("utf-8", errors="replace"))
    except Unreadable:
        return None
    if not isinstance(raw, dict):
        return None
    row = {k: c for k, v in raw.items() if (keys is None or k in keys or k == "step")
           and (c := clean_number(v)) is not None}
    return row if "step" in row else None


def metrics_rows(reader: FolderReader, run: Path, cap: int,
                 keys: tuple[str, ...] | None = None) -> list[dict]:
    """The run's numeric metrics rows (only `keys` when given), at most `cap`, spread over the
    run (module docstring); what is skipped is listed as a problem of `reader`."""
    path = Path(run) / "metrics.jsonl"
    if not os.path.lexists(path):
        return []
    try:
        with open_regular(reader.check(path)) as f:
            lines, long = sample_lines(f, os.fstat(f.fileno()).st_size, cap)
    except (Unreadable, OSError) as e:
        reader.refuse(path, e if isinstance(e, Unreadable) else e.strerror)
        return []
    rows = [r for line in lines if (r := _row(line, keys)) is not None]
    if long:
        reader.refuse(path, f"{long} rows longer than {MAX_LINE:,} bytes skipped")
    if len(rows) < len(lines):
        reader.refuse(path, f"{len(lines) - len(rows)} of the rows read are not JSON objects "
                            "with a numeric step; skipped")
    return rows

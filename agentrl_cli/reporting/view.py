"""`agentrl view`: a run folder or an `agentrl ablate` folder as one self-contained HTML file.

The page opens from disk with no network and no server: its data (the run's metrics, a sample
of its traces) is one JSON block and its drawing code (`view.js`, `view.css`: SVG charts, the
FOCUS tree, token views) is inline. Everything here reads plain JSON files; nothing is
executed from the folder, and a folder may come from someone else: every read is confined to
it, follows no symbolic link and is bounded (`folder_reader`), each trace is checked against
its schema (`trace_schema`), and a file that cannot be read is listed on the page instead of
stopping the report. Control characters never reach the page.

Size: at most `MAX_TRACES` trace files (each at most twice `traces.TRACE_CAP` bytes, evenly
spread over the run, the first and last kept) and `MAX_ROWS` metrics rows of at most
`metric_rows.MAX_LINE` bytes each, spread over the run (`metric_rows`), so a report of a run
the trainer wrote stays under about 5 MB whatever the run's length (docs/traces.md).
"""
from __future__ import annotations

import contextlib
import html
import json
import os
import re
import tempfile
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from ..errors import ConfigError
from .folder_reader import FolderReader, json_kind
from .metric_rows import metrics_rows
from .traces import load_trace, pick_steps, trace_steps

MAX_TRACES = 12
MAX_ROWS = 400                    # metrics rows of one run in the report (a FOCUS row is about 1.6-1.7 KB)
MAX_SWEEP_ROWS = 6000             # metrics rows of all a sweep's runs together (at least 50 a run)
SWEEP_KEYS = ("eval/success", "eval/success_se", "eval/tokens_per_question", "eval/tool_calls",
              "reward/mean", "success", "rollout/tokens", "rollout/tool_calls", "loss/policy",
              "loss/critic", "adv/std")
NUMBER = (int, float)
SUMMARY_TYPES = {"method": str, "env": str, "model": str, "seed": int, "steps": int,
                 **{k: NUMBER for k in ("base_success", "final_success", "base_success_se",
                                        "final_success_se", "tokens_generated")}}
# in the page's JSON: control characters (escaped by json.dumps, or raw), lone surrogates;
# an escaped backslash is matched first so that its text is kept
_UNPRINTABLE_JSON = re.compile(r'(\\\\)|\\u00[01][0-9a-fA-F]|\\[bfr]|[\x7f-\x9f\ud800-\udfff]')
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


class Report(NamedTuple):
    path: Path
    size: int                     # bytes
    problems: list[dict]          # files that could not be read: {file, reason}
    more: int                     # problems beyond those listed


def is_sweep(path: Path) -> bool:
    return any(os.path.lexists(Path(path) / n) for n in ("ablation.json", "cells"))


def is_run(path: Path) -> bool:
    return any(os.path.lexists(Path(path) / n) for n in ("metrics.jsonl", "config.json"))


def write_report(path: Path, out: Path | None = None) -> Report:
    """Write the report of the run or sweep folder `path` to `out` (default
    `<path>/report.html`) at once (a temporary file renamed: an error leaves no partial
    file); returns the file, its size and what could not be read."""
    path = Path(path)
    if is_sweep(path):
        data = sweep_data(path)
    elif is_run(path):
        data = run_data(path)
    else:
        raise ConfigError(f"{path} is neither a run folder (metrics.jsonl, config.json) nor an "
                          "agentrl ablate folder (ablation.json, cells/)")
    out = Path(out) if out is not None else path / "report.html"
    text = page(data).encode("utf-8")
    write_atomic(out, text)
    return Report(out, len(text), data["problems"], data["problems_left_out"])


def write_atomic(out: Path, data: bytes) -> None:
    """`data` as the file `out`, whole or not at all: written to a temporary file beside it,
    then renamed; on any error the temporary file is removed, and an OSError (a full disk)
    is one line."""
    tmp = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
        try:
            left = memoryview(data)
            while left:
                left = left[os.write(fd, left):]
            os.fchmod(fd, 0o644)
        finally:
            os.close(fd)
        os.replace(tmp, out)
    except BaseException as e:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(e, OSError):
            raise ConfigError(f"could not write {out}: {e.strerror or e}; "
                              "no report written") from None
        raise


def printable(text) -> str:
    """`text` without control characters (a newline or a NUL included) or lone surrogates."""
    return _UNPRINTABLE.sub("", str(text))


def page(data: dict) -> str:
    """The HTML page: styles, the data as JSON (control characters removed; no `<` inside,
    so it cannot end its script element) and the script, all inline."""
    assets = resources.files(__package__)
    css = assets.joinpath("view.css").read_text(encoding="utf-8")
    js = assets.joinpath("view.js").read_text(encoding="utf-8")
    blob = json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    blob = _UNPRINTABLE_JSON.sub(lambda m: m.group(1) or "", blob).replace("<", "\\u003c")
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(printable(data['title']))}</title>\n<style>\n{css}</style></head>\n"
            "<body><div id=\"app\"></div>\n"
            f"<script type=\"application/json\" id=\"data\">{blob}</script>\n"
            f"<script>\n{js}</script>\n</body></html>\n")


def setting(reader: FolderReader, path: Path, data: dict, key: str, kind: type):
    """The dotted `key` of the JSON object `data` (read from `path`) when it is a `kind`
    (str or int); None when missing, and None with a problem listed when of another type."""
    value, parts = data, key.split(".")
    for i, part in enumerate(parts):
        if not isinstance(value, dict):
            reader.refuse(path, f"{'.'.join(parts[:i])} is {json_kind(value)}, not an object")
            return None
        value = value.get(part)
        if value is None:
            return None
    if isinstance(value, kind) and not isinstance(value, bool):
        return value
    reader.refuse(path, f"{key} is {json_kind(value)}, not "
                        f"{'a string' if kind is str else 'an integer'}")
    return None


def summary_of(reader: FolderReader, path: Path) -> dict:
    """A run's summary.json: its values of the types the page reads (SUMMARY_TYPES; any
    other key a number, a string or null); a value of another type is left out and listed."""
    out = {}
    for key, value in (reader.json(path) or {}).items():
        want = SUMMARY_TYPES.get(key, (str, int, float))
        if value is None or isinstance(value, want) and not isinstance(value, bool):
            out[key] = value
        else:
            reader.refuse(path, f"{key} is {json_kind(value)}, not "
                                f"{'a number' if want in (NUMBER, int) else 'a string'}; left out")
    return out


def _first(*xs):
    return next((x for x in xs if x is not None), None)


def _traces(reader: FolderReader, run: Path) -> tuple[list[dict], list[int]]:
    """(at most MAX_TRACES readable traces spread over the run, every traced step)."""
    steps = trace_steps(run, reader)
    traces = []
    for s in pick_steps(list(steps), MAX_TRACES):
        try:
            traces.append(load_trace(reader.check(steps[s])))
        except ValueError as e:        # Unreadable, UnicodeDecodeError, a schema mismatch
            reader.refuse(steps[s], f"not a readable trace: {e}")
    return traces, list(steps)


def run_data(run: Path) -> dict:
    """What the page shows of one run folder."""
    run = Path(run)
    reader = FolderReader(run)
    config = reader.json(run / "config.json") or {}
    summary = summary_of(reader, run / "summary.json")

    def conf(key, kind):
        return setting(reader, run / "config.json", config, key, kind)

    env, model = _first(conf("env.name", str), summary.get("env")), \
        _first(conf("model.name", str), summary.get("model"))
    method = _first(conf("method", str), summary.get("method"))
    traces, traced = _traces(reader, run)
    data = {"kind": "run", "title": f"{run.name} · {method or 'run'} on {env or '?'}",
            "name": run.name, "path": str(run), "method": method, "env": env, "model": model,
            "seed": _first(conf("seed", int), summary.get("seed")),
            "steps": _first(conf("train.steps", int), summary.get("steps")),
            "trace_every": conf("train.trace_every", int),
            "summary": summary, "metrics": metrics_rows(reader, run, MAX_ROWS), "traces": traces,
            "traced_steps": traced}
    return {**data, "problems": reader.problems, "problems_left_out": reader.more}


def _plain_name(name) -> bool:
    """A cell's name names one folder inside `cells/` (no path, no `..`)."""
    return (isinstance(name, str) and name not in ("", ".", "..") and len(name) <= 255
            and not any(c in name for c in "/\\\0"))


def ablation_record(reader: FolderReader, path: Path) -> dict:
    """ablation.json's cells ({name, method, params}), seeds and budget, of the types the
    page reads; what is of another type is left out and listed."""
    raw = reader.json(path) or {}
    cells = raw.get("cells", [])
    if not isinstance(cells, list):
        reader.refuse(path, f"cells is {json_kind(cells)}, not a list")
        cells = []
    out = []
    for i, c in enumerate(cells):
        ok = isinstance(c, dict) and isinstance(c.get("name"), str)
        params = (c.get("params") or {}) if ok else {}
        if not ok or not isinstance(params, dict) or not all(
                v is None or isinstance(v, (str, int, float)) for v in params.values()):
            reader.refuse(path, f"cells[{i}] is not {{name, method, params}} with a name and "
                                "flat params; left out")
            continue
        method = c.get("method") if isinstance(c.get("method"), str) else None
        out.append({"name": c["name"], "method": method, "params": params})
    seeds = raw.get("seeds")
    if seeds is not None and not (isinstance(seeds, list)
                                  and all(isinstance(x, (int, str)) for x in seeds)):
        reader.refuse(path, f"seeds is {json_kind(seeds)}, not a list of seeds")
        seeds = None
    return {"cells": out, "seeds": seeds,
            "budget_tokens": setting(reader, path, raw, "budget_tokens", int)}


def _seed(folder: Path):
    seed = folder.name.split("-", 1)[1]
    return int(seed) if re.fullmatch(r"[0-9]{1,9}", seed) else seed


def sweep_runs(reader: FolderReader, sweep: Path, names: list) -> dict[str, list[Path]]:
    """Each cell's seed folders (`<sweep>/cells/<cell>/seed-<S>/`); a cell named by a path
    (one that would leave `cells/`) is refused and listed."""
    runs = {}
    for name in names:
        if not _plain_name(name):
            reader.refuse(sweep / "ablation.json", f"cell {str(name)[:200]!r} is not a folder "
                                                   "name inside cells/; not read")
            continue
        runs[name] = [d for d in reader.folders(sweep / "cells" / name)
                      if d.name.startswith("seed-")]
    return runs


def sweep_data(sweep: Path) -> dict:
    """What the page shows of an `agentrl ablate` folder: every cell's seeds' curves and
    summaries (`<sweep>/cells/<cell>/seed-<S>/`), and the swept parameters of each cell."""
    sweep = Path(sweep)
    reader = FolderReader(sweep)
    record = ablation_record(reader, sweep / "ablation.json")
    known = {c["name"]: c for c in record["cells"]}
    listed = [p.name for p in reader.folders(sweep / "cells")]
    folders = sweep_runs(reader, sweep, list(dict.fromkeys([*known, *listed])))
    cap = min(MAX_ROWS, max(50, MAX_SWEEP_ROWS // max(1, sum(map(len, folders.values())))))
    cells = []
    for name, seeds in folders.items():
        runs = [{"seed": _seed(d), "path": str(d), "summary": summary_of(reader, d / "summary.json"),
                 "metrics": metrics_rows(reader, d, cap, SWEEP_KEYS)} for d in seeds]
        info = known.get(name, {})
        cells.append({"name": name, "method": info.get("method") or _run_method(runs),
                      "params": info.get("params") or {}, "runs": runs})
    axes = sorted({k for c in cells for k in c["params"]})
    return {"kind": "sweep", "title": f"{sweep.name} · sweep of {len(cells)} cells",
            "name": sweep.name, "path": str(sweep), "axes": axes, "cells": cells,
            "budget_tokens": record["budget_tokens"], "seeds": record["seeds"],
            "problems": reader.problems, "problems_left_out": reader.more}


def _run_method(runs: list[dict]) -> str | None:
    return next((r["summary"].get("method") for r in runs if r["summary"].get("method")), None)

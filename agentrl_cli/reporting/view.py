"""`agentrl view`: a run folder or an `agentrl ablate` folder as one self-contained HTML file.

The page opens from disk with no network and no server: its data (the run's metrics, a sample
of its traces) is one JSON block and its drawing code (`view.js`, `view.css`: SVG charts, the
FOCUS tree, token views) is inline. Everything here reads plain JSON files; nothing is
executed from the folder, and every file read is bounded (a folder may come from someone else).

Size: at most `MAX_TRACES` trace files (each at most `traces.TRACE_CAP` bytes, evenly spread
over the run, the first and last kept) and `MAX_ROWS` metrics rows (every held-out check kept),
so a report stays under about 5 MB whatever the run's length (docs/traces.md).
"""
from __future__ import annotations

import html
import json
import math
from importlib import resources
from pathlib import Path

from ..errors import ConfigError
from .metrics import read_metrics
from .traces import pick_steps, read_trace, trace_steps

MAX_TRACES = 12
MAX_ROWS = 450                    # metrics rows of one run in the report (a FOCUS row is about 1.4 KB)
MAX_JSON = 1 << 20                # bytes of a summary.json, config.json or ablation.json read
MAX_METRICS = 64 << 20            # bytes of a metrics.jsonl read
SWEEP_KEYS = ("eval/success", "eval/success_se", "eval/tokens_per_question", "eval/tool_calls",
              "reward/mean", "success", "rollout/tokens", "rollout/tool_calls", "loss/policy",
              "loss/critic", "adv/std")


def is_sweep(path: Path) -> bool:
    return (Path(path) / "ablation.json").is_file() or (Path(path) / "cells").is_dir()


def is_run(path: Path) -> bool:
    return any((Path(path) / n).is_file() for n in ("metrics.jsonl", "config.json"))


def write_report(path: Path, out: Path | None = None) -> tuple[Path, int]:
    """Write the report of the run or sweep folder `path` to `out` (default
    `<path>/report.html`); returns (the file, its size in bytes)."""
    path = Path(path)
    if is_sweep(path):
        data = sweep_data(path)
    elif is_run(path):
        data = run_data(path)
    else:
        raise ConfigError(f"{path} is neither a run folder (metrics.jsonl, config.json) nor an "
                          "agentrl ablate folder (ablation.json, cells/)")
    out = Path(out) if out is not None else path / "report.html"
    text = page(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    return out, len(text.encode("utf-8"))


def page(data: dict) -> str:
    """The HTML page: styles, the data as JSON (no `<` inside, so it cannot end its script
    element) and the script, all inline."""
    assets = resources.files(__package__)
    css = assets.joinpath("view.css").read_text(encoding="utf-8")
    js = assets.joinpath("view.js").read_text(encoding="utf-8")
    blob = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(data['title'])}</title>\n<style>\n{css}</style></head>\n"
            "<body><div id=\"app\"></div>\n"
            f"<script type=\"application/json\" id=\"data\">{blob}</script>\n"
            f"<script>\n{js}</script>\n</body></html>\n")


def _read_json(path: Path) -> dict | None:
    """A small JSON object file, None when it is missing, too big or not an object."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_JSON:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _clean(x):
    """A metric value for the page: finite numbers (6 significant digits), else None."""
    if isinstance(x, bool):
        return float(x)
    if isinstance(x, (int, float)) and math.isfinite(x):
        return float(f"{x:.6g}")
    return None


def metrics_rows(run: Path, keys: tuple[str, ...] | None = None) -> list[dict]:
    """The run's numeric metrics rows (only `keys` when given), at most MAX_ROWS of them:
    every held-out check and the last row are kept, the other rows thinned evenly."""
    f = Path(run) / "metrics.jsonl"
    if not f.is_file() or f.stat().st_size > MAX_METRICS:
        return []
    try:
        raw = read_metrics(f)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    rows = [{k: c for k, v in r.items() if (keys is None or k in keys or k == "step")
             and (c := _clean(v)) is not None} for r in raw]
    rows = [r for r in rows if "step" in r]
    if len(rows) > MAX_ROWS:
        every = math.ceil(len(rows) / MAX_ROWS)
        rows = [r for i, r in enumerate(rows)
                if i % every == 0 or "eval/success" in r or i == len(rows) - 1]
    return rows


def run_data(run: Path) -> dict:
    """What the page shows of one run folder."""
    run = Path(run)
    config = _read_json(run / "config.json") or {}
    summary = _read_json(run / "summary.json") or {}
    steps = trace_steps(run)
    shown = pick_steps(list(steps), MAX_TRACES)
    traces, unreadable = [], []
    for s in shown:
        try:
            traces.append(read_trace(steps[s]))
        except ConfigError as e:
            unreadable.append(str(e))
    env = (config.get("env") or {}).get("name") or summary.get("env")
    model = (config.get("model") or {}).get("name") or summary.get("model")
    method = config.get("method") or summary.get("method")
    return {"kind": "run", "title": f"{run.name} · {method or 'run'} on {env or '?'}",
            "name": run.name, "path": str(run), "method": method, "env": env, "model": model,
            "seed": config.get("seed", summary.get("seed")),
            "steps": (config.get("train") or {}).get("steps", summary.get("steps")),
            "trace_every": (config.get("train") or {}).get("trace_every"),
            "summary": summary, "metrics": metrics_rows(run), "traces": traces,
            "traced_steps": list(steps), "unreadable": unreadable}


def sweep_data(sweep: Path) -> dict:
    """What the page shows of an `agentrl ablate` folder: every cell's seeds' curves and
    summaries (`<sweep>/cells/<cell>/seed-<S>/`), and the swept parameters of each cell."""
    sweep = Path(sweep)
    record = _read_json(sweep / "ablation.json") or {}
    known = {c.get("name"): c for c in record.get("cells", []) if isinstance(c, dict)}
    cells = []
    names = sorted(p.name for p in (sweep / "cells").iterdir() if p.is_dir()) \
        if (sweep / "cells").is_dir() else []
    for name in dict.fromkeys([*known, *names]):
        folder = sweep / "cells" / str(name)
        runs = []
        for d in sorted(folder.glob("seed-*")) if folder.is_dir() else []:
            seed = d.name.split("-", 1)[1]
            runs.append({"seed": int(seed) if seed.isdigit() else seed, "path": str(d),
                         "summary": _read_json(d / "summary.json") or {},
                         "metrics": metrics_rows(d, SWEEP_KEYS)})
        info = known.get(name, {})
        cells.append({"name": name, "method": info.get("method") or _run_method(runs),
                      "params": info.get("params") or {}, "runs": runs})
    axes = sorted({k for c in cells for k in c["params"]})
    return {"kind": "sweep", "title": f"{sweep.name} · sweep of {len(cells)} cells",
            "name": sweep.name, "path": str(sweep), "axes": axes, "cells": cells,
            "budget_tokens": record.get("budget_tokens"), "seeds": record.get("seeds")}


def _run_method(runs: list[dict]) -> str | None:
    return next((r["summary"].get("method") for r in runs if r["summary"].get("method")), None)

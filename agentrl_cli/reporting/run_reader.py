"""Reading finished run folders back for analysis (`agentrl diagnose table` and the other
analyses of past runs, docs/diagnostics.md): one place that knows a run folder's files
(docs/run-folder.md): `summary.json`, `config.json`, `metrics.jsonl`, `traces/step-*.json`, and
an `agentrl ablate` folder's `cells/*/seed-*` runs.

A metrics row is a training step's when it carries the metric the analysis asks for
(`steps(key)`), a check's when it carries `eval/success` (`checks`); step 0's check is the base
policy's."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .metrics import read_metrics
from .traces import read_trace, trace_steps

CHECK = "eval/success"            # the metric every held-out check logs


@dataclass(frozen=True)
class RunFolder:
    """A run folder as read once: its summary (None for a run that did not finish), config
    (None without config.json) and metrics rows in file order."""
    folder: Path
    summary: dict | None
    config: dict | None
    rows: list[dict]

    @property
    def label(self) -> str:
        """The arm a run belongs to: an ablate cell's name (the folder above `seed-N`), else
        the method its summary names."""
        if self.folder.name.startswith("seed-"):
            return self.folder.parent.name
        return (self.summary or {}).get("method", self.folder.name)

    @property
    def seed(self) -> int:
        return self.summary["seed"]

    def steps(self, key: str = "rollout/tokens") -> list[dict]:
        """The training steps' rows: those that logged `key`."""
        return [r for r in self.rows if key in r]

    def checks(self) -> list[dict]:
        """The held-out checks' rows, in file order (step 0 first: the base)."""
        return [r for r in self.rows if CHECK in r]

    def traces(self) -> Iterator[dict]:
        """The saved traces (`traces/step-*.json`), in step order, each checked against the
        trace schema (a trace that is not one is a one-line ConfigError)."""
        for f in trace_steps(self.folder).values():
            yield read_trace(f)


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def read_run(folder: Path, finished: bool = True) -> RunFolder | None:
    """The run in `folder`; None when `finished` and it has no summary.json (a run still
    going, or one that crashed)."""
    folder = Path(folder)
    summary = _json(folder / "summary.json")
    if finished and summary is None:
        return None
    metrics = folder / "metrics.jsonl"
    return RunFolder(folder, summary, _json(folder / "config.json"),
                     read_metrics(metrics) if metrics.is_file() else [])


def runs_under(paths: list[Path]) -> list[Path]:
    """Run folders: an ablate folder's cells/*/seed-*, or the folders given."""
    out = []
    for p in map(Path, paths):
        out += sorted(p.glob("cells/*/seed-*")) if (p / "cells").is_dir() else [p]
    return out

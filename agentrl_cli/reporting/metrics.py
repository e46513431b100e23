"""metrics.jsonl: one JSON object per step, fixed metric names (a run's figure is
`reporting.plots.learning_curve`)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from .sinks import open_sinks


class MetricsLog:
    """metrics.jsonl, plus the sinks named in `sinks` (train.log: tensorboard, wandb; see
    `reporting.sinks`), which get every row written. They open at the first row written, so a
    resumed run's TensorBoard drops the events a crashed run wrote after that step.
    `on_sinks(names)` is called once the sinks opened, with the names of those that did."""

    def __init__(self, path: Path, sinks: str = "", config: dict | None = None,
                 on_sinks: Callable[[list[str]], None] | None = None):
        self.path = Path(path)
        self.sink_spec, self.config, self.on_sinks = sinks, config, on_sinks
        self.sinks: list | None = None

    def reset(self) -> None:
        self._replace("")

    def truncate_after(self, step: int, on_torn: Callable[[str], None] | None = None) -> None:
        """On resume: drop rows a crashed run wrote after its checkpoint (and a torn last line)."""
        rows = read_metrics(self.path, on_torn) if self.path.exists() else []
        self._replace("".join(json.dumps(r) + "\n" for r in rows if r.get("step", 0) <= step))

    def _replace(self, text: str) -> None:
        """The whole file at once (temp file + rename): a kill leaves the old or the new one."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)

    def write(self, row: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
        if self.sinks is None:
            self.sinks = open_sinks(self.sink_spec, self.path.parent, self.config,
                                    first_step=int(row.get("step", 0)))
            if self.on_sinks is not None and self.sinks:
                self.on_sinks([s.name for s in self.sinks])
        for s in self.sinks:
            s.write(row)

    def close(self) -> None:
        for s in self.sinks or []:
            s.close()
        self.sinks = None


def read_metrics(path: Path, on_torn: Callable[[str], None] | None = None) -> list[dict]:
    """The rows of a metrics.jsonl. A torn last line (a write cut short by a kill) is dropped and
    reported through `on_torn`; a damaged line before the last is a ValueError (one line)."""
    lines = [(i, line) for i, line in enumerate(
        Path(path).read_text(encoding="utf-8", errors="replace").splitlines(), 1) if line.strip()]
    rows = []
    for j, (i, line) in enumerate(lines):
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not an object")
        except ValueError:
            if j == len(lines) - 1:
                if on_torn is not None:
                    on_torn(f"{path}: dropped a torn last line {i} (a write cut short)")
                break
            raise ValueError(f"{path}: line {i} is not a JSON object (the file is damaged)") from None
        rows.append(row)
    return rows

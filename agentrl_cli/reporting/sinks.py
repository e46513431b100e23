"""Where else a run's metrics go (`train.log`): TensorBoard event files and Weights & Biases.

`metrics.jsonl` is always written; each sink named in `train.log` (comma list) receives the same
rows: every numeric field of a row is one scalar under its own name (`loss/policy`,
`eval/success`, ...) at the row's `step`. A sink's package is imported only when it is chosen:
`tensorboard` writes `<run>/tensorboard/` with torch's SummaryWriter (needs the `tensorboard`
package: `pip install -e '.[tensorboard]'`); `wandb` calls `wandb.init(dir=<run>, ...)` and leaves
the mode to wandb's own settings, so `WANDB_MODE=offline` keeps the run on disk
(`wandb sync` uploads it later) and `WANDB_MODE=disabled` turns it off. The names a spec may
hold, and their check, are config's (`config.validation.SINKS`, `parse_sinks`).
"""
from __future__ import annotations

import json
import math
import uuid
from pathlib import Path

from ..config import parse_sinks

def scalars(row: dict) -> dict[str, float]:
    """The row's numeric fields (bools and non-finite values left out), `step` excluded."""
    out = {}
    for k, v in row.items():
        if k == "step" or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(v):
            out[k] = float(v)
    return out

class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, run: Path, config: dict | None = None, first_step: int = 0):
        try:
            # deferred: optional extra (tensorboard)
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise RuntimeError("train.log=tensorboard needs the tensorboard package: "
                               "pip install -e '.[tensorboard]'") from e
        # purge_step: events a crashed run wrote at or after the step this run writes first are
        # dropped, so a resumed run's curves have each step once
        self.writer = SummaryWriter(log_dir=str(Path(run) / "tensorboard"), purge_step=first_step)
        if config and first_step == 0:
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```", 0)

    def write(self, row: dict) -> None:
        for k, v in scalars(row).items():
            self.writer.add_scalar(k, v, int(row["step"]))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

class WandbSink:
    name = "wandb"

    def __init__(self, run: Path, config: dict | None = None, name: str = "", resume: bool = False):
        try:
            # deferred: optional extra (wandb)
            import wandb
        except ImportError as e:
            raise RuntimeError("train.log=wandb needs the wandb package: pip install wandb") from e
        self.wandb = wandb
        rid = _wandb_id(run)
        self.run = wandb.init(dir=str(run), name=name or Path(run).name, config=config or {},
                              id=rid, resume="allow" if resume else None)
        if not (Path(run) / "wandb_id").is_file():    # kept once the W&B run opened
            (Path(run) / "wandb_id").write_text(rid)

    def write(self, row: dict) -> None:
        self.run.log(scalars(row), step=int(row["step"]))

    def close(self) -> None:
        self.run.finish()

def _wandb_id(run: Path) -> str:
    """One W&B run id per run folder, kept in it (`wandb_id`, written once the W&B run opened)
    so a resumed run continues the same W&B run."""
    p = Path(run) / "wandb_id"
    if p.is_file():
        return p.read_text().strip()
    return uuid.uuid4().hex[:12]

def open_sinks(spec: str, run: Path, config: dict | None = None, first_step: int = 0) -> list:
    """The sinks named in `spec` (train.log) for the run folder `run`; `first_step` > 0 is a
    resumed run."""
    out = []
    for name in parse_sinks(spec):
        if name == "tensorboard":
            out.append(TensorBoardSink(run, config, first_step))
        elif name == "wandb":
            out.append(WandbSink(run, config, resume=first_step > 0))
    return out

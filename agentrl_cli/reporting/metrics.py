"""metrics.jsonl (one JSON object per step, fixed metric names) and learning-curve plots."""
from __future__ import annotations

import json
from pathlib import Path


class MetricsLog:
    def __init__(self, path: Path):
        self.path = Path(path)

    def reset(self) -> None:
        self.path.write_text("")

    def truncate_after(self, step: int) -> None:
        """On resume: drop rows a crashed run wrote after its last checkpoint."""
        rows = read_metrics(self.path) if self.path.exists() else []
        self.path.write_text("".join(json.dumps(r) + "\n" for r in rows if r["step"] <= step))

    def write(self, row: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot_learning_curve(metrics_path: Path, png: Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    tr = [r for r in rows if "success" in r]
    ev = [r for r in rows if "eval/success" in r]
    if tr:
        ax[0].plot([r["step"] for r in tr], [r["success"] for r in tr], alpha=0.6, label="train (sampled)")
    ax[0].plot([r["step"] for r in ev], [r["eval/success"] for r in ev], "o-", label="held-out")
    ax[0].set_xlabel("step"), ax[0].set_ylabel("success"), ax[0].legend(), ax[0].set_title(title)
    ax[1].plot([r["step"] for r in ev], [r["eval/tokens_per_question"] for r in ev], "o-")
    ax[1].set_xlabel("step"), ax[1].set_ylabel("generated tokens / eval question")
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)

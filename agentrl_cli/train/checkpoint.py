"""Checkpoints: an ordinary Hugging Face model folder plus the trainer state, written atomically.

Layout of `<out>/checkpoints/step-000010/`: the policy (`config.json`, `model.safetensors`,
tokenizer files) so `agentrl eval --checkpoint` and `--model` can load it directly, and
`trainer_state.pt` (optimiser, critic head, step, base metrics). Resuming continues exactly as
if never stopped: per-step random generators are derived from (seed, step), and the task order
from the seed, so model + optimiser + critic + step is the whole state.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from ..config import ConfigError

STATE_FILE = "trainer_state.pt"


def step_dir(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step-{step:06d}"


def save(out: Path, step: int, model, tokenizer, state: dict) -> Path:
    final = step_dir(out, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".step-{step:06d}.", dir=final.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    torch.save(state, tmp / STATE_FILE)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    (out / "checkpoints" / "latest").write_text(final.name)
    return final


def find(path: str | Path) -> Path:
    """A checkpoint folder from a run folder (its latest checkpoint) or a checkpoint folder."""
    p = Path(path)
    if (p / STATE_FILE).is_file():
        return p
    latest = p / "checkpoints" / "latest"
    if latest.is_file():
        c = p / "checkpoints" / latest.read_text().strip()
        if (c / STATE_FILE).is_file():
            return c
    raise ConfigError(f"no checkpoint found at {p}")


def load_state(ckpt: Path) -> dict:
    return torch.load(ckpt / STATE_FILE, map_location="cpu", weights_only=False)

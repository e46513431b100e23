"""Checkpoints: an ordinary Hugging Face model folder plus the trainer state, written atomically
and verified before use.

Layout of `<out>/checkpoints/step-000010/`: the policy (`config.json`, `model.safetensors`,
tokenizer files) so `agentrl eval --checkpoint` and `--model` can load it directly,
`trainer_state.pt` (optimiser, critic head, step, base metrics), and `manifest.json` (every
other file's size and sha256), written last. Resuming continues exactly as if never stopped:
per-step random generators are derived from (seed, step), and the task order from the seed, so
model + optimiser + critic + step is the whole state.

A checkpoint is built in a temp folder `.step-000010.xxxx` and renamed into place, so a kill
during a save leaves at most that temp folder (removed when the run folder is next opened,
`train.run_folder`). A checkpoint whose files do not match its manifest (truncated, emptied,
overwritten) is damaged: readers name it and take the newest one that verifies. A checkpoint
without a manifest (older builds) is accepted when its two state files are present and load.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import torch

from ..errors import ConfigError
from .run_folder import atomic_write_text

STATE_FILE = "trainer_state.pt"
WEIGHTS_FILE = "model.safetensors"
MANIFEST = "manifest.json"
_STEP = re.compile(r"^step-(\d+)$")


def step_dir(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step-{step:06d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder: Path) -> None:
    """manifest.json: {relative path: {size, sha256}} of every file in `folder` but itself."""
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            files[p.relative_to(folder).as_posix()] = {"size": p.stat().st_size,
                                                       "sha256": _sha256(p)}
    (folder / MANIFEST).write_text(json.dumps({"files": files}, indent=1))


def save(out: Path, step: int, model, tokenizer, state: dict) -> Path:
    final = step_dir(out, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".step-{step:06d}.", dir=final.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    torch.save(state, tmp / STATE_FILE)
    write_manifest(tmp)                   # last: a checkpoint with a manifest is complete
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    atomic_write_text(out / "checkpoints" / "latest", final.name)
    return final


def verify(ckpt: Path, hashes: bool = True) -> str | None:
    """Why `ckpt` is damaged, or None when it is whole. Sizes always; sha256 with `hashes`."""
    if not ckpt.is_dir():
        return "not a folder"
    man = ckpt / MANIFEST
    if not man.is_file():                 # an older build's checkpoint: no manifest to check
        for name in (STATE_FILE, WEIGHTS_FILE):
            if not (ckpt / name).is_file() or (ckpt / name).stat().st_size == 0:
                return f"{name} missing or empty"
        return None
    try:
        files = json.loads(man.read_text())["files"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return f"{MANIFEST} unreadable"
    for name in (STATE_FILE, WEIGHTS_FILE):
        if name not in files:
            return f"{MANIFEST} does not list {name}"
    for name, meta in files.items():
        p = ckpt / name
        if not p.is_file():
            return f"{name} missing"
        size = p.stat().st_size
        if size != meta["size"]:
            return f"{name} has {size} bytes, the manifest says {meta['size']}"
        if hashes and _sha256(p) != meta["sha256"]:
            return f"{name} does not match its sha256 in the manifest"
    return None


def is_checkpoint(path: Path) -> bool:
    """A checkpoint folder (as opposed to a run folder)."""
    p = Path(path)
    return bool(_STEP.match(p.name)) and p.parent.name == "checkpoints" or (
        (p / STATE_FILE).is_file() and not (p / "checkpoints").is_dir())


def steps_newest_first(run: Path) -> list[Path]:
    """The run's `checkpoints/step-N` folders, newest first (whatever `latest` says)."""
    d = Path(run) / "checkpoints"
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _STEP.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found, reverse=True)]


def find(path: str | Path, log: Callable[[str], None] | None = None, hashes: bool = False) -> Path:
    """A checkpoint folder from a run folder (its newest checkpoint that verifies; damaged ones
    are named through `log` and skipped) or a checkpoint folder (an error if it is damaged)."""
    p = Path(path)
    if is_checkpoint(p):
        why = verify(p, hashes)
        if why:
            raise ConfigError(f"checkpoint {p} is damaged: {why}")
        return p
    damaged = []
    for c in steps_newest_first(p):
        why = verify(c, hashes)
        if why is None:
            if damaged and log:
                log(f"using {c.name}: " + "; ".join(f"{d.name} is damaged ({w})" for d, w in damaged))
            return c
        damaged.append((c, why))
    if damaged:
        raise ConfigError(f"no usable checkpoint in {p}: " +
                          "; ".join(f"{d.name} is damaged ({w})" for d, w in damaged))
    raise ConfigError(f"no checkpoint found at {p}")


def load_state(ckpt: Path) -> dict:
    return torch.load(ckpt / STATE_FILE, map_location="cpu", weights_only=False)


def load_for_resume(path: str | Path, log: Callable[[str], None] = print):
    """(checkpoint folder, trainer state, policy weights) to resume from, or None when the run
    has no checkpoint yet. From a run folder: the newest checkpoint that verifies (sizes and
    hashes) and loads; each damaged one is named and skipped. From a checkpoint folder: that
    one, or a one-line error if it is damaged."""
    from safetensors.torch import load_file

    p = Path(path)
    candidates = [p] if is_checkpoint(p) else steps_newest_first(p)
    damaged = []
    for c in candidates:
        why = verify(c, hashes=True)
        if why is None:
            try:
                state, weights = load_state(c), load_file(str(c / WEIGHTS_FILE))
            except Exception as e:  # an older checkpoint without a manifest, cut short
                why = f"does not load ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            else:
                for d, w in damaged:
                    log(f"skipping damaged checkpoint {d}: {w}")
                return c, state, weights
        damaged.append((c, why))
    if damaged:
        raise ConfigError(f"no usable checkpoint in {p} ("
                          + "; ".join(f"{d.name}: {w}" for d, w in damaged)
                          + "); start over with --overwrite")
    return None

"""Checkpoints: an ordinary Hugging Face model folder plus the trainer state, written atomically
and verified before use.

Layout of `<out>/checkpoints/step-000010/`: the policy (`config.json`, `model.safetensors`,
tokenizer files; with LoRA, `model.lora_rank > 0`, the adapters instead: `adapter_config.json`,
`adapter_model.safetensors`, which load over the base model that `adapter_config.json` names)
so `agentrl eval --checkpoint` and `--model` can load it directly,
`trainer_state.pt` (optimiser, critic head, step, base metrics), and `manifest.json` (every
other file's size and sha256), written last. Resuming continues exactly as if never stopped:
per-step random generators are derived from (seed, step), and the task order from the seed, so
model + optimiser + critic + step is the whole state.

A checkpoint may come from someone else, so it is data, never code: `trainer_state.pt` holds
tensors and plain data only (dicts, lists, tuples, numbers, strings; RNG states as tensors or
lists: `plain_state` converts and checks before the save) and loads with
`torch.load(weights_only=True)`; a file that needs anything else (a pickle that would build
objects or run code) is refused with one line (`UnsafeCheckpoint`).

A checkpoint is built in a temp folder `.step-000010.xxxx` and renamed into place, so a kill
during a save leaves at most that temp folder (removed when the run folder is next opened,
`train.run_folder`). Every read verifies the checkpoint against its manifest first (sizes and
sha256; `verify`): a checkpoint whose files do not match (truncated, emptied, overwritten, or
corrupted at the same size) or that has no manifest is damaged. `--resume` names each damaged
checkpoint and continues from the newest one that verifies (`load_for_resume`); every other
reader (`eval`, `rollout`, `diagnose`) calls `find`, which names the checkpoint it uses and
stops with a one-line error naming a damaged one (never an older checkpoint in its place).

`open_checkpoint` is the one place a checkpoint becomes a policy and a critic: a runtime built
from its folder and its critic rebuilt from `value_head` (`diagnose`, `eval`), or its weights
and critic loaded into a live runtime and critic (`--resume`); with a typed view of the rest of
its trainer state (`TrainerState`).
"""
from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import pickle
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch
from safetensors.torch import load_file

from ..errors import ConfigError
from ..models.critic import critic_from_checkpoint
from ..models.lora import ADAPTER_FILE, module_state
from ..rollout.runtime import build_runtime
from .run_folder import atomic_write_text

if TYPE_CHECKING:
    from ..config import RunConfig
    from ..rollout.runtime import Runtime

STATE_FILE = "trainer_state.pt"
WEIGHTS_FILE = "model.safetensors"
WEIGHT_FILES = (WEIGHTS_FILE, ADAPTER_FILE)   # a checkpoint holds one: full weights or adapters
MANIFEST = "manifest.json"
_STEP = re.compile(r"^step-(\d+)$")


class UnsafeCheckpoint(ConfigError):
    """A trainer state that is more than tensors and plain data (refused, never loaded)."""


def plain_state(obj, where: str = "state"):
    """`obj` as tensors and plain data only (what `torch.load(weights_only=True)` reads back):
    numpy arrays become tensors, numpy scalars Python numbers, sets sorted lists; anything else
    (an object, a function) is a TypeError naming where it is, raised before the save."""
    if obj is None or isinstance(obj, (bool, int, float, str, torch.Tensor, torch.dtype, torch.Size)):
        return obj
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k if isinstance(k, (str, int)) else str(k): plain_state(v, f"{where}[{k!r}]")
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        out = [plain_state(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return tuple(out) if isinstance(obj, tuple) else out
    if isinstance(obj, (set, frozenset)):
        return sorted(plain_state(v, where) for v in obj)
    raise TypeError(f"{where} is a {type(obj).__name__}: a checkpoint holds tensors and plain "
                    "data only")


def step_dir(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step-{step:06d}"


def sha256_file(path: Path) -> str:
    """A file's sha256, read in 1 MB blocks (checkpoint manifests, a run's env file)."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder: Path) -> None:
    """manifest.json: {relative path: {size, sha256}} of every file in `folder` but itself."""
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            files[p.relative_to(folder).as_posix()] = {"size": p.stat().st_size,
                                                       "sha256": sha256_file(p)}
    (folder / MANIFEST).write_text(json.dumps({"files": files}, indent=1))


class CheckpointWriteError(ConfigError):
    """A checkpoint that could not be written (a full disk, a quota, a folder gone): one line
    naming it and the last good checkpoint, which is kept."""


def save(out: Path, step: int, model, tokenizer, state: dict) -> Path:
    """Write the checkpoint of `step` (temp folder, manifest last, rename). A write that fails
    (`OSError`: no space left, ...; torch's and safetensors' own errors for a full disk) removes
    the temp folder, leaves the previous checkpoints and `latest` as they were, and raises
    `CheckpointWriteError` (one line: the checkpoint, that the disk is full, the last good
    one)."""
    final = step_dir(out, step)
    state = plain_state(state)            # a programming error stays a TypeError
    tmp = None
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".step-{step:06d}.", dir=final.parent))
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        torch.save(state, tmp / STATE_FILE)
        write_manifest(tmp)               # last: a checkpoint with a manifest is complete
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        tmp = None
        atomic_write_text(out / "checkpoints" / "latest", final.name)
    except Exception as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        why, full = write_failure(e, final.parent)
        if why is None:                   # not the disk's doing: a bug keeps its traceback
            raise
        good = next((c for c in steps_newest_first(out) if c != final or tmp is None), None)
        kept = (f"the last good checkpoint, {good}, is kept" if good is not None
                else "the run has no earlier checkpoint")
        raise CheckpointWriteError(
            f"cannot write checkpoint {final} ({why})"
            + (f": the disk that holds {final.parent} is full" if full else "")
            + f"; {kept}; free space and continue with --resume {out}") from None
    return final


DISK_FULL_TEXT = ("No space left", "StorageFull", "write failed", "unexpected pos")


def write_failure(e: BaseException, folder: Path) -> tuple[str | None, bool]:
    """(why a checkpoint write failed, whether the disk is full), or (None, False) when `e` is
    not a failed write. `OSError` says so itself (ENOSPC, EDQUOT); torch (`RuntimeError`:
    "file write failed", "unexpected pos") and safetensors ("StorageFull") wrap it in text,
    so their case is read from the text and the folder's free space."""
    if isinstance(e, OSError):
        return e.strerror or str(e), e.errno in (errno.ENOSPC, errno.EDQUOT)
    text = str(e)
    if not any(t in text for t in DISK_FULL_TEXT):
        return None, False
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = 0
    full = "No space left" in text or "StorageFull" in text or free < (1 << 20)
    return ("No space left on device" if full else text.splitlines()[0][:200]), full


def verify(ckpt: Path, hashes: bool = True) -> str | None:
    """Why `ckpt` is damaged, or None when it is whole. Sizes always; sha256 with `hashes`."""
    if not ckpt.is_dir():
        return "not a folder"
    man = ckpt / MANIFEST
    if not man.is_file():                 # nothing vouches for its files
        return f"no {MANIFEST} (the sizes and sha256 of its files)"
    try:
        files = json.loads(man.read_text())["files"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return f"{MANIFEST} unreadable"
    if not isinstance(files, dict):
        return f"{MANIFEST} unreadable"
    if STATE_FILE not in files:
        return f"{MANIFEST} does not list {STATE_FILE}"
    if not any(name in files for name in WEIGHT_FILES):
        return f"{MANIFEST} lists neither {' nor '.join(WEIGHT_FILES)}"
    for name, meta in files.items():
        if not isinstance(meta, dict) or not isinstance(meta.get("size"), int) or (
                not isinstance(meta.get("sha256"), str)) or ".." in Path(name).parts:
            return f"{MANIFEST} unreadable"
        p = ckpt / name
        if not p.is_file():
            return f"{name} missing"
        size = p.stat().st_size
        if size != meta["size"]:
            return f"{name} has {size} bytes, the manifest says {meta['size']}"
        if hashes and sha256_file(p) != meta["sha256"]:
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


def find(path: str | Path, log: Callable[[str], None] | None = None) -> Path:
    """The checkpoint a command reads, verified against its manifest (sizes and sha256): a
    checkpoint folder, or a run folder's newest checkpoint. Named through `log`; a damaged one
    is a one-line error naming it (and the newest one that verifies, to pass instead), never
    silently replaced by an older one. Every reader but `--resume` calls this."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"no checkpoint found at {p}")
    if is_checkpoint(p):
        ckpt = p
    else:
        found = steps_newest_first(p)
        if not found:
            raise ConfigError(f"no checkpoint found at {p}")
        ckpt = found[0]
    why = verify(ckpt)
    if why:
        whole = next((c for c in (steps_newest_first(ckpt.parent.parent)
                                  if ckpt.parent.name == "checkpoints" else [])
                      if c != ckpt and verify(c) is None), None)
        raise ConfigError(f"checkpoint {ckpt} is damaged: {why}" + (
            f" (the newest whole one is {whole}: pass --checkpoint {whole} to use it)"
            if whole is not None else ""))
    load_state(ckpt, mmap=True)           # refused now, before any work, if it is not data
    if log is not None:
        log(f"checkpoint: {ckpt} (verified)")
    return ckpt


def load_state(ckpt: Path, mmap: bool = False) -> dict:
    """The trainer state of a checkpoint, as tensors and plain data (`weights_only=True`): a
    file that would need to build any other object is `UnsafeCheckpoint`, and is not run.
    `mmap`: tensors stay on disk until read (a cheap check of the whole structure). A file
    that is not a torch zip archive (a plain or legacy pickle) is `UnsafeCheckpoint` too: only
    an unsafe load could read it."""
    f = Path(ckpt) / STATE_FILE
    if not zipfile.is_zipfile(f):
        raise UnsafeCheckpoint(
            f"{f} cannot be read safely: it is a plain or legacy pickle, not the trainer state "
            "agentrl writes (a torch zip archive of tensors and plain data, which loads without "
            f"running code); evaluate its weights alone with agentrl eval --model {ckpt}")
    try:
        state = torch.load(f, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        first = next((ln.strip() for ln in str(e).splitlines() if "GLOBAL" in ln or "global" in ln), "")
        raise UnsafeCheckpoint(f"{f} holds more than tensors and plain data, refused (loading it "
                               f"could run code){': ' + first if first else ''}") from None
    if not isinstance(state, dict):
        raise UnsafeCheckpoint(f"{f} is not a trainer state (a {type(state).__name__})")
    return state


def _weights(ckpt: Path, load_file) -> dict:
    """The policy weights of a whole checkpoint: full weights, or its adapters keyed as the
    PEFT module's state dict."""
    if (ckpt / WEIGHTS_FILE).is_file():
        return load_file(str(ckpt / WEIGHTS_FILE))
    return module_state(load_file(str(ckpt / ADAPTER_FILE)))


def load_for_resume(path: str | Path, log: Callable[[str], None] = print):
    """(checkpoint folder, trainer state, policy weights) to resume from, or None when the run
    has no checkpoint yet. From a run folder: the newest checkpoint that verifies (sizes and
    hashes) and loads; each damaged one is named and skipped. From a checkpoint folder: that
    one, or a one-line error if it is damaged. The weights are keyed as the policy module's
    state dict (a LoRA checkpoint's adapters as the PEFT model names them)."""
    p = Path(path)
    candidates = [p] if is_checkpoint(p) else steps_newest_first(p)
    damaged = []
    for c in candidates:
        why = verify(c, hashes=True)
        if why is None:
            try:
                state, weights = load_state(c), _weights(c, load_file)
            except UnsafeCheckpoint:
                raise                     # not damaged but hostile: stop, whatever is older
            except Exception as e:  # whole by its manifest, yet does not load
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


# ------------------------------------------------------------------ a checkpoint, opened
@dataclass(frozen=True)
class TrainerState:
    """A typed view of a checkpoint's `trainer_state.pt` (what `train.loop.save` writes). A key
    the file lacks is None here (a state written by hand, or before the key existed); readers
    that need one (resuming needs `optimizer`, `step`, `base_eval`, `tokens_total`) say so. It
    holds no RNG states: each step's generators are derived from (seed, step), the task order
    from the seed (module docstring)."""

    step: int | None
    optimizer: dict | None                # the optimiser's state_dict
    value_head: dict | None               # the critic's state_dict (None: critic-free method)
    critic_config: dict | None            # a separate critic's architecture (`model.critic_path`)
    base_eval: dict | None                # the step-0 held-out check
    last_eval: dict | None                # the held-out check in force at the checkpoint
    tokens_total: int | None              # generated tokens so far
    rollout_carry: dict                   # the rollouts' carried budget ({} when none)
    method: str | None
    raw: dict = field(repr=False, default_factory=dict)   # the state as loaded, every key

    @classmethod
    def of(cls, state: dict) -> TrainerState:
        """The view of a loaded state (`load_state`)."""
        return cls(state.get("step"), state.get("optimizer"), state.get("value_head"),
                   state.get("critic_config"), state.get("base_eval"), state.get("last_eval"),
                   state.get("tokens_total"), state.get("rollout_carry") or {},
                   state.get("method"), state)


@dataclass
class OpenedCheckpoint:
    """A checkpoint as a policy, its critic and its trainer state (`open_checkpoint`)."""

    path: Path                            # the checkpoint folder
    runtime: Runtime                      # the policy (model, tokenizer, chat format), env, engine
    critic: torch.nn.Module | None        # None: critic-free method (or not asked for)
    state: TrainerState

    @property
    def policy(self) -> torch.nn.Module:
        return self.runtime.model


def open_checkpoint(path: str | Path, cfg: RunConfig, *, log: Callable[[str], None] = print,
                    greedy: bool = False, with_critic: bool = True, verified: bool = False,
                    into: Runtime | None = None, into_critic: torch.nn.Module | None = None,
                    loaded: tuple[dict, dict] | None = None) -> OpenedCheckpoint:
    """The one place a checkpoint becomes a policy and a critic.

    Fresh (`into` None; `diagnose`, `eval`): `path` is a checkpoint folder or a run folder (its
    newest checkpoint), verified by `find` (`verified`: `path` is a checkpoint folder `find`
    already verified); the runtime is `rollout.runtime.build_runtime` of `cfg` with
    `model.name` set to the checkpoint folder (`log`, `greedy` passed on), and the critic is
    rebuilt from the state's `value_head` next to the policy, in eval mode
    (`models.critic.critic_from_checkpoint`; None for a critic-free method, or without
    `with_critic`). The state is read memory-mapped: an optimiser's state is not read in.

    Into a live run (`into`: `--resume`): the checkpoint's weights load into `into.model`
    (`strict=False`: a LoRA checkpoint holds the adapters only) and its `value_head` into
    `into_critic` when both are there (else the critic stays as it is); `loaded` is the
    (state, weights) `load_for_resume` already read, else they are read here."""
    if into is not None:
        return _open_into(Path(path), into, into_critic, loaded, log)
    ckpt = Path(path) if verified else find(path)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, name=str(ckpt)))
    rt = build_runtime(cfg, log, greedy=greedy)
    state = load_state(ckpt, mmap=True)
    critic = critic_from_checkpoint(state, rt.model) if with_critic else None
    return OpenedCheckpoint(ckpt, rt, critic, TrainerState.of(state))


def _open_into(ckpt: Path, rt: Runtime, critic: torch.nn.Module | None,
               loaded: tuple[dict, dict] | None, log: Callable[[str], None]) -> OpenedCheckpoint:
    """`open_checkpoint` into a live runtime and critic (its docstring)."""
    if loaded is None:
        found = load_for_resume(ckpt, log)
        if found is None:
            raise ConfigError(f"no checkpoint found at {ckpt}")
        ckpt, state, weights = found
    else:
        state, weights = loaded
    rt.model.load_state_dict(weights, strict=False)
    if critic is not None and state.get("value_head") is not None:
        critic.load_state_dict(state["value_head"])
    return OpenedCheckpoint(ckpt, rt, critic, TrainerState.of(state))

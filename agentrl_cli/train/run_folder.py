"""The run folder: the one owner of a training run's files.

`RunFolder.open` is the first thing a training run does, before any model is loaded:

- the folder must be a folder this process can write (else one line: an existing file, an
  unwritable place);
- an exclusive lock (`.lock`, `flock`, released by the kernel when the process dies however it
  dies): a second writer stops with a one-line error naming the holder's pid;
- a fresh run refuses a folder that already holds a run (continue it with `--resume`, or start
  over explicitly with `--overwrite`, which removes only the run's own files);
- temp folders and files a killed run left (`checkpoints/.step-*`, `.*.tmp`) are removed: with
  the lock held, no live process is writing them.

The run's files are named relative to the folder, never from a path saved inside it, so a moved
or copied run resumes where it is. Every file written whole is written atomically
(`atomic_write_text`: a temp file in the same folder, then a rename); `metrics.jsonl` is
appended one line per step (a kill can tear only its last line, which readers drop and report).
"""
from __future__ import annotations

import errno
import fcntl
import os
import shutil
from pathlib import Path
from typing import Callable

from ..errors import ConfigError

LOCK = ".lock"
# what a run writes, and all that --overwrite removes
RUN_FILES = ("config.json", "metrics.jsonl", "summary.json", "learning_curve.png", "checkpoints",
             "tensorboard", "wandb", "wandb_id")          # the last three: train.log sinks


def atomic_write_text(path: Path, text: str) -> None:
    """Write `path` whole or not at all: a temp file beside it, flushed, then renamed over it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def holds_run(path: Path) -> bool:
    """Whether `path` already holds (part of) a training run."""
    return any((Path(path) / name).exists() for name in RUN_FILES)


def check_output_dir(path: Path, what: str = "--out") -> None:
    """A folder that exists or can be created, and that this process can write; else one line."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{what} {path} is a file; give a folder")
    _writable_folder(path, f"{what} {path}", "the folder")


def _writable_folder(folder: Path, label: str, name: str) -> None:
    """Create `folder` if needed and check this process can write in it; else one line that
    starts with `label` (`name`: how the message calls the folder)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{label}: cannot create {name} ({e.strerror or e})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{label} is not writable")


def check_output_file(path: Path, what: str = "--out") -> None:
    """A file path whose folder exists or can be created and is writable, and that is not a
    folder; else one line (checked before any work, so results are never lost at the end)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{what} {path} is a folder; give a file name")
    parent = path.parent if str(path.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise ConfigError(f"{what} {path}: {parent} is a file, not a folder")
    _writable_folder(parent, f"{what} {path}", str(parent))
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{what} {path} is not writable")


class RunFolder:
    """An open, locked run folder (see the module docstring). Use as a context manager, or
    call `close()`."""

    def __init__(self, path: Path, fd: int):
        self.path, self._fd = Path(path), fd

    @classmethod
    def open(cls, path: str | Path, resume: bool = False, overwrite: bool = False,
             log: Callable[[str], None] = print) -> "RunFolder":
        path = Path(path)
        check_output_dir(path, "--resume" if resume else "--out")
        folder = cls(path, cls._lock(path))
        try:
            if not resume and holds_run(path):
                if not overwrite:
                    raise ConfigError(f"{path} already holds a run: continue it with --resume "
                                      f"{path}, or start over with --overwrite")
                folder.clear(log)
            folder.clean_temp(log)
        except BaseException:
            folder.close()
            raise
        return folder

    @staticmethod
    def _lock(path: Path) -> int:
        lock = path / LOCK
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(f"cannot lock the run folder {path} ({e.strerror or e})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConfigError(f"{path} is in use by another agentrl process (pid {holder}); "
                                  "wait for it to finish or stop it") from None
            raise ConfigError(f"cannot lock the run folder {path} ({e.strerror or e})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def clear(self, log: Callable[[str], None] = print) -> None:
        """--overwrite: remove the previous run's files (nothing else in the folder)."""
        removed = []
        for name in RUN_FILES:
            p = self.path / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()
            else:
                continue
            removed.append(name)
        log(f"--overwrite: removed the previous run's {', '.join(removed)} from {self.path}")

    def clean_temp(self, log: Callable[[str], None] = print) -> None:
        """Remove what a killed writer of this folder left: half-written checkpoints and temp
        files (only this process writes here while it holds the lock)."""
        stale = list((self.path / "checkpoints").glob(".step-*")) + list(self.path.glob(".*.tmp"))
        stale += list(self.path.glob(".*.tmp.*")) + list((self.path / "checkpoints").glob(".*.tmp"))
        for p in stale:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        if stale:
            log(f"removed {len(stale)} temp file(s) left by an interrupted run: "
                + ", ".join(p.name for p in stale))

    def close(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RunFolder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

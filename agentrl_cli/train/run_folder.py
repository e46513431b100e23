"""The run folder: the one owner of a training run's files.

`RunFolder.open` is the first thing a training run does, before any model is loaded:

- the folder must be a folder this process can write (else one line: an existing file, an
  unwritable place);
- an exclusive lock (`.lock`, `flock`, released by the kernel when the process dies however it
  dies): a second writer stops with a one-line error naming the holder's pid;
- the folder's marker `.agentrl-run.json` lists every file and folder name agentrl writes
  there (claimed when the run opens, before it is written); `--overwrite` removes exactly those
  and nothing else. A fresh run starts only in a new or empty folder or in a marked one; a
  folder that is not empty and has no marker is refused before anything in it is touched (not
  even the lock is created);
- a fresh run refuses a folder whose marker shows a run (continue it with `--resume`, or start
  over explicitly with `--overwrite`);
- a run folder of an older build (run files, no marker) still resumes; the marker it then gets
  lists none of the files it had, so `--overwrite` never removes them (it refuses);
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
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

from ..errors import ConfigError

LOCK = ".lock"
MARKER = ".agentrl-run.json"
MARKER_CAP = 1 << 20                      # a marker is a short list; a bigger file is not ours
# what a run may write (claimed in the marker when the run opens, where not already present);
# an older build's run folder, without a marker, is recognised by these names
RUN_FILES = ("config.json", "metrics.jsonl", "summary.json", "learning_curve.png", "checkpoints",
             "tensorboard", "wandb", "wandb_id",          # these three: train.log sinks
             "traces", "report.html")                     # train.trace_every; agentrl view


def atomic_write_text(path: Path, text: str) -> None:
    """Write `path` whole or not at all: a temp file beside it, flushed, then renamed over it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_marker(path: Path) -> dict | None:
    """The run folder's marker ({"files": [...], "resumes": [...]}), None when there is none;
    a marker that is not agentrl's JSON is a one-line error (its list cannot be trusted)."""
    p = Path(path) / MARKER
    if not p.exists() and not p.is_symlink():
        return None
    try:
        if p.is_symlink() or not p.is_file() or p.stat().st_size > MARKER_CAP:
            raise ValueError
        data = json.loads(p.read_text(encoding="utf-8"))
        if not (isinstance(data, dict) and isinstance(data.get("files"), list)
                and all(_plain_name(n) for n in data["files"])
                and isinstance(data.get("resumes", []), list)):
            raise ValueError
    except (ValueError, OSError, UnicodeDecodeError):
        raise ConfigError(f"{path}: {MARKER} is damaged (not the list of files agentrl wrote); "
                          "nothing in the folder was touched") from None
    return data


def _plain_name(name) -> bool:
    """A name directly inside the folder (no path: a marker can only name its own files)."""
    return (isinstance(name, str) and name not in ("", ".", "..", LOCK, MARKER)
            and "/" not in name and "\\" not in name and "\0" not in name)


def write_marker(path: Path, data: dict) -> None:
    atomic_write_text(Path(path) / MARKER, json.dumps(data, indent=1))


def record_resume(path: Path, record: dict) -> None:
    """Append what a resume changed (`record`) to the marker's `resumes` list; the run's
    config.json keeps the values it started with. Called with the folder's lock held."""
    marker = read_marker(path) or {"agentrl_run": 1, "files": [], "resumes": []}
    marker.setdefault("resumes", []).append(record)
    write_marker(path, marker)


def holds_run(path: Path) -> bool:
    """Whether `path` already holds (part of) a training run: a file its marker lists, or
    (no marker: an older build's run) one of the names an older build wrote."""
    marker = read_marker(path)
    names = marker["files"] if marker is not None else RUN_FILES
    return any((Path(path) / n).exists() or (Path(path) / n).is_symlink() for n in names)


def _foreign_entries(path: Path) -> list[str]:
    """What a folder without a marker holds (the lock file of an agentrl run aside)."""
    try:
        return sorted(p.name for p in Path(path).iterdir() if p.name != LOCK)
    except FileNotFoundError:
        return []


def _listing(names: list[str], most: int = 4) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


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
    try:                                  # os.access trusts the mode bits (root, /proc, ...)
        fd, probe = tempfile.mkstemp(prefix=".agentrl-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"{label}: cannot write in {name} ({e.strerror or e})") from None


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
             log: Callable[[str], None] = print, files: tuple[str, ...] = RUN_FILES) -> "RunFolder":
        """Check, lock and prepare the folder (see the module docstring); `files`: the names
        this run may write, claimed in the marker where the folder does not already hold them."""
        path = Path(path)
        label = "--resume" if resume else "--out"
        if path.exists() and not path.is_dir():
            raise ConfigError(f"{label} {path} is a file; give a folder")
        if path.is_dir() and read_marker(path) is None and not resume:
            cls._check_fresh(path, overwrite, files)  # before the lock: a refused folder gets nothing
        check_output_dir(path, label)
        folder = cls(path, cls._lock(path))
        try:
            marker = read_marker(path)    # again, under the lock
            if not resume:
                cls._check_fresh(path, overwrite, files)
                if marker is not None and overwrite:
                    folder.clear(marker, log)
                marker = None
            elif marker is None and holds_run(path):
                log(f"{path} was written by an older build (no {MARKER}): resuming it; "
                    "--overwrite will not remove the files it already had")
            marker = marker or {"agentrl_run": 1, "files": [], "resumes": []}
            listed = set(marker["files"])
            for name in files:            # claim what this run will create
                if name not in listed and not (path / name).exists() and not (path / name).is_symlink():
                    marker["files"].append(name)
                    listed.add(name)
            write_marker(path, marker)
            folder.clean_temp(log)
        except BaseException:
            folder.close()
            raise
        return folder

    @staticmethod
    def _check_fresh(path: Path, overwrite: bool, files: tuple[str, ...] = RUN_FILES) -> None:
        """A fresh run: the folder is empty, or marked, (with --overwrite) clearable, and
        without a file of a run's names that the marker does not list."""
        marker = read_marker(path)
        if marker is None:
            foreign = _foreign_entries(path)
            if foreign:
                old = holds_run(path)
                raise ConfigError(
                    f"{path} is not an agentrl run folder: it holds {_listing(foreign)} and no "
                    f"{MARKER}; " + (f"a run of an older build continues with --resume {path} "
                                     "(--overwrite removes only files a run recorded)"
                                     if old else "give a new or empty folder"))
            return
        if not overwrite and holds_run(path):
            raise ConfigError(f"{path} already holds a run: continue it with --resume {path}, or "
                              "start over with --overwrite")
        listed = set(marker["files"])
        foreign = [n for n in files if n not in listed and ((path / n).exists() or (path / n).is_symlink())]
        if foreign:                       # a new run would write into them
            raise ConfigError(f"{path} holds {_listing(foreign)}, which {MARKER} does not list "
                              "(not written by an agentrl run there): move it away or give "
                              "another folder")

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

    def clear(self, marker: dict, log: Callable[[str], None] = print) -> None:
        """--overwrite: remove what the previous run's marker lists (nothing else)."""
        removed = []
        for name in marker["files"]:
            if not _plain_name(name):
                continue
            p = self.path / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()
            else:
                continue
            removed.append(name)
        if removed:
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


def default_out(cfg) -> Path:
    """A run's folder: `out` when given, else runs/<time>-<method>-<env>."""
    if cfg.out:
        return Path(cfg.out)
    return Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.method}-{cfg.env.name}"

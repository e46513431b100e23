"""The run folder: the one owner of a training run's files.

`RunFolder.open` is the first thing a training run does, before any model is loaded:

- the folder must be a folder this process can write (else one line: an existing file, an
  unwritable place);
- an exclusive lock (`.lock`, `flock`, released by the kernel when the process dies however it
  dies): a second writer stops with a one-line error naming the holder's pid;
- the folder's marker `.agentrl-run.json` lists the files agentrl wrote there (paths relative
  to the folder, never folders): the run's own files are claimed just before they are first
  written (`claim`), a checkpoint by its name (its files are the ones its `manifest.json`
  lists, and that manifest), a sink's files (`train.log`: tensorboard, wandb) once the sink has
  opened (`record_sinks`, `record_sink_files`), and the folders agentrl made (`dirs`).
  `--overwrite` removes exactly the listed files and then-empty folders agentrl made; a file
  the marker does not list inside the run's own folders (`checkpoints/`, `traces/`,
  `tensorboard/`, `wandb/`) or under a run file's name stops it with one line naming it,
  nothing removed. The user's other files beside the run (notes, analyses) are left alone;
- a fresh run starts only in a new or empty folder or in a marked one; a folder that is not
  empty and has no marker is refused before anything in it is touched (not even the lock is
  created); a fresh run refuses a folder whose marker shows a run (continue it with
  `--resume`, or start over explicitly with `--overwrite`);
- a run folder of an older build (run files, no marker) still resumes; the marker it then gets
  lists none of the files it had, so `--overwrite` never removes them (it refuses);
- temp folders and files a killed run left (`checkpoints/.step-*`, `.*.tmp`) are removed: with
  the lock held, no live process is writing them.

The run's files are named relative to the folder, never from a path saved inside it, so a moved
or copied run resumes where it is. Every file written whole is written atomically
(`atomic_write_text`: a temp file in the same folder, then a rename), the marker too;
`metrics.jsonl` is appended one line per step (a kill can tear only its last line, which
readers drop and report).
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
MARKER_VERSION = 2                        # 1: `files` named top-level files and folders
MARKER_CAP = 1 << 24                      # a marker is a list of names; a bigger file is not ours
# the top-level names a run may write; an older build's run folder, without a marker, is
# recognised by these names
RUN_FILES = ("config.json", "metrics.jsonl", "summary.json", "learning_curve.png", "checkpoints",
             "tensorboard", "wandb", "wandb_id",          # these three: train.log sinks
             "traces", "report.html",                     # train.trace_every; agentrl view
             "env-changes.log")                           # --allow-env-change
# the files a run writes at the top of its folder (claimed when it opens, where not present)
TOP_FILES = ("config.json", "metrics.jsonl", "summary.json", "learning_curve.png", "report.html",
             "env-changes.log")
# the folders a run writes into: a file there that the marker does not list stops --overwrite
RUN_FOLDERS = ("checkpoints", "traces", "tensorboard", "wandb")
# what each train.log sink writes, once it has opened
SINK_PATHS = {"tensorboard": ("tensorboard",), "wandb": ("wandb", "wandb_id")}
CHECKPOINT_MANIFEST = "manifest.json"     # a checkpoint's list of its files (train.checkpoint)


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
    """The run folder's marker ({"files": [...], "checkpoints": [...], "dirs": [...],
    "sinks": [...], "resumes": [...], "env": {...}}), None when there is none; a marker that is
    not agentrl's JSON is a one-line error (its list cannot be trusted)."""
    p = Path(path) / MARKER
    if not p.exists() and not p.is_symlink():
        return None
    try:
        if p.is_symlink() or not p.is_file() or p.stat().st_size > MARKER_CAP:
            raise ValueError
        data = json.loads(p.read_text(encoding="utf-8"))
        if not _marker_shape(data):
            raise ValueError
    except (ValueError, OSError, UnicodeDecodeError):
        raise ConfigError(f"{path}: {MARKER} is damaged (not the list of files agentrl wrote); "
                          "nothing in the folder was touched") from None
    for key in ("checkpoints", "dirs", "sinks", "resumes"):   # a version-1 marker has none
        data.setdefault(key, [])
    return data


def _marker_shape(data) -> bool:
    """Whether `data` is a marker: lists of paths inside the folder, nothing else."""
    if not (isinstance(data, dict) and isinstance(data.get("files"), list)
            and isinstance(data.get("resumes", []), list)
            and isinstance(data.get("env", {}), (dict, type(None)))):
        return False
    lists = [data.get(k, []) for k in ("checkpoints", "dirs", "sinks")]
    return (all(isinstance(v, list) for v in lists)
            and all(_inside(n) for n in data["files"] + lists[1])
            and all(_plain_name(n) for n in lists[0])
            and all(n in SINK_PATHS for n in lists[2]))


def _plain_name(name) -> bool:
    """A name directly inside the folder (no path)."""
    return (isinstance(name, str) and name not in ("", ".", "..", LOCK, MARKER)
            and "/" not in name and "\\" not in name and "\0" not in name)


def _inside(rel) -> bool:
    """A relative path inside the folder (`a/b`, no `..`, not absolute, not the lock or the
    marker): all a marker may name."""
    return (isinstance(rel, str) and not rel.startswith("/") and "\\" not in rel
            and "\0" not in rel and all(_plain_name(part) for part in rel.split("/")))


def write_marker(path: Path, data: dict) -> None:
    atomic_write_text(Path(path) / MARKER, json.dumps(data, indent=0))


def new_marker() -> dict:
    return {"agentrl_run": MARKER_VERSION, "files": [], "checkpoints": [], "dirs": [],
            "sinks": [], "resumes": []}


def record_resume(path: Path, record: dict) -> None:
    """Append what a resume changed (`record`) to the marker's `resumes` list; the run's
    config.json keeps the values it started with. Called with the folder's lock held."""
    marker = read_marker(path) or new_marker()
    marker.setdefault("resumes", []).append(record)
    write_marker(path, marker)


def holds_run(path: Path) -> bool:
    """Whether `path` already holds (part of) a training run: a file or checkpoint its marker
    lists, or (no marker: an older build's run) one of the names an older build wrote."""
    marker = read_marker(path)
    names = RUN_FILES if marker is None else marker["files"] + [
        f"checkpoints/{c}" for c in marker.get("checkpoints", [])]
    return any((Path(path) / n).exists() or (Path(path) / n).is_symlink() for n in names)


def files_under(path: Path) -> set[str]:
    """Every file (and link) under `path`, as paths relative to it; the lock and the marker
    aside. Links are not followed."""
    path, out = Path(path), set()
    for root, dirs, files in os.walk(path):
        rel = Path(root).relative_to(path)
        out.update((rel / n).as_posix() for n in files)
        out.update((rel / d).as_posix() for d in dirs if os.path.islink(os.path.join(root, d)))
    return out - {LOCK, MARKER}


def _folders_under(path: Path) -> set[str]:
    path = Path(path)
    return {(Path(root).relative_to(path) / d).as_posix()
            for root, dirs, _ in os.walk(path) for d in dirs
            if not os.path.islink(os.path.join(root, d))}


def checkpoint_files(path: Path, name: str) -> set[str]:
    """The files of checkpoint `name` (relative to the run folder): its manifest and the files
    it lists (paths inside the checkpoint only); none when the manifest does not read."""
    base = f"checkpoints/{name}"
    try:
        files = json.loads((Path(path) / base / CHECKPOINT_MANIFEST).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return set()
    if not isinstance(files, dict):
        return set()
    return {f"{base}/{CHECKPOINT_MANIFEST}"} | {f"{base}/{f}" for f in files if _inside(f)}


def claimed_files(path: Path, marker: dict) -> set[str]:
    """The files the marker says agentrl wrote (a version-1 marker's `checkpoints`, `traces`
    and `tensorboard` folders: their checkpoints, `latest`, trace files and event files; the
    rest of a folder it named is not vouched for)."""
    path, out = Path(path), set()
    steps = list(marker.get("checkpoints", []))
    for name in marker["files"]:
        if marker.get("agentrl_run", 1) >= MARKER_VERSION or not (path / name).is_dir():
            out.add(name)
        elif name == "checkpoints":
            steps += [p.name for p in (path / name).glob("step-*") if p.is_dir()]
            out.add("checkpoints/latest")
        elif name == "traces":
            out.update(f"traces/{p.name}" for p in (path / name).glob("step-*.json"))
        elif name == "tensorboard":
            out.update(f"tensorboard/{p.name}" for p in (path / name).glob("events.out.tfevents.*"))
    for step in steps:
        out |= checkpoint_files(path, step)
    return out


def _made_folders(marker: dict) -> set[str]:
    """The folders agentrl made: `dirs`, each checkpoint's folder (a version-1 marker: the
    folders it listed)."""
    made = set(marker.get("dirs", [])) | {f"checkpoints/{c}" for c in marker.get("checkpoints", [])}
    if marker.get("agentrl_run", 1) < MARKER_VERSION:
        made |= set(marker["files"])
    return made


def foreign_files(path: Path, marker: dict) -> list[str]:
    """Files where a run writes (its folders, its top-level names) that the marker does not
    list: what a fresh run there would mix with, and what --overwrite must not remove."""
    ours = claimed_files(path, marker)

    def runs_there(rel: str) -> bool:
        top, _, rest = rel.partition("/")
        return top in RUN_FOLDERS if rest else top in RUN_FILES

    return sorted(f for f in files_under(path) if f not in ours and runs_there(f))


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
        self._seen: set[str] = set()      # files and folders present when the run opened

    @classmethod
    def open(cls, path: str | Path, resume: bool = False, overwrite: bool = False,
             log: Callable[[str], None] = print) -> "RunFolder":
        """Check, lock and prepare the folder (see the module docstring); the run's top-level
        files are claimed in the marker where the folder does not already hold them."""
        path = Path(path)
        label = "--resume" if resume else "--out"
        if path.exists() and not path.is_dir():
            raise ConfigError(f"{label} {path} is a file; give a folder")
        if path.is_dir() and read_marker(path) is None and not resume:
            cls._check_unmarked(path)     # before the lock: a refused folder gets nothing
        check_output_dir(path, label)
        folder = cls(path, cls._lock(path))
        try:
            folder._prepare(resume, overwrite, log)
        except BaseException:
            folder.close()
            raise
        return folder

    def _prepare(self, resume: bool, overwrite: bool, log: Callable[[str], None]) -> None:
        """Under the lock: leftovers removed; a fresh run's checks (and --overwrite's clearing);
        the marker written with this run's top-level files claimed."""
        path = self.path
        marker = read_marker(path)
        self.clean_temp(log)
        if not resume:
            if marker is None:
                self._check_unmarked(path)
            else:
                self._check_fresh(path, marker, overwrite)
                if overwrite:
                    self.clear(marker, log)
            marker = None
        elif marker is None and holds_run(path):
            log(f"{path} was written by an older build (no {MARKER}): resuming it; "
                "--overwrite will not remove the files it already had")
        write_marker(path, marker or new_marker())
        self._seen = files_under(path) | _folders_under(path)
        self.claim(files=TOP_FILES)

    @staticmethod
    def _check_unmarked(path: Path) -> None:
        """A fresh run in a folder without a marker: only an empty one."""
        foreign = _foreign_entries(path)
        if foreign:
            raise ConfigError(
                f"{path} is not an agentrl run folder: it holds {_listing(foreign)} and no "
                f"{MARKER}; " + (f"a run of an older build continues with --resume {path} "
                                 "(--overwrite removes only files a run recorded)"
                                 if holds_run(path) else "give a new or empty folder"))

    @staticmethod
    def _check_fresh(path: Path, marker: dict, overwrite: bool) -> None:
        """A fresh run in a marked folder: not over a run unless --overwrite, and no file the
        marker does not list where the run writes (one line naming them, nothing removed)."""
        if not overwrite and holds_run(path):
            raise ConfigError(f"{path} already holds a run: continue it with --resume {path}, or "
                              "start over with --overwrite")
        foreign = foreign_files(path, marker)
        if foreign:
            raise ConfigError(f"{path} holds {_listing(foreign)}, which {MARKER} does not list "
                              "(not written by an agentrl run there); nothing was removed: move "
                              "them away or give another folder")

    def claim(self, files=(), checkpoints=()) -> None:
        """Record in the marker that this run writes `files` (paths relative to the folder)
        and `checkpoints` (names under checkpoints/), before it writes them; a path the folder
        already holds unlisted is not claimed (it is not this run's), and a folder on the way
        that does not exist yet is recorded as made by agentrl. Called with the lock held; the
        marker is rewritten (atomically) only when something is new."""
        marker = read_marker(self.path) or new_marker()
        listed, steps, made = set(marker["files"]), set(marker["checkpoints"]), set(marker["dirs"])
        new = [f for f in files if f not in listed and not self._exists(f)]
        new_steps = [c for c in checkpoints if c not in steps and not self._exists(f"checkpoints/{c}")]
        parents = {str(Path(f).parent) for f in new} | ({"checkpoints"} if new_steps else set())
        new_dirs = sorted({q for d in parents if d != "." for q in _and_above(d)}
                          - made - {d for d in _and_above_all(parents) if self._exists(d)})
        if new or new_steps or new_dirs:
            marker["files"] += new
            marker["checkpoints"] += new_steps
            marker["dirs"] += new_dirs
            write_marker(self.path, marker)

    def _exists(self, rel: str) -> bool:
        p = self.path / rel
        return p.exists() or p.is_symlink()

    def record_sinks(self, names) -> None:
        """The `train.log` sinks that opened: recorded with the files they wrote so far."""
        marker = read_marker(self.path) or new_marker()
        opened = [n for n in names if n in SINK_PATHS and n not in marker["sinks"]]
        if opened:
            marker["sinks"] += opened
            write_marker(self.path, marker)
        self.record_sink_files()

    def record_sink_files(self) -> None:
        """Record the files (and folders) the opened sinks wrote since the run opened: what
        their folders hold now that was not there when the run opened and is not listed."""
        marker = read_marker(self.path) or new_marker()
        listed, made = set(marker["files"]), set(marker["dirs"])
        files, dirs = [], []
        for top in (t for s in marker["sinks"] for t in SINK_PATHS[s]):
            p = self.path / top
            if p.is_dir() and not p.is_symlink():
                dirs += [top] + [f"{top}/{d}" for d in sorted(_folders_under(p))]
                files += sorted(f"{top}/{f}" for f in files_under(p))
            elif p.exists() or p.is_symlink():
                files.append(top)
        files = [f for f in files if f not in listed and f not in self._seen]
        dirs = [d for d in dirs if d not in made and d not in self._seen]
        if files or dirs:
            marker["files"] += files
            marker["dirs"] += dirs
            write_marker(self.path, marker)

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
        """--overwrite: remove the files the previous run's marker lists, then the folders
        agentrl made that are left empty (nothing else; `_check_fresh` refused first if a file
        the marker does not list lay where the run writes)."""
        present = files_under(self.path)
        removed = sorted(claimed_files(self.path, marker) & present,
                         key=lambda f: (f.count("/"), f))
        made = _made_folders(marker)
        for rel in removed:
            (self.path / rel).unlink()
            made |= {d for d in _and_above(str(Path(rel).parent))
                     if any(d == m or d.startswith(m + "/") for m in made)}
        for d in sorted(made, key=lambda d: -d.count("/")):
            p = self.path / d
            if p.is_dir() and not p.is_symlink() and not any(p.iterdir()):
                p.rmdir()
        if removed:
            log(f"--overwrite: removed the previous run's {len(removed)} file(s) from "
                f"{self.path} ({_listing(removed)})")

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


def _and_above(rel: str) -> list[str]:
    """`a/b/c` -> [`a/b/c`, `a/b`, `a`] (`.` -> [])."""
    parts = [] if rel in ("", ".") else rel.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _and_above_all(rels) -> set[str]:
    return {q for r in rels for q in _and_above(r)}


def default_out(cfg) -> Path:
    """A run's folder: `out` when given, else runs/<time>-<method>-<env>."""
    if cfg.out:
        return Path(cfg.out)
    return Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.method}-{cfg.env.name}"

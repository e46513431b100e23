"""Reading a run or sweep folder that may come from someone else (`agentrl view`).

Every read stays inside the folder and follows no symbolic link (a link is refused, not
followed), opens regular files only (a FIFO or a device is refused, so nothing blocks), is
bounded in bytes and in JSON nesting, and reads non-finite numbers (`NaN`, `Infinity`,
`1e999`) as missing. A file that cannot be read becomes one *problem*: the file, relative to
the folder, and the reason in one line; `agentrl view` lists them on the page (docs/traces.md).
"""
from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import BinaryIO

MAX_NESTING = 64                  # arrays and objects inside each other (a trace needs 6)
MAX_JSON = 1 << 20                # bytes of a config.json, summary.json or ablation.json
MAX_PROBLEMS = 100                # problems listed (the rest are counted)
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BRACKET = re.compile(r"[\[\]{}]")
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


class Unreadable(ValueError):
    """Why a file of the folder is not read (one line)."""


def nesting(text: str) -> int:
    """How deep the arrays and objects of the JSON `text` nest (strings skipped); counting
    stops one level past MAX_NESTING."""
    depth = top = 0
    for c in _BRACKET.findall(_STRING.sub("", text)):
        depth += 1 if c in "[{" else -1
        if depth > top:
            top = depth
            if top > MAX_NESTING:
                break
    return top


def _finite(s: str) -> float | None:
    x = float(s)
    return x if math.isfinite(x) else None


def _number(s: str) -> int | float | None:
    x = int(s)
    return x if abs(x) <= 1 << 53 else _finite(s)


def loads(text: str):
    """JSON `text` nested at most MAX_NESTING deep, non-finite numbers read as None; else
    Unreadable."""
    if nesting(text) > MAX_NESTING:
        raise Unreadable(f"JSON nested deeper than {MAX_NESTING} levels")
    try:
        return json.loads(text, parse_constant=lambda _: None, parse_float=_finite,
                          parse_int=_number)
    except (ValueError, RecursionError) as e:
        raise Unreadable(f"not valid JSON ({e})") from None


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading when it is a regular file and not a symbolic link."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        raise Unreadable("a symbolic link (not followed)" if Path(path).is_symlink()
                         else e.strerror or str(e)) from None
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise Unreadable("not a regular file")
    return f


def read_regular(path: Path, cap: int) -> bytes:
    """The bytes of the regular file `path`, refused when larger than `cap`."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(cap + 1)
    if max(size, len(data)) > cap:
        raise Unreadable(f"larger than {cap:,} bytes ({max(size, len(data)):,})")
    return data


def json_kind(x) -> str:
    """What a JSON value is, as a user reads it."""
    if isinstance(x, bool):
        return "true/false"
    return {dict: "an object", list: "a list", str: "a string", int: "a number",
            float: "a number", type(None): "null"}.get(type(x), type(x).__name__)


class FolderReader:
    """Reads below `root` (module docstring); `problems` lists what it refused."""

    def __init__(self, root: Path):
        self.root = Path(os.path.abspath(root))
        self.real = Path(os.path.realpath(root))
        self.problems: list[dict] = []
        self.more = 0                 # problems beyond MAX_PROBLEMS, counted only

    def name(self, path: Path) -> str:
        try:
            return Path(os.path.abspath(path)).relative_to(self.root).as_posix()
        except ValueError:
            return str(path)

    def refuse(self, path: Path, reason) -> None:
        problem = {"file": self.name(path), "reason": str(reason)}
        if problem in self.problems:
            return
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(problem)
        else:
            self.more += 1

    def check(self, path: Path) -> Path:
        """`path` when it lies inside the folder and no part of it below the folder is a
        symbolic link; else Unreadable."""
        full = Path(os.path.abspath(path))
        try:
            parts = full.relative_to(self.root).parts
        except ValueError:
            raise Unreadable(f"outside {self.root} (not read)") from None
        here = self.root
        for p in parts:
            here = here / p
            if here.is_symlink():
                raise Unreadable("a symbolic link (not followed)" if here == full else
                                 f"inside a symbolic link ({self.name(here)}, not followed)")
        if not Path(os.path.realpath(full)).is_relative_to(self.real):
            raise Unreadable(f"outside {self.root} (not read)")
        return full

    def json(self, path: Path, kind: type = dict, cap: int = MAX_JSON):
        """The JSON file `path` when it holds a `kind`; None when it is missing, and None with
        a problem listed when it cannot be read."""
        if not os.path.lexists(path):
            return None
        try:
            data = loads(read_regular(self.check(path), cap).decode("utf-8"))
            if not isinstance(data, kind):
                raise Unreadable(f"{json_kind(data)}, not {json_kind(kind())}")
        except (Unreadable, UnicodeDecodeError) as e:
            self.refuse(path, e)
            return None
        return data

    def folders(self, path: Path) -> list[Path]:
        """The sub-folders of `path` (sorted by name); symbolic links among them are listed
        as problems, not followed."""
        if not os.path.lexists(path):
            return []
        try:
            entries = sorted(os.scandir(self.check(path)), key=lambda e: e.name)
        except (Unreadable, OSError) as e:
            self.refuse(path, e if isinstance(e, Unreadable) else e.strerror)
            return []
        for e in entries:
            if e.is_symlink():
                self.refuse(e.path, "a symbolic link (not followed)")
        return [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]

"""The file a run's user env is loaded from, and its sha256, recorded with the run.

A run whose env is a user file (`--env my_env.py:make`) or module (`--env my_pkg.envs:make`,
the module's file; a package's `__init__.py`) records in its marker (`.agentrl-run.json`,
`"env"`) the env's name, its file and the file's sha256 when it starts. `--resume` and
`agentrl eval --checkpoint RUN` (with the run's own env) hash the file again: a file that
changed is a one-line error naming it and both hashes, unless `--allow-env-change` is passed;
then the command runs and the change is a line of the run's `env-changes.log` (a resume also
records it in the marker's `resumes` and takes the new hash as the run's). A moved file is
given with `--resume RUN --env NEW_PATH:make`: accepted when the file there has the recorded
hash. Built-in envs and installed entry points are not hashed (their code is the package's).
"""
from __future__ import annotations

import importlib.util
import os
from datetime import datetime, timezone
from pathlib import Path

from ..config import env_name
from ..errors import ConfigError
from ..train.checkpoint import sha256_file
from ..train.run_folder import new_marker, read_marker, write_marker

CHANGES_LOG = "env-changes.log"


def env_source(name: str) -> Path | None:
    """The file behind env `name`: `file.py:attr` -> the file, `module:attr` -> the module's
    file; None for a built-in env, an entry point, or a module that cannot be found."""
    target, _, attr = name.rpartition(":")
    if not target or not attr:
        return None
    if target.endswith(".py"):
        return Path(os.path.abspath(os.path.expanduser(target)))
    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    return Path(origin) if origin and origin.endswith(".py") else None


def env_record(name: str) -> dict | None:
    """What a run records of its env `name`: {"name", "file", "sha256"}; None when the env is
    not a user file or module (or its file is not there to hash)."""
    src = env_source(name)
    if src is None or not src.is_file():
        return None
    return {"name": name, "file": str(src), "sha256": sha256_file(src)}


def short(sha: str) -> str:
    return sha[:12]


def check_env(run: Path, name: str, allow: bool, option: str = "--resume") -> dict | None:
    """Check the env `name` a command would use on run `run` against the hash the run
    recorded. -> None when it matches (or the run recorded none); the change
    ({"file", "from", "to"}) when it differs and `allow`; else a one-line ConfigError naming
    the file and both hashes (a file that is gone: where to give its new place)."""
    recorded = (read_marker(run) or {}).get("env")
    if not recorded:
        return None
    src = env_source(name)
    if src is None or not src.is_file():
        attr = name.rpartition(":")[2]
        raise ConfigError(f"the run's env file {src or name} is not there (the run recorded "
                          f"sha256 {short(recorded['sha256'])}): if it moved, give its new "
                          f"place with {option} {run} --env NEW_PATH.py:{attr}")
    now = sha256_file(src)
    if now == recorded["sha256"]:
        return None
    change = {"file": str(src), "from": recorded["sha256"], "to": now}
    if not allow:
        raise ConfigError(f"env file {src} changed since the run recorded it (sha256 "
                          f"{short(recorded['sha256'])}, now {short(now)}): restore it, or "
                          "pass --allow-env-change to go on with this one (recorded in the "
                          "run folder)")
    return change


def moved_env(saved: str, given: str) -> str:
    """The env name a resume continues with when `--env` is given: the run's own (the same
    name), or the run's env file at a new place (same factory); else a one-line error. The
    new file's hash is checked by `check_env`."""
    given = env_name(given)
    if given == saved:
        return saved
    same_factory = saved.rpartition(":")[2] == given.rpartition(":")[2]
    if env_source(saved) is None or env_source(given) is None or not same_factory:
        raise ConfigError(f"--env {given} would change the resumed run (it ran with env "
                          f"{saved}): a resume continues with the run's own env, or its file "
                          "at a new place (same factory); start a new run with --out instead")
    return given


def record_env(run: Path, name: str) -> None:
    """Record env `name`'s file and sha256 in the run's marker (nothing for a built-in env).
    Called with the run folder's lock held."""
    record = env_record(name)
    marker = read_marker(run) or new_marker()
    if marker.get("env") != record:
        marker["env"] = record
        write_marker(run, marker)


def log_env_change(run: Path, change: dict, what: str) -> None:
    """A line in the run's env-changes.log: when, which command, the file and both hashes."""
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with (Path(run) / CHANGES_LOG).open("a", encoding="utf-8") as f:
        f.write(f"{when} {what} --allow-env-change: env file {change['file']} sha256 "
                f"{change['from']} -> {change['to']}\n")

"""Objects from outside the package: `module:attr`, `path/to/file.py:attr`, or an installed
package's entry point (`importlib.metadata`, group `agentrl.envs`).

A Python object handed to the API (`agentrl_cli.api`: an env factory, a reward function) gets
a spec too (`object_spec`): its `module:qualname` when that imports back to the same object,
else a name of this process's own (`python-object:NAME`) that another process refuses in one
line.

Every failure is a one-line `ConfigError` naming the spec and what is wrong (a file that does
not exist, a module that does not import, a missing attribute); the exception that caused it is
chained, so `AGENTRL_DEBUG=1` shows its traceback. Nothing here knows what the object is for:
a `PluginRegistry` (the env registry in `envs.base`, the FOCUS allocators in `rollout.planner`)
wraps and checks what it gets.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import os
import re
import sys
from importlib.metadata import entry_points as eps
from pathlib import Path
from typing import Any, Callable

from ..errors import ConfigError
from ..registry import Registry, RegistryError, suggest

__all__ = ["OBJECT_PREFIX", "PluginRegistry", "entry_points", "is_file_spec", "is_spec",
           "load_entry_point", "load_spec", "object_spec"]

# the module part of the spec of an object that no import finds again (a lambda, a closure, an
# object of `__main__` or an instance): this process's `_OBJECTS` holds it; a hyphen keeps the
# name from ever being an importable module's
OBJECT_PREFIX = "python-object"
_OBJECTS: dict[str, Any] = {}


class PluginRegistry(Registry):
    """A registry whose `get` also resolves a user's plugin: `FILE.py:NAME`, `module:NAME` or an
    installed package's entry point of `group`, loaded once per name and passed through
    `wrap(name, obj)` (which checks it and may wrap it). A registered name wins over an entry
    point of the same name; an unknown name lists the registered ones and the user's `forms`."""

    def __init__(self, kind: str, group: str, forms: str,
                 wrap: Callable[[str, Any], Any] = lambda name, obj: obj):
        super().__init__(kind)
        self.group, self.forms, self.wrap = group, forms, wrap
        self._user: dict[str, Any] = {}

    def get(self, name: str):
        if Registry.__contains__(self, name):
            return super().get(name)
        if name in self._user:
            return self._user[name]
        if is_spec(name):
            obj = load_spec(name, self.kind)
        elif name in entry_points(self.group):
            obj = load_entry_point(self.group, name, self.kind)
        else:
            try:
                return super().get(name)
            except RegistryError as e:
                raise RegistryError(f"{e}; or {self.forms} or an installed '{self.group}' "
                                    "entry point") from None
        self._user[name] = self.wrap(name, obj)
        return self._user[name]


def is_spec(name: str) -> bool:
    """`module:attr` or `file.py:attr` (a registered name never holds a colon)."""
    return ":" in name


def is_file_spec(name: str) -> bool:
    """`path/to/file.py:attr`."""
    return is_spec(name) and name.rsplit(":", 1)[0].endswith(".py")


def object_spec(obj: Any) -> str:
    """The spec a run records for a Python object: `module:qualname` (a user file's module as
    its absolute path, `FILE.py:qualname`) when loading that spec gives back `obj` itself, so
    resume, eval and other processes find it; else `python-object:NAME`, held in this process
    only (the same object always gets the same name)."""
    spec = _importable_spec(obj)
    if spec is not None:
        return spec
    for name, known in _OBJECTS.items():
        if known is obj:
            return name
    qualname = getattr(obj, "__qualname__", None)
    qualname = qualname if isinstance(qualname, str) else type(obj).__qualname__
    base = re.sub(r"[^A-Za-z0-9_]", "_", qualname.rsplit(".", 1)[-1]).strip("_") or "object"
    name, k = f"{OBJECT_PREFIX}:{base}", 2
    while name in _OBJECTS:
        name, k = f"{OBJECT_PREFIX}:{base}_{k}", k + 1
    _OBJECTS[name] = obj
    return name


def _importable_spec(obj: Any) -> str | None:
    """`module:qualname` of `obj` if it loads back as `obj` (not for `__main__`, whose objects
    another process, `agentrl train --resume` say, does not have)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not (isinstance(module, str) and isinstance(qualname, str)) or module == "__main__" \
            or "<" in qualname or module not in sys.modules:
        return None
    target = module
    if module.startswith("agentrl_user_"):             # a file `_load_file` imported
        target = getattr(sys.modules[module], "__file__", None) or module
    spec = f"{target}:{qualname}"
    try:
        return spec if load_spec(spec, "object") is obj else None
    except ConfigError:
        return None


def load_spec(spec: str, kind: str = "env") -> Any:
    """The object `spec` names: `attr` (dotted for nested attributes) of the module or file,
    or a Python object `object_spec` named in this process."""
    if spec in _OBJECTS:
        return _OBJECTS[spec]
    target, _, attr = spec.rpartition(":")
    if target == OBJECT_PREFIX:
        raise ConfigError(f"{kind} '{spec}' was a Python object given to agentrl_cli.api in the "
                          "process that started the run; no other process can load it (resume, "
                          "eval, ablate's jobs, rollout workers): define it at the top level of "
                          "a module or file, and give it as module:attr or FILE.py:attr")
    if not target or not attr:
        raise ConfigError(f"{kind} '{spec}': expected module:attr or path/to/file.py:attr")
    module = _load_file(spec, target, kind) if target.endswith(".py") else _import(spec, target, kind)
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            close = suggest(part, [n for n in dir(obj) if not n.startswith("_")])
            hint = f" (did you mean '{close}'?)" if close else ""
            raise ConfigError(f"{kind} '{spec}': {target} has no attribute '{attr}'{hint}")
        obj = getattr(obj, part)
    return obj


def _load_file(spec: str, target: str, kind: str):
    """The module of a Python file, imported once per path under a name derived from the path
    (so two files called `env.py` do not collide). The file's folder goes on `sys.path` so that
    it can import the modules beside it."""
    path = Path(target).expanduser()
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise ConfigError(f"{kind} '{spec}': file {path} {what}")
    path = Path(os.path.abspath(path))
    name = f"agentrl_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
    if name in sys.modules:
        return sys.modules[name]
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.append(folder)
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ConfigError(f"{kind} '{spec}': {path} is not a Python module")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module            # dataclasses and pickle look the module up here
    try:
        loader_spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # noqa: BLE001  (the user's file: any error is theirs, in one line)
        del sys.modules[name]
        raise ConfigError(f"{kind} '{spec}': {path} does not import: {_one_line(e)}") from e
    return module


def _import(spec: str, target: str, kind: str):
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        if e.name and (target == e.name or target.startswith(e.name + ".")):
            raise ConfigError(f"{kind} '{spec}': no module named '{e.name}' (is its folder on "
                              "PYTHONPATH, or the package installed?)") from e
        raise ConfigError(f"{kind} '{spec}': module '{target}' does not import: "
                          f"{_one_line(e)}") from e
    except (Exception, SystemExit) as e:  # noqa: BLE001  (SystemExit: a script's exit())
        raise ConfigError(f"{kind} '{spec}': module '{target}' does not import: "
                          f"{_one_line(e)}") from e


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    if isinstance(e, SystemExit):
        text = f"the file exits at import (exit code {e.code})" if e.code is not None else "the file exits at import"
    elif isinstance(e, SyntaxError) and e.lineno:
        text = f"{e.msg} (line {e.lineno})"
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


@functools.lru_cache(maxsize=8)
def entry_points(group: str) -> dict[str, Any]:
    """name -> EntryPoint of the installed packages' `group` (metadata only: nothing imports)."""
    try:
        return {ep.name: ep for ep in eps(group=group)}
    except Exception:  # noqa: BLE001  (broken metadata of some package: no entry points)
        return {}


def load_entry_point(group: str, name: str, kind: str = "env") -> Any:
    """The object entry point `name` of `group` points at."""
    ep = entry_points(group)[name]
    try:
        return ep.load()
    except (Exception, SystemExit) as e:  # noqa: BLE001
        raise ConfigError(f"{kind} '{name}' (entry point {group}: {ep.value}) does not load: "
                          f"{_one_line(e)}") from e

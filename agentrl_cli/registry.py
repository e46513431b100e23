"""One generic registry for methods, estimators, losses, controllers, envs and engines."""
from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from .errors import ConfigError

T = TypeVar("T")


def edit_distance(a: str, b: str) -> int:
    """Optimal string alignment distance: insertions, deletions, substitutions and swaps of two
    neighbouring characters each cost 1 (so `gpro` is 1 from `grpo`)."""
    prev2, prev = None, list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


def suggest(name: str, names) -> str | None:
    """The valid name nearest to a mistyped one by edit distance (ties: the earlier name), if
    it is near enough to be a typo: at most a third of the longer name's length, at least 1.
    Case is ignored; a dotted key is also matched on its last part (`train.lr` for `lr`)."""
    low = name.lower()
    best, best_d = None, None
    for cand in names:
        c = cand.lower()
        d = min(edit_distance(low, c),
                edit_distance(low, c.rsplit(".", 1)[-1]) + (0 if "." not in low else 99))
        if best_d is None or d < best_d:
            best, best_d = cand, d
    if best is None or best_d > max(1, max(len(name), len(best.rsplit(".", 1)[-1])) // 3):
        return None
    return best


class RegistryError(ConfigError, KeyError):
    """Unknown or duplicate name; the message is one user-facing line. A user's mistake, so a
    `ConfigError` (what the Python API promises); also a `KeyError`, as a lookup's miss."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Name -> object. A duplicate name raises; an unknown name lists the valid ones.

    An entry may declare the config keys it reads (`reads=("algo.kappa", ...)`): everything its
    object reads of the config, itself or through what it calls. `agentrl ablate` reads these
    declarations to tell which keys a method ignores (`ablate.reads`)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}
        self._lazy: dict[str, Callable[[], T]] = {}
        self._reads: dict[str, frozenset[str]] = {}

    def register(self, name: str, obj: T | None = None, reads: tuple[str, ...] = ()):
        """`REG.register("x", obj)` or as a decorator `@REG.register("x")`; `reads`: the dotted
        config keys the entry reads."""
        if name in self._items or name in self._lazy:
            raise RegistryError(f"{self.kind} '{name}' is already registered")
        self._reads[name] = frozenset(reads)
        if obj is not None:
            self._items[name] = obj
            return obj

        def deco(o: T) -> T:
            self._items[name] = o
            return o

        return deco

    def register_lazy(self, name: str, loader: Callable[[], T], reads: tuple[str, ...] = ()) -> None:
        """Register a heavy backend (vLLM, Ray) without importing it until first use."""
        if name in self._items or name in self._lazy:
            raise RegistryError(f"{self.kind} '{name}' is already registered")
        self._reads[name] = frozenset(reads)
        self._lazy[name] = loader

    def reads(self, name: str) -> frozenset[str]:
        """The config keys entry `name` declared it reads (empty for an unknown name)."""
        return self._reads.get(name, frozenset())

    def get(self, name: str) -> T:
        if name in self._items:
            return self._items[name]
        if name in self._lazy:
            self._items[name] = self._lazy.pop(name)()
            return self._items[name]
        names = self.names()
        close = suggest(name, names)
        hint = f" (did you mean '{close}'?)" if close else ""
        raise RegistryError(f"unknown {self.kind} '{name}'{hint}; valid: {', '.join(names)}")

    def names(self) -> list[str]:
        return sorted([*self._items, *self._lazy])

    def __contains__(self, name: str) -> bool:
        return name in self._items or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

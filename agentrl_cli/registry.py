"""One generic registry for methods, estimators, losses, controllers, envs and engines."""
from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    """Unknown or duplicate name; the message is one user-facing line."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Name -> object. A duplicate name raises; an unknown name lists the valid ones."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}
        self._lazy: dict[str, Callable[[], T]] = {}

    def register(self, name: str, obj: T | None = None):
        """`REG.register("x", obj)` or as a decorator `@REG.register("x")`."""
        if name in self._items or name in self._lazy:
            raise RegistryError(f"{self.kind} '{name}' is already registered")
        if obj is not None:
            self._items[name] = obj
            return obj

        def deco(o: T) -> T:
            self._items[name] = o
            return o

        return deco

    def register_lazy(self, name: str, loader: Callable[[], T]) -> None:
        """Register a heavy backend (vLLM, Ray) without importing it until first use."""
        if name in self._items or name in self._lazy:
            raise RegistryError(f"{self.kind} '{name}' is already registered")
        self._lazy[name] = loader

    def get(self, name: str) -> T:
        if name in self._items:
            return self._items[name]
        if name in self._lazy:
            self._items[name] = self._lazy.pop(name)()
            return self._items[name]
        names = self.names()
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise RegistryError(f"unknown {self.kind} '{name}'{hint}; valid: {', '.join(names)}")

    def names(self) -> list[str]:
        return sorted([*self._items, *self._lazy])

    def __contains__(self, name: str) -> bool:
        return name in self._items or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

"""One generic registry for every kind of pluggable thing that is listed by name (axes, engines,
benchmarks): a name -> item table whose unknown-name error lists what is available.

    >>> engines: Registry[Engine] = Registry("engine")            # doctest: +SKIP
    >>> engines.add("sglang", SglangEngine())                     # doctest: +SKIP
    >>> engines.get("vllm")                                       # doctest: +SKIP
    ConfigError: unknown engine 'vllm'; available: sglang, sim
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from harness.errors import ConfigError

T = TypeVar("T")


def did_you_mean(word: object, choices: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


class Registry(Generic[T]):
    """Named items of one kind, in registration order."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def add(self, name: str, item: T) -> T:
        """Register `item` as `name`; a name is registered once."""
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is registered already")
        self._items[name] = item
        return item

    def get(self, name: str) -> T:
        """The item called `name`; ConfigError naming the available ones otherwise."""
        try:
            return self._items[name]
        except KeyError:
            raise ConfigError(self.unknown(name)) from None

    def unknown(self, name: object) -> str:
        """The words for a name that is not registered: `unknown engine 'x'; available: a, b`."""
        return f"unknown {self.kind} {name!r}; available: {', '.join(self._items)}{did_you_mean(name, self.names())}"

    def find(self, name: str) -> T | None:
        """The item called `name`, or None."""
        return self._items.get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._items))

    def names(self) -> tuple[str, ...]:
        return tuple(self._items)

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(list(self._items.items()))

    def values(self) -> list[T]:
        return list(self._items.values())

    def __contains__(self, name: object) -> bool:
        return name in self._items

    @contextmanager
    def registered(self, name: str, item: T) -> Iterator[T]:
        """`item` registered for the duration of a block (tests, plugins)."""
        self.add(name, item)
        try:
            yield item
        finally:
            self._items.pop(name, None)

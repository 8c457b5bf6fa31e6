"""A named registry: what tiers let other plugins extend (copy targets, KV layouts)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar


class Named(Protocol):
    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Named)


class Registry(Generic[T]):
    kind = "entry"

    def __init__(self) -> None:
        self._entries: dict[str, T] = {}

    def add(self, entry: T) -> None:
        if entry.name in self._entries:
            raise ValueError(f"{self.kind} {entry.name!r} is registered twice")
        self._entries[entry.name] = entry

    def get(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[T]:
        return iter(self._entries.values())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

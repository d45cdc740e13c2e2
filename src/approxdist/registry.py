"""A small name -> factory registry whose unknown-name error lists the valid names."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from approxdist.errors import ApproxDistError, unknown_name

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to factories; `get` raises `error` naming the valid choices."""

    def __init__(self, kind: str, error: type[ApproxDistError] = ApproxDistError) -> None:
        self.kind = kind
        self.error = error
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._items[name] = obj
            return obj

        return deco

    def add(self, name: str, obj: T) -> None:
        self.register(name)(obj)

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except (KeyError, TypeError):  # TypeError: a list or table given as the name
            raise self.error(unknown_name(self.kind, name, list(self._items))) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

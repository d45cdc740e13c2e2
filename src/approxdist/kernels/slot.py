"""A codec's fused kernel, made on first use and never pickled (ctypes functions do not pickle).

Codecs travel to other processes (pickled with a run's config, deep-copied per wire);
each copy makes its own kernel the first time it needs one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")


class KernelSlot(Generic[K]):
    """Holds what `make()` returned on the first `get` (None: the kernels cannot run here);
    a pickled or copied slot is empty again."""

    def __init__(self) -> None:
        self._made: tuple[K | None] | None = None

    def get(self, make: Callable[[], K | None]) -> K | None:
        if self._made is None:
            self._made = (make(),)
        return self._made[0]

    def __getstate__(self) -> dict[str, object]:
        return {"_made": None}

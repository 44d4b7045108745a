"""Which loaded sets to unload: the least recently used idle ones past a limit."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class LoadedSets(Generic[K]):
    """Loaded sets, least recently used first.  ``over_limit`` hears the keys to unload
    so that at most ``limit`` stay loaded, skipping busy ones (a request in flight):
    those are unloaded by a later call once idle."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._order: OrderedDict[K, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._order))

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def touch(self, key: K) -> None:
        """``key`` was used (or loaded) now."""
        self._order[key] = None
        self._order.move_to_end(key)

    def discard(self, key: K) -> None:
        self._order.pop(key, None)

    def over_limit(self, busy: Callable[[K], bool], keep: K | None = None) -> list[K]:
        """The keys to unload now, least recently used first (removed from here);
        never ``keep``."""
        excess = len(self._order) - self.limit
        victims = []
        for key in self._order:
            if excess <= 0:
                break
            if key != keep and not busy(key):
                victims.append(key)
                excess -= 1
        for key in victims:
            del self._order[key]
        return victims

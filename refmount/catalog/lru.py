"""Which loaded sets to unload: the least recently used idle ones past the limits (a
number of sets, and the bytes their indexes hold)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class LoadedSets(Generic[K]):
    """Loaded sets, least recently used first, each with the bytes it holds.
    ``over_limit`` names those to unload so that at most ``limit`` stay loaded holding at
    most ``max_bytes``, skipping busy ones (a request in flight): those are unloaded by a
    later call once idle."""

    def __init__(self, limit: int, max_bytes: int | None = None) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._order: OrderedDict[K, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._order))

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def touch(self, key: K, nbytes: int | None = None) -> None:
        """``key`` was used (or loaded, holding ``nbytes``) now."""
        old = self._order.pop(key, 0)
        size = old if nbytes is None else nbytes
        self.nbytes += size - old
        self._order[key] = size

    def discard(self, key: K) -> None:
        self.nbytes -= self._order.pop(key, 0)

    def _over(self) -> bool:
        too_many = len(self._order) > self.limit
        return too_many or (self.max_bytes is not None and self.nbytes > self.max_bytes)

    def over_limit(self, busy: Callable[[K], bool], keep: K | None = None) -> list[K]:
        """The keys to unload now, least recently used first (removed from here);
        never ``keep``."""
        victims = []
        for key in list(self._order):
            if not self._over():
                break
            if key != keep and not busy(key):
                victims.append(key)
                self.discard(key)
        return victims

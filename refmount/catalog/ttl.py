"""A value that is fresh for a while: the catalog's listing of its source."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Expiring(Generic[T]):
    """Holds the last value and when it was set; ``fresh`` for ``ttl`` seconds."""

    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._clock = clock
        self._value: T | None = None
        self._since = 0.0

    def set(self, value: T) -> None:
        self._value = value
        self._since = self._clock()

    @property
    def fresh(self) -> bool:
        return self._value is not None and self._clock() - self._since < self.ttl

"""A failed load remembered for a while, so that what asks again fails at once.

A load that is costly to repeat (a catalog's set, an Icechunk array's manifests) and
fails is not tried again by every request that needs it: each one meets the remembered
failure until a back-off has passed, then one tries again.  Each failure in a row doubles
the back-off, up to a bound: a store that recovers is read again soon, one that keeps
failing (or a corrupt or hostile file) costs a read once per bound at most.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from refmount.errors import FetchError


@dataclass
class Backoff:
    first: float
    most: float
    #: the message of the failure remembered, None when none is
    error: str | None = None
    retry_at: float = 0.0
    failures: int = 0

    def check(self) -> None:
        """FetchError with the remembered failure while its back-off lasts."""
        if self.error is not None and time.monotonic() < self.retry_at:
            raise FetchError(self.error)

    def failed(self, error: str) -> float:
        """Remember a failure; the seconds before the next try."""
        self.failures += 1
        wait = min(self.most, self.first * 2 ** (self.failures - 1))
        self.error, self.retry_at = error, time.monotonic() + wait
        return wait

    def forget(self) -> None:
        """Try again at the next ask (what failed has changed); a failure in a row
        still doubles the back-off."""
        self.error = None

    def succeeded(self) -> None:
        self.error, self.failures = None, 0

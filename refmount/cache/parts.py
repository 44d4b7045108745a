"""A part: one request's bytes of a remote file, and the state of its fetch."""

from __future__ import annotations

import enum

import trio

from refmount.errors import FetchError
from refmount.refs.model import Checksum

# A part in flight is counted twice: the HTTP client holds the received pieces and then
# their join, so the budget bounds real memory, not just the bytes that will be kept.
INFLIGHT_COST = 2


class State(enum.Enum):
    """Where a part's fetch stands.  QUEUED and IN_FLIGHT parts have no bytes yet;
    readers wait on the part.  A FAILED part is never kept: its readers get its error,
    and a later read asks the store again."""

    QUEUED = "queued"  # created, no task fetches it yet (a cache running no nursery)
    IN_FLIGHT = "in flight"  # a task is fetching it
    LANDED = "landed"  # ``data`` holds what the store returned (short at end of file)
    FAILED = "failed"  # ``error`` says why


class Part:
    """Bytes ``[start, end)`` of ``url``, fetched by one request.

    A block part covers blocks ``first .. first+count-1`` of the URL; a whole-reference
    part has ``exact``, the ``(url, checksum, start, end)`` of its reference, and no
    blocks.  ``checksum``: the version of the object it was fetched under, if any.
    ``ahead``, ``prefetched``, ``consumed`` and ``landed_at`` are the memory budget's
    bookkeeping of read-ahead (see :mod:`refmount.cache.budget`).
    """

    __slots__ = (
        "ahead",
        "checksum",
        "consumed",
        "count",
        "data",
        "end",
        "error",
        "event",
        "exact",
        "first",
        "landed_at",
        "prefetched",
        "reserved",
        "short",
        "start",
        "state",
        "url",
    )

    def __init__(
        self,
        url: str,
        start: int,
        end: int,
        *,
        first: int = -1,
        count: int = 0,
        ahead: bool = False,
        exact: tuple[str, Checksum | None, int, int] | None = None,
        checksum: Checksum | None = None,
    ) -> None:
        self.url = url
        self.start = start
        self.end = end
        self.first = first
        self.count = count
        self.exact = exact
        self.checksum = checksum
        self.state = State.QUEUED
        self.data = b""
        self.error: FetchError | None = None
        self.short = False  # the store returned fewer bytes than asked: end of file
        self.event = trio.Event()
        self.reserved = (end - start) * INFLIGHT_COST  # bytes counted while in flight
        self.ahead = ahead  # fetched by read-ahead and not read yet
        self.prefetched = ahead  # fetched by read-ahead
        self.consumed = 0  # bytes read from it so far
        self.landed_at = 0.0

    @property
    def pending(self) -> bool:
        """Queued or in flight: no bytes yet."""
        return self.state is State.QUEUED or self.state is State.IN_FLIGHT

    @property
    def reach(self) -> int:
        """The end of the bytes it holds (landed) or will hold at most (pending)."""
        return self.start + len(self.data) if self.state is State.LANDED else self.end

    def land(self, data: bytes) -> None:
        self.state = State.LANDED
        self.data = data
        self.short = self.start + len(data) < self.end
        self.event.set()

    def fail(self, error: FetchError) -> None:
        self.state = State.FAILED
        self.error = error
        self.event.set()

    async def wait(self) -> None:
        await self.event.wait()

    def check(self) -> None:
        """Raise the part's fetch error for a reader of a FAILED part."""
        if self.error is not None:
            raise FetchError(str(self.error), self.error.errno) from self.error

    def view(self, start: int, end: int) -> bytes | memoryview:
        """Bytes ``[start, end)`` of the URL from a landed part, without a copy."""
        lo, hi = start - self.start, end - self.start
        data = self.data
        return data if lo == 0 and hi == len(data) else memoryview(data)[lo:hi]

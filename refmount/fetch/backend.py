"""What a transport does for the :class:`~refmount.fetch.fetcher.Fetcher`.

A backend moves bytes and nothing else: it reads a range or asks a size, once, and raises
whatever its transport raises.  Deadlines, retries, concurrency limits, length checks and
the mapping of failures to errnos belong to the fetcher, so that every backend gets the
same ones.
"""

from __future__ import annotations

from typing import Protocol


class Backend(Protocol):
    """One transport (local files, fsspec, obstore) for the URLs of some protocols."""

    async def read(self, url: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``url``: fewer only where the file ends before ``end``.

        Must never hold more than ``end - start + 1`` bytes of an answer: a store that
        sends more is stopped there (the fetcher sees one byte too many and fails the
        attempt), so a hostile or broken store cannot make a read cost more memory than
        it asked for."""
        ...

    async def size(self, url: str) -> int:
        """The size of the whole file at ``url``."""
        ...

    async def prepare(self) -> None:
        """Get ready for the first read (imports, sessions); failures are left for that
        read to report."""
        ...

    def close(self) -> None:
        """Release what the backend holds open."""
        ...

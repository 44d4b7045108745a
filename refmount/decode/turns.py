"""Turns at the decode workers for the jobs decoding a shard's inner chunks together,
the ones a reader waits for first.

A reader going through sharded arrays has its own shard's run and the next shards'
runs (read ahead) decoded in jobs of several inner chunks (:mod:`refmount.decode.reads`).
Given to the workers all at once, they would be run in the order they were asked for:
a reader waiting for an inner chunk of the second shard would wait for the jobs of
every shard read ahead before it.  :class:`Turns` lets at most as many of them run at
once as there are workers, and gives each free turn to the waiting :class:`Ticket` a
reader waits for (its ``urgent``, which a reader may set while it waits), else to the
one whose inner chunks a reader going through the array in order comes to first (its
``rank``: the first shard's first rows, then the next shard's first rows, before the
first shard's last rows), else to the oldest one.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

_serials = itertools.count()


class Ticket:
    """A job's place among the waiting ones: ``urgent`` first, then by ``rank`` (when a
    reader going through in order comes to its work), then by age."""

    __slots__ = ("_granted", "rank", "serial", "urgent")

    def __init__(self, *, urgent: bool = False, rank: int = 0) -> None:
        self.urgent = urgent
        self.rank = rank
        self.serial = next(_serials)
        self._granted: trio.Event | None = None

    def hurry(self) -> None:
        """A reader waits for this job: it comes before every job no reader waits for."""
        self.urgent = True


class Turns:
    """At most ``slots`` jobs at once, each free turn to the most urgent ticket."""

    def __init__(self, slots: int) -> None:
        self._free = max(1, slots)
        self._waiting: list[Ticket] = []

    @asynccontextmanager
    async def turn(self, ticket: Ticket) -> AsyncIterator[None]:
        """Wait for ``ticket``'s turn, hold it for the block."""
        await self._acquire(ticket)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, ticket: Ticket) -> None:
        """Queue, let the jobs asked for together queue too (a run's jobs start at once,
        in no set order), then wait for a turn."""
        ticket._granted = granted = trio.Event()
        self._waiting.append(ticket)
        try:
            await trio.lowlevel.checkpoint()
            self._grant()
            await granted.wait()
        except BaseException:
            if ticket in self._waiting:
                self._waiting.remove(ticket)
            else:  # handed a turn it will not take: the next one's
                self._release()
            raise

    def _release(self) -> None:
        self._free += 1
        self._grant()

    def _grant(self) -> None:
        """Each free turn to the most urgent waiting ticket."""
        while self._free and self._waiting:
            best = min(self._waiting, key=lambda t: (not t.urgent, t.rank, t.serial))
            self._waiting.remove(best)
            self._free -= 1
            assert best._granted is not None
            best._granted.set()

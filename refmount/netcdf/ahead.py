"""Decoding ahead of the netCDF view's sequential readers: bounded, owned, cancellable.

A stretch of a file wanted ahead is queued as the chunks it covers, lazily (an iterator:
32 MiB of 256-byte chunks would be 131,072 entries).  At most :data:`AHEAD_TASKS` tasks,
run in the nursery this is given (:class:`refmount.nursery.Owned`), take the next chunk
of the oldest stretch and decode it; a task ends when the queue is empty.  When a view
closes (a reload replaced it, a catalog unloaded it) its stretches are dropped and its
decodes running are cancelled; unmounting cancels the nursery.  Without a nursery
(tests, tools) nothing is read ahead: readers decode what they read.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING

import trio

from refmount.netcdf.model import Source
from refmount.nursery import Owned

if TYPE_CHECKING:
    from refmount.netcdf.view import NetcdfRefSet

log = logging.getLogger(__name__)

#: Chunks decoded ahead at once, stretches queued (the oldest go first), and chunk keys
#: remembered as already asked ahead.
AHEAD_TASKS = 8
AHEAD_STRETCHES = 256
AHEAD_REMEMBERED = 4096

ChunkIndex = tuple[int, ...]
Decode = Callable[["NetcdfRefSet", Source, ChunkIndex], Awaitable[object]]


class ReadAhead(Owned):
    """Chunks of the netCDF view's files decoded ahead of their readers by ``decode``."""

    def __init__(self, decode: Decode, *, tasks: int = AHEAD_TASKS) -> None:
        self._decode = decode
        self._tasks = tasks
        self._queue: collections.deque[tuple[NetcdfRefSet, Iterator[tuple[Source, ChunkIndex]]]]
        self._queue = collections.deque(maxlen=AHEAD_STRETCHES)
        self._asked: collections.OrderedDict[tuple[int, str], None] = collections.OrderedDict()
        self._running: dict[int, set[trio.CancelScope]] = {}  # view serial -> its decodes
        self.working = 0  # tasks alive
        self.counters = dict.fromkeys(("netcdf_read_ahead", "netcdf_read_ahead_cancelled"), 0)

    def _stopped(self) -> None:
        self._queue.clear()

    def want(self, view: NetcdfRefSet, chunks: Iterator[tuple[Source, ChunkIndex]]) -> None:
        """Decode ``chunks`` of ``view`` ahead, after the stretches queued before."""
        if self._nursery is None or view.closed:
            return
        self._queue.append((view, chunks))
        while self.working < self._tasks:
            self.working += 1
            self._nursery.start_soon(self._work)

    def forget(self, view: NetcdfRefSet) -> None:
        """Drop what ``view`` has queued and cancel its decodes running."""
        kept = [item for item in self._queue if item[0] is not view]
        self._queue.clear()
        self._queue.extend(kept)
        for scope in self._running.pop(view.serial, ()):
            scope.cancel()

    async def _work(self) -> None:
        try:
            while (job := self._next()) is not None:
                view, source, index = job
                scopes = self._running.setdefault(view.serial, set())
                with trio.CancelScope() as scope:
                    scopes.add(scope)
                    try:
                        await self._decode(view, source, index)
                    except Exception as exc:  # the reader's own read reports it
                        log.debug("reading ahead %s failed: %s", source.chunk_key(index), exc)
                    finally:
                        scopes.discard(scope)
                if scope.cancelled_caught:
                    self.counters["netcdf_read_ahead_cancelled"] += 1
                if not scopes and self._running.get(view.serial) is scopes:
                    del self._running[view.serial]
        finally:
            self.working -= 1

    def _next(self) -> tuple[NetcdfRefSet, Source, ChunkIndex] | None:
        """The next chunk to decode: the oldest stretch's next not asked for yet."""
        asked = self._asked
        while self._queue:
            view, chunks = self._queue[0]
            for source, index in chunks:
                key = (view.serial, source.chunk_key(index))
                if key in asked:
                    continue
                asked[key] = None
                if len(asked) > AHEAD_REMEMBERED:
                    asked.popitem(last=False)
                self.counters["netcdf_read_ahead"] += 1
                return view, source, index
            self._queue.popleft()
        return None

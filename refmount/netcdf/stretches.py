"""Variables whose rows in file order span more chunks than the memory budget keeps:
assembled a stretch of rows at a time, chunk by chunk, each chunk decoded once per
stretch.

A variable ``(N, M)`` chunked ``(N, 1)`` stores each column in a chunk, and the file
holds it row by row: every read of a row needs all ``M`` chunks, the whole array.  Once
those are more than the budget keeps, a read's chunks are evicted before the next read
needs them, and a sequential ``cp`` decodes the whole array again for every read (issue
40).  So a read of such a *wide* variable (:meth:`Stretches.wide`: the chunks one
first-axis row meets are more than a quarter of the budget) is served from its
*stretch*: up to :data:`STRETCH_BYTES` of consecutive first-axis rows, assembled by
going through the chunks that meet them (at most :data:`ASSEMBLING` decoded at once,
each one's part copied in and dropped).  The last :data:`KEPT` stretches are kept, so a
sequential reader's reads of one stretch cost one assembly, and copying the variable
decodes its chunks ``size / STRETCH_BYTES`` times instead of once per read.  A variable
whose one row is larger than a stretch is read as any other.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Awaitable, Callable

import numpy as np
import trio

from refmount.netcdf.boxes import chunk_indices, overlap
from refmount.netcdf.model import Source

#: The most a stretch holds, the stretches kept (outside the block cache's budget), and
#: chunks decoded at once for one.
STRETCH_BYTES = 32 << 20
KEPT = 2
ASSEMBLING = 8

Index = tuple[int, ...]
#: A chunk's decoded values (the chunk's shape), or ``None`` for its fill value.
ChunkOf = Callable[[Source, Index], Awaitable[np.ndarray | None]]


class Stretches:
    """The stretches of wide variables, for a budget of ``budget`` bytes."""

    def __init__(self, budget: int) -> None:
        self.wide_bytes = budget // 4
        self._kept: collections.OrderedDict[tuple[int, str, int], np.ndarray]
        self._kept = collections.OrderedDict()
        self._locks: dict[tuple[int, str, int], trio.Lock] = {}
        self.counters = dict.fromkeys(("netcdf_stretches",), 0)

    def wide(self, source: Source) -> bool:
        """Whether reads of ``source`` go through stretches."""
        if len(source.shape) < 2 or self.row_bytes(source) > STRETCH_BYTES:
            return False
        return self.row_chunk_bytes(source) > self.wide_bytes

    @staticmethod
    def row_chunk_bytes(source: Source) -> int:
        """The decoded bytes of the chunks one first-axis row meets."""
        pairs = zip(source.shape[1:], source.chunks[1:], strict=True)
        return math.prod(-(-n // c) for n, c in pairs) * source.chunk_bytes

    @staticmethod
    def row_bytes(source: Source) -> int:
        return math.prod(source.shape[1:]) * source.kind.served.itemsize

    def passes(self, source: Source) -> int:
        """How many times a read of ``source`` in file order decodes each chunk, read by
        stretches: once when a stretch holds whole chunks' rows, else once per stretch
        a chunk's rows span."""
        rows, step = self.rows(source), source.chunks[0]
        return 1 if rows >= step else -(-step // rows)

    def rows(self, source: Source) -> int:
        """First-axis rows per stretch: as many as fit, whole chunks' worth if one does."""
        rows = max(1, STRETCH_BYTES // self.row_bytes(source))
        step = source.chunks[0]
        return rows // step * step if rows >= step else rows

    async def values(
        self, serial: int, source: Source, first: int, last: int, chunk: ChunkOf
    ) -> np.ndarray:
        """Elements ``first`` to ``last`` of ``source`` (served dtype, a new array)."""
        inner = math.prod(source.shape[1:])
        rows = self.rows(source)
        out = np.empty(last - first, dtype=source.kind.served)
        at = first
        while at < last:
            number = at // inner // rows
            stretch = await self._stretch(serial, source, number, rows, chunk)
            begin = number * rows * inner
            end = min(last, begin + stretch.size)
            out[at - first : end - first] = stretch[at - begin : end - begin]
            at = end
        return out

    def forget(self, serial: int) -> None:
        """Drop the stretches of a view (closed)."""
        for key in [key for key in self._kept if key[0] == serial]:
            del self._kept[key]

    async def _stretch(
        self, serial: int, source: Source, number: int, rows: int, chunk: ChunkOf
    ) -> np.ndarray:
        key = (serial, source.path, number)
        lock = self._locks.setdefault(key, trio.Lock())
        try:
            async with lock:
                found = self._kept.get(key)
                if found is None:
                    found = await _assemble(source, number * rows, rows, chunk)
                    self.counters["netcdf_stretches"] += 1
                    self._kept[key] = found
                    while len(self._kept) > KEPT:
                        self._kept.popitem(last=False)
                self._kept.move_to_end(key)
                return found
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting:
                self._locks.pop(key, None)


async def _assemble(source: Source, start: int, rows: int, chunk: ChunkOf) -> np.ndarray:
    """First-axis rows ``start`` to ``start + rows`` (clipped) of ``source``, flat."""
    stop = min(source.shape[0], start + rows)
    box = ((start, *[0] * (len(source.shape) - 1)), (stop, *source.shape[1:]))
    out = np.empty((stop - start, *source.shape[1:]), dtype=source.kind.served)
    fill = np.frombuffer(source.fill, dtype=source.kind.served)[0]
    running = trio.Semaphore(ASSEMBLING)

    async def one(index: Index) -> None:
        try:
            values = await chunk(source, index)
            into, out_of = overlap(box, index, source.chunks)
            out[into] = fill if values is None else values[out_of]
        finally:
            running.release()

    async with trio.open_nursery() as nursery:
        for index in chunk_indices(box, source.chunks):
            await running.acquire()  # never a task per chunk of the whole array
            nursery.start_soon(one, index)
    return out.reshape(-1)

"""Reading the netCDF view's files: any byte range assembled from the header, the
decoded chunks it covers, and padding.

What :class:`refmount.fuse_ops.Operations` calls ``cache``: a file of the view
(:data:`refmount.netcdf.view.SCHEME`) is served here; every other URL goes on to
:class:`refmount.decode.reads.DecodedReads`, which decodes chunks in the worker
processes and keeps them under the block cache's one memory budget.

A read maps to the elements it covers (:mod:`refmount.netcdf.boxes`), hence to chunks;
the chunks are read concurrently as decoded chunks, their elements converted to the
file's big-endian type.  A chunk that fails fails the read (EIO), never zeros: only a
chunk the reference set does not have is its fill value.  Reads are followed as
streams per file (:mod:`refmount.cache.streams`, as the block cache follows remote
files): a sequential reader (``cp``, ``cat``, ``ncdump``) earns a read-ahead window of
up to :data:`READ_AHEAD` bytes of the file, whose chunks are decoded ahead of it
(:mod:`refmount.netcdf.ahead`), each decoded once.  A lone read (``ncdump -h`` reading
the header) starts no read-ahead.  A variable whose rows meet more chunks than the
budget keeps is read a stretch of rows at a time (:mod:`refmount.netcdf.stretches`).
"""

from __future__ import annotations

import bisect
import errno
import functools
import itertools
import weakref
from collections.abc import Callable, Iterator

import numpy as np
import trio

from refmount.cache.streams import INITIAL_WINDOW, StreamTracker
from refmount.decode.reads import DecodedReads
from refmount.errors import FetchError
from refmount.netcdf.ahead import ReadAhead
from refmount.netcdf.boxes import boxes, chunk_indices, overlap
from refmount.netcdf.header import Variable
from refmount.netcdf.model import NcFile, Source
from refmount.netcdf.stretches import Stretches
from refmount.netcdf.view import SCHEME, NetcdfRefSet
from refmount.refs.model import Checksum, RefSet

#: A sequential reader's read-ahead: its window starts at 1 MiB of the file once the
#: reader has read 512 KiB in order (:mod:`refmount.cache.streams`), and doubles while the
#: reader keeps pace, up to this; it is topped up in steps of half the window, at most
#: :data:`AHEAD_STEP`.  A read this far past the stream's end still continues it.
READ_AHEAD = 32 << 20
AHEAD_STEP = 4 << 20
STREAM_REACH = 1 << 20

Chunk = np.ndarray | None  # None: the set has no such chunk (its fill value)


class NetcdfReads:
    """Reads through ``decoded``, serving the files of netCDF views it made."""

    def __init__(self, decoded: DecodedReads, choice: str) -> None:
        self.decoded = decoded
        self.blocks = decoded.blocks
        self.choice = choice
        self._views: weakref.WeakValueDictionary[int, NetcdfRefSet] = weakref.WeakValueDictionary()
        self._serials = itertools.count()
        self.ahead = ReadAhead(self._chunk)
        self.stretches = Stretches(self.blocks.budget)
        self.streams = StreamTracker(
            block_size=STREAM_REACH,
            max_part=AHEAD_STEP,
            initial_window=INITIAL_WINDOW,
            max_window=READ_AHEAD,
        )
        self._counters = dict.fromkeys(("netcdf_reads", "netcdf_bytes"), 0)

    def view(self, raw: RefSet, name: str) -> NetcdfRefSet:
        """The netCDF view of ``raw``, whose files this reads; ``name.nc`` its root's."""
        serial = next(self._serials)
        decoded = self.decoded.view(raw)
        view = NetcdfRefSet(decoded, serial, name, self.choice, closing=self._closed)
        self._views[view.serial] = view
        return view

    def _closed(self, view: NetcdfRefSet) -> None:
        self.ahead.forget(view)
        self.stretches.forget(view.serial)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep a nursery for the read-ahead's decodes until cancelled (the daemon's
        life)."""
        await self.ahead.run(task_status=task_status)

    def stats(self) -> dict[str, int]:
        counters = {**self._counters, **self.ahead.counters, **self.stretches.counters}
        return {**self.decoded.stats(), **counters}

    async def read_buffer(
        self,
        url: str,
        start: int,
        end: int,
        reference: tuple[int, int] | None = None,
        checksum: Checksum | None = None,
    ) -> bytes | memoryview:
        if not url.startswith(SCHEME):
            return await self.decoded.read_buffer(url, start, end, reference, checksum)
        view, made = self._file(url)
        data = await self._assemble(view, made, start, end)
        self._counters["netcdf_reads"] += 1
        self._counters["netcdf_bytes"] += len(data)
        self._read_ahead(url, view, made, start, end)
        return data

    def _file(self, url: str) -> tuple[NetcdfRefSet, NcFile]:
        serial, _, file_id = url[len(SCHEME) :].partition("/")
        view = self._views.get(int(serial))
        if view is None:
            raise FetchError("a netCDF file of a reference set since replaced", errno.ESTALE)
        return view, view.file(int(file_id))

    # -- assembling -----------------------------------------------------------------------

    async def _assemble(self, view: NetcdfRefSet, made: NcFile, start: int, end: int) -> memoryview:
        out = bytearray(end - start)
        header = made.text
        if start < len(header):
            out[: min(end, len(header)) - start] = header[start:end]
        for variable, source in _overlapping(made, start, end):
            data_end = variable.begin + variable.data_size
            low, high = max(start, variable.begin), min(end, data_end)
            if low < high:
                size = source.kind.served.itemsize
                first = (low - variable.begin) // size
                last = -(-(high - variable.begin) // size)
                values = await self._values(view, source, first, last)
                skip = low - variable.begin - first * size
                out[low - start : high - start] = values[skip : skip + high - low]
            pad_low, pad_high = max(start, data_end), min(end, variable.begin + variable.vsize)
            if pad_low < pad_high:
                out[pad_low - start : pad_high - start] = _padding(source, variable.vsize)[
                    pad_low - data_end : pad_high - data_end
                ]
        return memoryview(out)

    async def _values(
        self, view: NetcdfRefSet, source: Source, first: int, last: int
    ) -> memoryview:
        """Elements ``first`` to ``last`` of a variable, as the file's bytes."""
        if self.stretches.wide(source):
            chunk = functools.partial(self._chunk, view)
            values = await self.stretches.values(view.serial, source, first, last, chunk)
            return source.kind.convert(values)
        runs = boxes(source.shape, first, last)
        wanted = {index for box in runs for index in chunk_indices(box, source.chunks)}
        chunks = await self._chunks(view, source, wanted)
        values = np.empty(last - first, dtype=source.kind.served)
        fill = np.frombuffer(source.fill, dtype=source.kind.served)[0]
        at = 0
        for box in runs:
            extent = tuple(b - a for a, b in zip(*box, strict=True))
            count = int(np.prod(extent, dtype=np.int64))
            target = values[at : at + count].reshape(extent)
            for index in chunk_indices(box, source.chunks):
                into, out_of = overlap(box, index, source.chunks)
                chunk = chunks[index]
                target[into] = fill if chunk is None else chunk[out_of]
            at += count
        return source.kind.convert(values)

    async def _chunks(
        self, view: NetcdfRefSet, source: Source, wanted: set[tuple[int, ...]]
    ) -> dict[tuple[int, ...], Chunk]:
        found: dict[tuple[int, ...], Chunk] = {}
        if len(wanted) == 1:
            (index,) = wanted
            found[index] = await self._chunk(view, source, index)
            return found

        async def one(index: tuple[int, ...]) -> None:
            found[index] = await self._chunk(view, source, index)

        async with trio.open_nursery() as nursery:
            for index in sorted(wanted):
                nursery.start_soon(one, index)
        return found

    async def _chunk(self, view: NetcdfRefSet, source: Source, index: tuple[int, ...]) -> Chunk:
        """A decoded chunk's values (C order, the chunk's shape), or ``None`` when the
        set has no such chunk."""
        decoded = view.decoded
        file_id = await decoded.find_file(source.chunk_key(index))
        if file_id is None:
            return None
        ref = await decoded.file_ref(file_id)
        if ref.url is None or ref.length is None:
            raise FetchError(f"{source.chunk_key(index)}: not a decoded chunk")
        data = await self.decoded.read_buffer(ref.url, 0, ref.length)
        return np.frombuffer(data, dtype=source.kind.served).reshape(source.chunks)

    # -- reading ahead --------------------------------------------------------------------

    def _read_ahead(self, url: str, view: NetcdfRefSet, made: NcFile, start: int, end: int) -> None:
        """Follow a read of ``[start, end)`` in the file's streams, and queue the chunks
        of the read-ahead a sequential stream has earned."""
        want = self.streams.observe(url, start, end)
        if want is None:
            return
        stretch_end = min(want.end, made.size)
        want.reached(stretch_end)
        if want.start < stretch_end:
            chunks = _chunks_of(made, want.start, stretch_end, self.stretches.wide)
            self.ahead.want(view, chunks)


def _chunks_of(
    made: NcFile, start: int, end: int, wide: Callable[[Source], bool]
) -> Iterator[tuple[Source, tuple[int, ...]]]:
    """The chunks whose values bytes ``start`` to ``end`` of the file hold, in file order,
    but those of ``wide`` variables (read by stretches, :mod:`refmount.netcdf.stretches`)."""
    for variable, source in _overlapping(made, start, end):
        if wide(source):
            continue
        low = max(start, variable.begin) - variable.begin
        high = min(end, variable.begin + variable.data_size) - variable.begin
        if low >= high:
            continue
        size = source.kind.served.itemsize
        for box in boxes(source.shape, low // size, -(-high // size)):
            for index in chunk_indices(box, source.chunks):
                yield source, index


def _overlapping(made: NcFile, start: int, end: int) -> Iterator[tuple[Variable, Source]]:
    """The variables whose bytes (values and padding) meet ``start`` to ``end``, in file
    order."""
    variables = made.header.variables
    at = max(0, bisect.bisect_right(made.begins, start) - 1)
    for variable, source in zip(variables[at:], made.sources[at:], strict=True):
        if variable.begin >= end:
            return
        yield variable, source


def _padding(source: Source, vsize: int) -> bytes:
    """The bytes after a variable's values up to ``vsize``: its fill value's bytes, as
    the specification asks (at most 3)."""
    one = np.frombuffer(source.fill, dtype=source.kind.served).copy()
    try:
        fill = bytes(source.kind.convert(one))
    except FetchError:  # a fill value no double holds: pad with zeros
        fill = b""
    if not fill:
        return b"\0" * 3
    return (fill * 4)[:3] if source.kind.width is None else b"\0" * 3

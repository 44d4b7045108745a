"""Reading decoded chunks: raw bytes through the block cache, decoded in a bounded pool
of worker processes (or threads), kept under the block cache's memory budget.

What :class:`refmount.fuse_ops.Operations` calls ``cache``: ``read_buffer`` of an
ordinary URL goes to the :class:`BlockCache` as it is; of a decoded chunk's URL
(:data:`refmount.decode.view.SCHEME`), it is served from the decoded chunk.

A decoded chunk is a landed :class:`~refmount.cache.parts.Part` held by the cache's
:class:`~refmount.cache.budget.MemoryBudget`, so decoded and raw bytes share one budget
and one LRU.  The view's own index holds parts weakly: what the budget evicts is gone
once no reader holds it.  Parts are keyed by ``(decoder key, raw reference)``: keys with
the same reference and the same codecs, dtype and chunk shape share one decoded chunk,
and one decoding in flight.  A chunk too big for the budget's room is decoded for its
reader and kept
outside the budget until the next such chunk (one at most: read in pieces, it is decoded
once).

Decoding is a ``decode`` job (:mod:`refmount.decode.chunkjob`) given to a
:class:`~refmount.workers.JobRunner`: the daemon's worker processes, where a decoder that
crashes, hangs or allocates without bound costs one chunk (EIO), not the mount; in tests
and in-process benches, threads of this process.  Listings and cached reads go on
meanwhile.  A chunk that does
not decode to its exact size, or whose array's codecs refmount does not decode, is a
``FetchError`` (EIO) naming the array: raw bytes are never served as decoded.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import weakref
from collections import OrderedDict

import trio

from refmount.cache import BlockCache, Part
from refmount.cache.parts import State
from refmount.decode.chunkjob import MEASURE_SIZE
from refmount.decode.codecs import Buffer, ChunkDecoding, DecodeError
from refmount.decode.strings import StringMeasure
from refmount.decode.v3.shards import ShardDecoder
from refmount.decode.view import SCHEME, DecodedRefSet
from refmount.errors import FetchError
from refmount.refs.model import Checksum, Ref, RefSet
from refmount.workers import InProcessRunner, JobFailed, JobRunner

log = logging.getLogger(__name__)

#: How many shards' last inner chunk read are remembered (to see a reader going through).
RECENT_SHARDS = 4096


class DecodedPart(Part):
    """A part holding one decoded chunk; weakly referenceable, for the view's index."""

    __slots__ = ("__weakref__",)


ChunkKey = tuple[str, Ref]


class DecodedReads:
    """Reads through ``blocks``, decoding the chunks of decoded views it made."""

    def __init__(
        self, blocks: BlockCache, runner: JobRunner | None = None, *, fixed_strings: bool = False
    ) -> None:
        self.blocks = blocks
        self.runner = runner or InProcessRunner(max(1, os.cpu_count() or 1))
        self.fixed_strings = fixed_strings
        self._limiter: trio.CapacityLimiter | None = None
        self._views: weakref.WeakValueDictionary[int, DecodedRefSet] = weakref.WeakValueDictionary()
        self._serials = itertools.count()
        #: The last chunk decoded without room in the budget, held outside it.
        self._oversized: DecodedPart | None = None
        self._chunks: weakref.WeakValueDictionary[ChunkKey, DecodedPart] = (
            weakref.WeakValueDictionary()
        )
        #: Each recently read shard's last inner chunk position (see ``_in_order``).
        self._last_inner: OrderedDict[tuple[str | None, int, Checksum | None], int] = OrderedDict()
        self._counters = dict.fromkeys(
            ("decoded_chunks", "decoded_bytes", "decoded_hits", "decode_errors"), 0
        )

    def view(self, raw: RefSet) -> DecodedRefSet:
        """The decoded view of ``raw``, whose chunks this reads."""
        view = DecodedRefSet(
            raw,
            next(self._serials),
            fixed_strings=self.fixed_strings,
            fetch=self._raw,
            longest=self.longest,
        )
        self._views[view.serial] = view
        return view

    def stats(self) -> dict[str, int]:
        return {**self.blocks.stats(), **self._counters, **self.runner.stats()}

    async def read_buffer(
        self,
        url: str,
        start: int,
        end: int,
        reference: tuple[int, int] | None = None,
        checksum: Checksum | None = None,
    ) -> bytes | memoryview:
        if not url.startswith(SCHEME):
            return await self.blocks.read_buffer(url, start, end, reference, checksum)
        part = await self._decoded(url)
        if end > part.end:
            raise FetchError(f"read past the end of a decoded chunk ({end} > {part.end})")
        return part.view(start, end)

    # -- decoding -------------------------------------------------------------------------

    async def _source(self, url: str) -> tuple[str, Ref, ChunkDecoding]:
        serial, _, file_id = url[len(SCHEME) :].partition("/")
        view = self._views.get(int(serial))
        found = await view.chunk_source(int(file_id)) if view is not None else None
        if found is None:
            raise FetchError("a decoded chunk of a reference set since replaced", errno.ESTALE)
        return found

    async def _decoded(self, url: str) -> DecodedPart:
        array, source, decoder = await self._source(url)
        if decoder.error is not None:
            raise FetchError(f"array {array or '/'!r}: {decoder.error}")
        key = (decoder.key, source)
        part = self._chunks.get(key)
        if part is not None:
            if part.pending:
                await part.wait()
            part.check()
            self.blocks.memory.touch(part)
            self._counters["decoded_hits"] += 1
            return part
        part = DecodedPart(url, 0, decoder.size)
        self._chunks[key] = part
        held = self.blocks.memory.reserve(part.reserved, ahead=False, now=0.0)
        if not held:
            part.reserved = 0
        part.state = State.IN_FLIGHT
        try:
            data = await self._decode(array, source, decoder)
        except BaseException as exc:
            self.blocks.memory.release(part)
            self._counters["decode_errors"] += 1
            error = exc if isinstance(exc, FetchError) else FetchError(f"decoding: {exc!r}")
            part.fail(error)
            del self._chunks[key]
            raise
        self.blocks.memory.release(part)
        part.land(data)
        if held:
            self.blocks.memory.hold(part, 0.0)
        else:
            # Kept until the next chunk that does not fit: its reader reads it in
            # pieces (one READ per 128 KiB to 1 MiB), and each would decode it again.
            self._oversized = part
        self._counters["decoded_chunks"] += 1
        self._counters["decoded_bytes"] += len(data)
        return part

    async def _decode(self, array: str, source: Ref, decoding: ChunkDecoding) -> Buffer:
        try:
            if isinstance(decoding, ShardDecoder):  # its index here, the inner chunk below
                inner = await self._inner_chunk(array, source, decoding)
                if inner is None:
                    return decoding.filled()
                decoding, raw = decoding.inner, inner
            else:
                raw = await self._raw(array, source, decoding.max_raw_size)
            job = decoding.job
            if job is not None:
                return await self.runner.submit(*job, raw, decoding.size)
            # Stored as it is (its size and byte order checked): in threads here.
            if self._limiter is None:
                self._limiter = trio.CapacityLimiter(max(1, os.cpu_count() or 1))
            return await trio.to_thread.run_sync(decoding.decode, raw, limiter=self._limiter)
        except (JobFailed, DecodeError) as exc:
            raise FetchError(f"array {array or '/'!r}: a chunk does not decode: {exc}") from None

    async def _inner_chunk(self, array: str, source: Ref, shard: ShardDecoder) -> Buffer | None:
        """An inner chunk's raw bytes: the shard's index, then the chunk's range only
        (each an exact reference of the block cache, the index kept there for the
        shard's other inner chunks); ``None`` for an inner chunk not written."""
        if source.data is not None:
            return shard.inner_bytes(await self._raw(array, source, shard.max_raw_size))
        assert source.url is not None
        size = source.length
        if size is None:
            size = await self.blocks.fetcher.size(source.url)
        start, end = shard.index_range(size)
        index = await self._range(source, start, end)
        found = shard.locate(index, size)
        if found is None:
            return None
        offset, length = found
        run = shard.run(index, size) if self._in_order(source, shard.position) else None
        return await self._range(source, offset, offset + length, run)

    def _in_order(self, source: Ref, position: int) -> bool:
        """Whether another inner chunk of this shard was read before (its reader goes
        through the shard); notes the shard (a bounded record of recent shards)."""
        shard = (source.url, source.offset, source.checksum)
        last = self._last_inner.pop(shard, None)
        self._last_inner[shard] = position
        if len(self._last_inner) > RECENT_SHARDS:
            self._last_inner.popitem(last=False)
        return last is not None and last != position

    async def _range(
        self, source: Ref, start: int, end: int, within: tuple[int, int] | None = None
    ) -> bytes | memoryview:
        """Bytes ``[start, end)`` of ``source``, fetched as a reference of their own, or
        cut from the reference ``within`` (a run of inner chunks, fetched once)."""
        assert source.url is not None
        if within is not None:  # the whole run, read alike by each of its inner chunks
            run = await self._range(source, *within)
            return memoryview(run)[start - within[0] : end - within[0]]
        first, last = source.offset + start, source.offset + end
        return await self.blocks.read_buffer(
            source.url, first, last, (first, last), source.checksum
        )

    async def longest(self, measure: StringMeasure, raw: Buffer) -> int:
        """The longest value of a variable-length string chunk, read by a worker."""
        try:
            out = await self.runner.submit("measure-strings", measure.spec, raw, MEASURE_SIZE)
        except JobFailed as exc:
            raise DecodeError(str(exc)) from None
        return int.from_bytes(out, "little")

    async def _raw(self, array: str, source: Ref, bound: int) -> bytes | memoryview:
        """A chunk's raw bytes, at most ``bound`` of them."""
        if source.data is not None:
            if len(source.data) > bound:
                raise FetchError(f"array {array or '/'!r}: an inline chunk over {bound} bytes")
            return source.data
        assert source.url is not None
        length = source.length
        if length is None:
            length = await self.blocks.fetcher.size(source.url)
        if length > bound:
            raise FetchError(
                f"array {array or '/'!r}: a raw chunk of {length} bytes, over {bound} "
                "for its decoded chunk"
            )
        start, end = source.offset, source.offset + length
        return await self.blocks.read_buffer(source.url, start, end, (start, end), source.checksum)

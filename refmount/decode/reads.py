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
from collections.abc import Mapping
from typing import Any, NamedTuple

import trio

from refmount.cache import BlockCache, Part
from refmount.cache.parts import INFLIGHT_COST, State
from refmount.decode.chunkjob import MEASURE_SIZE
from refmount.decode.codecs import Buffer, ChunkDecoding, DecodeError
from refmount.decode.strings import StringMeasure
from refmount.decode.turns import Ticket, Turns
from refmount.decode.v3.shards import BATCH_BYTES, GROUP, RUN, RUN_BYTES, Run, ShardDecoder
from refmount.decode.view import SCHEME, DecodedRefSet
from refmount.errors import FetchError
from refmount.refs.model import Checksum, Ref, RefSet
from refmount.workers import InProcessRunner, JobFailed, JobRunner

log = logging.getLogger(__name__)

#: How many shards' last inner chunk read are remembered (to see a reader going through),
#: and inner chunks whose run's job failed.
RECENT_SHARDS = 4096


def _note(record: OrderedDict[Any, Any], key: Any, value: Any = None) -> None:
    """Note ``key`` in a bounded record of recent ones: the oldest go past
    :data:`RECENT_SHARDS`."""
    record[key] = value
    if len(record) > RECENT_SHARDS:
        record.popitem(last=False)


ShardId = tuple[str | None, int, Checksum | None]


def _shard_id(source: Ref) -> ShardId:
    """What names a shard in the bounded records: its reference, not its key."""
    return (source.url, source.offset, source.checksum)


def _whole(shard: ShardDecoder, size: int) -> bool:
    """Whether a shard of ``size`` bytes is read whole by a reader going through it: it
    is one run (at most :data:`RUN` inner chunks, :data:`RUN_BYTES`)."""
    return size <= RUN_BYTES and shard.layout.count <= RUN


class DecodedPart(Part):
    """A part holding one decoded chunk; weakly referenceable, for the view's index.
    ``retry``: decoded with its run's other inner chunks by a job that failed, so its
    readers decode it alone (the failure may be another chunk's)."""

    __slots__ = ("__weakref__", "retry", "ticket")

    def __init__(self, url: str, size: int, *, ahead: bool = False) -> None:
        super().__init__(url, 0, size, ahead=ahead)
        self.retry = False
        #: The turn of the job decoding it with its run's other inner chunks, if any.
        self.ticket: Ticket | None = None


ChunkKey = tuple[str, Ref]


class _Member(NamedTuple):
    """An inner chunk of a run decoded together: its position in the shard, its bytes'
    offset in the run and length, its key, and its part (``None``: the reader's own)."""

    position: int
    offset: int
    length: int
    key: ChunkKey
    part: DecodedPart | None


class DecodedReads:
    """Reads through ``blocks``, decoding the chunks of decoded views it made."""

    def __init__(
        self, blocks: BlockCache, runner: JobRunner | None = None, *, fixed_strings: bool = False
    ) -> None:
        self.blocks = blocks
        self.runner = runner or InProcessRunner(max(1, os.cpu_count() or 1))
        self.fixed_strings = fixed_strings
        #: The workers' turns of the jobs decoding runs of inner chunks together.
        self._turns = Turns(self.runner.capacity)
        self._limiter: trio.CapacityLimiter | None = None
        self._views: weakref.WeakValueDictionary[int, DecodedRefSet] = weakref.WeakValueDictionary()
        self._serials = itertools.count()
        #: The last chunk decoded without room in the budget, held outside it.
        self._oversized: DecodedPart | None = None
        self._chunks: weakref.WeakValueDictionary[ChunkKey, DecodedPart] = (
            weakref.WeakValueDictionary()
        )
        #: Each recently read shard's last inner chunk position (see ``_in_order``).
        self._last_inner: OrderedDict[ShardId, int] = OrderedDict()
        #: Shards whose next shard was read ahead (a bounded record).
        self._ahead_from: OrderedDict[ShardId, None] = OrderedDict()
        #: Shards whose first run was read ahead (a bounded record): each set once its
        #: inner chunks' parts are made (or the read-ahead is over).
        self._shards_ahead: OrderedDict[ShardId, trio.Event] = OrderedDict()
        #: Shards whose index was read (a bounded record).
        self._indexed: OrderedDict[ShardId, None] = OrderedDict()
        #: Inner chunks of a run whose job failed, decoded alone since (a bounded record).
        self._alone: OrderedDict[ChunkKey, None] = OrderedDict()
        self._counters = dict.fromkeys(
            (
                "decoded_chunks",
                "decoded_bytes",
                "decoded_hits",
                "decode_errors",
                "decoded_ahead",
                "decoded_ahead_used",
            ),
            0,
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
        assert part is not None  # only read-ahead goes without
        if end > part.end:
            raise FetchError(f"read past the end of a decoded chunk ({end} > {part.end})")
        return part.view(start, end)

    # -- decoding -------------------------------------------------------------------------

    def _view_of(self, url: str) -> tuple[DecodedRefSet | None, int]:
        """The view a decoded file ``url`` is of (``None``: since replaced), its file id."""
        serial, _, file_id = url[len(SCHEME) :].partition("/")
        return self._views.get(int(serial)), int(file_id)

    async def _source(self, url: str) -> tuple[str, Ref, ChunkDecoding]:
        view, file_id = self._view_of(url)
        found = await view.chunk_source(file_id) if view is not None else None
        if found is None:
            raise FetchError("a decoded chunk of a reference set since replaced", errno.ESTALE)
        return found

    def prefetch(self, ref: Ref) -> bool:
        """Fetch a reference ahead of its reader (grid read-ahead): a decoded chunk is
        fetched and decoded in the workers in the background, as read-ahead of the
        budget; any other goes to the block cache.  False when the read-ahead budget
        has no room."""
        url = ref.url
        if url is None or not url.startswith(SCHEME):
            return self.blocks.prefetch(ref)
        memory = self.blocks.memory
        size = (ref.length or 0) * INFLIGHT_COST
        if memory.ahead_cached + memory.ahead_inflight + size > memory.ahead_limit:
            memory.demote_stale(trio.current_time())
            if memory.ahead_cached + memory.ahead_inflight + size > memory.ahead_limit:
                return False
        return self.blocks.spawn(self._decode_ahead, url) or True

    async def _decode_ahead(self, url: str) -> None:
        """A decoded chunk decoded ahead of its reader; failures are left to the reader."""
        try:
            await self._decoded(url, ahead=True)
        except Exception:  # a task of the cache's nursery: nothing may escape it
            log.debug("decoding %s ahead failed", url, exc_info=True)

    async def _decoded(self, url: str, *, ahead: bool = False) -> DecodedPart | None:
        """The decoded chunk of ``url``; ``ahead``: decoded as read-ahead, only if it is
        not decoded or decoding already and the read-ahead budget has room (None)."""
        array, source, decoder = await self._source(url)
        if decoder.error is not None:
            raise FetchError(f"array {array or '/'!r}: {decoder.error}")
        key = (decoder.key, source)
        if ahead and (key in self._chunks or isinstance(decoder, ShardDecoder)):
            return None  # shards have their own read-ahead
        if key not in self._chunks and isinstance(decoder, ShardDecoder):
            await self._shard_landing(source)
        while (part := self._chunks.get(key)) is not None:
            if part.pending:
                if part.ticket is not None:
                    part.ticket.hurry()
                await part.wait()
            if part.retry:  # its run's job failed: decoded alone below
                continue
            part.check()
            if part.ahead:
                self._counters["decoded_ahead_used"] += 1
            self.blocks.memory.touch(part)
            self._counters["decoded_hits"] += 1
            if part.prefetched and isinstance(decoder, ShardDecoder):  # a reader came
                self._ahead_of(url, source, decoder)
            return part
        part = DecodedPart(url, decoder.size, ahead=ahead)
        now = trio.current_time() if ahead else 0.0
        held = self.blocks.memory.reserve(part.reserved, ahead=ahead, now=now)
        if not held:
            if ahead:
                return None
            part.reserved = 0
        self._chunks[key] = part
        if ahead:
            self._counters["decoded_ahead"] += 1
        part.state = State.IN_FLIGHT
        try:
            data = await self._decode(array, source, decoder, url)
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
            self.blocks.memory.hold(part, now)
        else:
            # Kept until the next chunk that does not fit: its reader reads it in
            # pieces (one READ per 128 KiB to 1 MiB), and each would decode it again.
            self._oversized = part
        self._counters["decoded_chunks"] += 1
        self._counters["decoded_bytes"] += len(data)
        return part

    async def _decode(self, array: str, source: Ref, decoding: ChunkDecoding, url: str) -> Buffer:
        try:
            if isinstance(decoding, ShardDecoder):  # its index here, the inner chunk below
                return await self._inner_chunk(array, source, decoding, url)
            return await self._job(decoding, await self._raw(array, source, decoding.max_raw_size))
        except (JobFailed, DecodeError) as exc:
            raise FetchError(f"array {array or '/'!r}: a chunk does not decode: {exc}") from None

    async def _job(self, decoding: ChunkDecoding, raw: Buffer) -> Buffer:
        """One chunk decoded: by a worker, or a chunk stored as it is (its size and byte
        order checked) in threads here."""
        job = decoding.job
        if job is not None:
            return await self.runner.submit(*job, raw, decoding.size)
        if self._limiter is None:
            self._limiter = trio.CapacityLimiter(max(1, os.cpu_count() or 1))
        return await trio.to_thread.run_sync(decoding.decode, raw, limiter=self._limiter)

    async def _inner_chunk(self, array: str, source: Ref, shard: ShardDecoder, url: str) -> Buffer:
        """An inner chunk (of the decoded file ``url``) decoded: the shard's index, then
        the chunk's range only (each an exact reference of the block cache, the index kept
        there for the shard's other inner chunks); for a reader going through the shard,
        its run's range, decoded with the run's other inner chunks (:meth:`_run`), and
        the next shards read ahead (:meth:`_read_ahead`).  An inner chunk not written is
        the fill value."""
        if source.data is not None:
            inner = shard.inner_bytes(await self._raw(array, source, shard.max_raw_size))
            return shard.filled() if inner is None else await self._job(shard.inner, inner)
        size = await self._length(source)
        going = self._in_order(source, shard.position)
        if going:  # the next shards' bytes on their way before this one's come
            self._ahead_of(url, source, shard)
        # a reader going through a shard whose index is not in yet: the shard in one
        # request, its index with its run (one round trip, not two)
        whole = going and _shard_id(source) not in self._indexed
        index, fetched = await self._index(source, shard, size, whole=whole)
        _note(self._indexed, _shard_id(source))
        found = shard.locate(index, size)
        if found is None:
            return shard.filled()
        offset, length = found
        run = shard.run(index, size) if going else None
        if run is None:
            if fetched is not None:
                return await self._job(shard.inner, memoryview(fetched)[offset : offset + length])
            return await self._job(shard.inner, await self._range(source, offset, offset + length))
        view, file_id = self._view_of(url)
        ranks = None if view is None else view.inner_ranks(file_id)
        decoded = await self._run(source, shard, run, fetched=fetched, ranks=ranks)
        assert decoded is not None  # a reader's run returns its chunk
        return decoded

    def _ahead_of(self, url: str, source: Ref, shard: ShardDecoder) -> None:
        """Read the shards after ``source`` ahead, once: a reader goes through ``source``
        (a second inner chunk of it read, or one read ahead)."""
        identity = _shard_id(source)
        if identity not in self._ahead_from:
            _note(self._ahead_from, identity)
            self.blocks.spawn(self._read_ahead, url, shard)

    async def _read_ahead(self, url: str, shard: ShardDecoder) -> None:
        """The first run of each shard a reader going through the one the decoded file
        ``url`` lies in reads next, its inner chunks decoded as read-ahead in the
        background; failures are left to the reads."""
        view, file_id = self._view_of(url)
        if view is None:
            return
        async with trio.open_nursery() as nursery:
            for source, ranks in await view.next_shards(file_id):
                if source.url is not None:
                    nursery.start_soon(self._shard_ahead, url, source, ranks, shard)

    async def _shard_ahead(
        self, url: str, source: Ref, ranks: list[int], shard: ShardDecoder
    ) -> None:
        """The first run of shard ``source`` decoded as read-ahead, once (a bounded
        record): a shard of at most :data:`RUN` inner chunks within :data:`RUN_BYTES`
        fetched whole, its index with its run in one request (one round trip, not two);
        a larger one's index, then its first run."""
        identity = _shard_id(source)
        if identity in self._shards_ahead:
            return
        reserved = trio.Event()
        _note(self._shards_ahead, identity, reserved)
        try:
            size = await self._length(source)
            index, fetched = await self._index(source, shard, size, whole=True)
            run = shard.first_run(index, size)
            if run is not None:
                at = shard.at(run.spans[0][0])
                await self._run(
                    source, at, run, reader=False, fetched=fetched, ranks=ranks, reserved=reserved
                )
        except (FetchError, DecodeError, JobFailed) as exc:
            log.debug("reading ahead of %s: %s", url, exc)
        except Exception as exc:  # in the cache's nursery: never the daemon's end
            log.warning("reading ahead of %s failed: %r", url, exc)
        finally:
            reserved.set()

    async def _shard_landing(self, source: Ref) -> None:
        """Wait, if shard ``source`` is being read ahead, until its inner chunks' parts
        are made: a reader that comes to it meanwhile then waits for its part rather than
        fetching the shard's index, its chunk and its run again."""
        reserved = self._shards_ahead.get(_shard_id(source))
        if reserved is not None:
            await reserved.wait()

    async def _run(
        self,
        source: Ref,
        shard: ShardDecoder,
        run: Run,
        *,
        reader: bool = True,
        fetched: Buffer | None = None,
        ranks: list[int] | None = None,
        reserved: trio.Event | None = None,
    ) -> Buffer | None:
        """Inner chunk ``shard.position`` decoded from ``run``'s bytes, fetched once,
        with the run's other inner chunks not yet decoded or being decoded: each is a
        decoded chunk in flight at once (its readers wait for it), decoded in jobs of
        :data:`GROUP` inner chunks neighbours in the run's bytes (each job given its
        own bytes only), then kept as read-ahead (under the budget's read-ahead share:
        those without room are left to their own reads).  The jobs take turns at the
        workers (:class:`~refmount.decode.turns.Turns`): the one holding the reader's
        chunk, or one a reader waits for, first.  A job that fails leaves its inner
        chunks to be decoded alone (and remembered, so they are not batched again), so a
        failure is its own chunk's only.  Without a ``reader``, every inner chunk of the
        run is read-ahead, and nothing is returned.  ``fetched``: the whole shard, if
        fetched already; ``ranks``: its inner chunks' (when a reader going through the
        array in order comes to each), the order of the jobs' turns; ``reserved``: set
        once the parts are made."""
        job, size = shard.inner.job, shard.size
        mine = next(span for span in run.spans if span[0] == shard.position)
        own = (shard.key, source)
        members: list[_Member] = []
        batched = job is not None and job[0] == "decode" and GROUP * size <= BATCH_BYTES
        if batched and own not in self._alone:
            now, room = trio.current_time(), True
            for position, offset, length in run.spans:
                key = (shard.at(position).key, source)
                if reader and key == own:
                    members.append(_Member(position, offset, length, key, None))
                elif room and key not in self._chunks and key not in self._alone:
                    part = DecodedPart(f"{SCHEME}run", size, ahead=True)
                    room = self.blocks.memory.reserve(part.reserved, ahead=True, now=now)
                    if room:
                        part.state = State.IN_FLIGHT
                        self._chunks[key] = part
                        members.append(_Member(position, offset, length, key, part))
        if reserved is not None:
            reserved.set()
        others = [member for member in members if member.part is not None]
        groups = [members[first : first + GROUP] for first in range(0, len(members), GROUP)]
        tickets = [
            Ticket(
                urgent=any(m.part is None for m in group),
                rank=min(ranks[m.position] for m in group) if ranks else 0,
            )
            for group in groups
        ]
        for group, ticket in zip(groups, tickets, strict=True):
            for member in group:
                if member.part is not None:
                    member.part.ticket = ticket
        try:
            if not (reader or others):
                return None
            if fetched is None:
                raw: Buffer = await self._range(source, run.start, run.end)
            else:
                raw = memoryview(fetched)[run.start : run.end]
            if not others:
                return await self._job(shard.inner, memoryview(raw)[mine[1] : mine[1] + mine[2]])
            assert job is not None
            found: list[Buffer] = []
            async with trio.open_nursery() as nursery:
                for group, ticket in zip(groups, tickets, strict=True):
                    nursery.start_soon(self._group, job[1], raw, size, group, ticket, found)
            if not reader:
                return None
            if found:
                return found[0]
            return await self._job(shard.inner, memoryview(raw)[mine[1] : mine[1] + mine[2]])
        finally:
            for member in others:
                part = member.part
                assert part is not None
                if part.pending:  # not landed: its readers decode it alone
                    self.blocks.memory.release(part)
                    part.retry = True
                    part.fail(FetchError("its run's decoding failed"))
                    if self._chunks.get(member.key) is part:
                        del self._chunks[member.key]

    async def _group(
        self,
        spec: Mapping[str, Any],
        raw: Buffer,
        size: int,
        members: list[_Member],
        ticket: Ticket,
        found: list[Buffer],
    ) -> None:
        """Inner chunks (``size`` bytes each decoded) ``members`` of the run ``raw``
        decoded in one ``decode-run`` job, given the bytes from the first one's to the
        last one's, when ``ticket`` has its turn; its output read straight into each
        one's own buffer, landed in its part (``None``: the reader's own, put in
        ``found``); a failed job lands none, and its chunks are decoded alone since."""
        first, last = members[0].offset, members[-1].offset + members[-1].length
        spans = [[member.offset - first, member.length] for member in members]
        try:
            async with self._turns.turn(ticket):
                chunks = [bytearray(size) for _ in members]  # the job's output lands in them
                await self.runner.submit_into(
                    "decode-run",
                    {"decoder": spec, "spans": spans},
                    memoryview(raw)[first:last],
                    [memoryview(chunk) for chunk in chunks],
                )
        except JobFailed as exc:
            log.info("%d inner chunks do not decode together (%s): each alone", len(spans), exc)
            for member in members:
                _note(self._alone, member.key)
            return
        landed = trio.current_time()
        for member, data in zip(members, chunks, strict=True):
            part = member.part
            if part is None:
                found.append(data)
                continue
            self.blocks.memory.release(part)
            part.land(data)
            self.blocks.memory.hold(part, landed)
            self._counters["decoded_chunks"] += 1
            self._counters["decoded_bytes"] += size

    def _in_order(self, source: Ref, position: int) -> bool:
        """Whether another inner chunk of this shard was read before (its reader goes
        through the shard); notes the shard (a bounded record of recent shards)."""
        shard = _shard_id(source)
        last = self._last_inner.pop(shard, None)
        _note(self._last_inner, shard, position)
        return last is not None and last != position

    async def _length(self, source: Ref) -> int:
        """The length of ``source``'s bytes: the reference's, else the store's size."""
        assert source.url is not None
        if source.length is not None:
            return source.length
        return await self.blocks.fetcher.size(source.url)

    async def _index(
        self, source: Ref, shard: ShardDecoder, size: int, *, whole: bool
    ) -> tuple[Buffer, Buffer | None]:
        """Shard ``source``'s index, and the whole shard when ``whole`` is asked for and
        it is one run (fetched in one request with its index: one round trip, not two;
        else ``None``)."""
        start, end = shard.index_range(size)
        if whole and _whole(shard, size):
            fetched = await self._range(source, 0, size)
            return memoryview(fetched)[start:end], fetched
        return await self._range(source, start, end), None

    async def _range(self, source: Ref, start: int, end: int) -> bytes | memoryview:
        """Bytes ``[start, end)`` of ``source``, fetched as a reference of their own."""
        assert source.url is not None
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
        length = await self._length(source)
        if length > bound:
            raise FetchError(
                f"array {array or '/'!r}: a raw chunk of {length} bytes, over {bound} "
                "for its decoded chunk"
            )
        return await self._range(source, 0, length)

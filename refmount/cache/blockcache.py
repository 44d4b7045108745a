"""The orchestrator: a block cache shared by every open file, read-ahead keyed by URL.

Blocks and parts
    A remote file is cut into fixed blocks of ``block_size`` bytes, keyed by
    ``(url, index)``.  Adjacent missing blocks are fetched as one request, a *part* of up
    to ``max_part`` bytes, and the part's bytes are kept whole: every block key of the
    part points at it.  So every reference that points into the same bytes shares them,
    whichever key or open file asks, and nothing is copied when a part lands (on the two
    cores this runs on, a copy of every fetched byte cost a tenth of the throughput).
    A part that is still being fetched is in the same index, so its blocks are fetched
    once however many readers want them; they all wake when it lands, and all get the
    ``FetchError`` if the fetch fails (a failed part is not cached: a later read retries).

Whole references
    A random read inside a reference of at most ``max_part`` bytes (a zarr chunk, read
    whole by nearly every reader) fetches exactly that reference, as one part keyed by
    ``(url, start, end)`` of the reference rather than by blocks: no byte outside it is
    fetched or held, so a random read of a 4 KiB chunk costs 4 KiB of memory, not a
    256 KiB block, and a chunk that straddles a block boundary is one request, not two.
    The reader's further READs of the same file find the part.  A read that starts where
    another ended, or inside a stream's read-ahead, or whose block is cached or in flight,
    takes the block path: the next of back-to-back chunks is how a stream starts.

Block size: 256 KiB
    A block is the unit of lookup and of a random read's fetch.  A FUSE READ is 128 KiB to
    1 MiB, so a read touches one to five block keys, usually all in one part: a handful of
    dict lookups and one slice.  A random read of a small chunk fetches at most two blocks
    (512 KiB), which on an object store (~50 MB/s per connection, 10+ ms to first byte)
    costs little more time than the chunk alone; larger blocks would over-fetch random
    reads, smaller ones add per-block work and requests on the sequential path.  Request
    size is decoupled from it: read-ahead goes out in parts of up to 8 MiB.

Memory and read-ahead
    One budget covers cached parts, parts in flight and the buffers of evicted parts
    kept for the next fetch to receive into (:mod:`refmount.fetch.buffers`: a sixteenth
    of the budget, at most ``FREE_BUFFERS``; :mod:`refmount.cache.budget` has the rest);
    read-ahead follows sequential streams per URL (:mod:`refmount.cache.streams`).  When
    a read cannot reserve room (a budget smaller than the read, or filled by fetches in
    flight), it is served by a direct, uncached fetch: correct, never a deadlock.  Beyond
    the budget, memory is only what readers hold while they copy.

Checksums
    A reference may name the version of its object it was made from (a
    :class:`~refmount.refs.model.Checksum`); the fetcher serves only that version's bytes.
    Parts are keyed by the checksum they were fetched under too: a part fetched under one
    checksum serves later reads of the same checksum, never reads of another or of none,
    and a part fetched without one never serves a read that names one.

Fetch tasks
    Fetches run in the nursery the cache is given (:class:`refmount.nursery.Owned`:
    ``start``, or ``run`` which opens one); a cache given none (tests, tools) has each
    reader fetch its own parts.

Short files
    Fetches use ``allow_short``: the last block of a remote file may be short.  A read
    that needs a byte beyond what the store returned raises ``FetchError`` (EIO): a
    short file is never served as data.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from typing import Protocol

import trio

from refmount.cache.budget import MemoryBudget
from refmount.cache.parts import INFLIGHT_COST, Part, State
from refmount.cache.streams import INITIAL_WINDOW, MAX_WINDOW, Prefetch, StreamTracker
from refmount.errors import FetchError
from refmount.fetch import Fetcher
from refmount.fetch.buffers import BufferPool
from refmount.nursery import Owned
from refmount.redaction import redact
from refmount.refs.model import Checksum, Ref

log = logging.getLogger(__name__)

BLOCK_SIZE = 256 << 10
MAX_PART = 8 << 20  # the largest single request
AHEAD_TTL = 10.0  # seconds before unread read-ahead becomes ordinary cache
#: The most of the budget kept as free buffers of evicted parts (see the docstring).
FREE_BUFFERS = 32 << 20
_ATTEMPTS = 3  # passes over a read before it falls back to a direct fetch

Key = tuple[str, Checksum | None, int]  # url, the checksum it was fetched under, block
ExactKey = tuple[str, Checksum | None, int, int]  # url, checksum, [start, end) of a reference
# One entry of a read's plan: the part serving bytes [lo, hi) (None: not fetched yet).
PlanEntry = list


class PartSource(Protocol):
    """Where parts' bytes come from instead of the fetcher itself: the disk tier
    (:class:`refmount.cache.disk.DiskTier`), with counters of its own."""

    async def fetch(
        self,
        url: str,
        start: int,
        end: int,
        *,
        allow_short: bool = False,
        checksum: Checksum | None = None,
    ) -> bytes: ...

    def stats(self) -> dict[str, int]: ...


class BlockCache(Owned):
    """Blocks of remote files shared by every reader, bounded by one memory budget."""

    def __init__(
        self,
        fetcher: Fetcher,
        *,
        budget: int = 512 << 20,
        extent: Callable[[str], int | None] = lambda url: None,
        block_size: int = BLOCK_SIZE,
        max_part: int = MAX_PART,
        initial_window: int = INITIAL_WINDOW,
        max_window: int = MAX_WINDOW,
        ahead_ttl: float = AHEAD_TTL,
        source: PartSource | None = None,
    ) -> None:
        if block_size <= 0 or max_part < block_size:
            raise ValueError("block_size must be positive and max_part at least block_size")
        self.fetcher = fetcher
        self.source = source
        self.budget = budget
        self.extent = extent
        self.block_size = block_size
        self.max_part = max_part
        self._part_blocks = max_part // block_size
        #: The fetcher's pool of receive buffers, given the parts this cache evicts.
        self.buffers: BufferPool | None = getattr(fetcher, "buffers", None)
        spare = 0
        if self.buffers is not None:
            spare = min(budget // 16, FREE_BUFFERS)
            self.buffers.limit = spare
        self.memory = MemoryBudget(budget - spare, ahead_ttl=ahead_ttl, forget=self._forget)
        self.streams = StreamTracker(
            block_size=block_size,
            max_part=max_part,
            initial_window=initial_window,
            max_window=max_window,
            limit=self._ahead_limit_of,
        )
        # Every block key of every part, landed or pending.
        self._index: dict[Key, Part] = {}
        # Whole-reference parts, landed or pending, by (url, checksum, start, end).
        self._exact: dict[ExactKey, Part] = {}
        self._eof: dict[str, int] = {}  # ends of file seen in short answers
        self._pending = 0  # parts queued or in flight
        self._counters = dict.fromkeys(
            (
                "hits",
                "misses",
                "joined",
                "demand_requests",
                "demand_bytes",
                "readahead_requests",
                "readahead_bytes",
                "uncached_reads",
                "fetch_errors",
                "grid_readahead_requests",
                "grid_readahead_bytes",
                "grid_readahead_used",
            ),
            0,
        )

    # -- public ---------------------------------------------------------------------------

    async def read(self, url: str, start: int, end: int) -> bytes:
        """Exactly bytes ``[start, end)`` of ``url``, or ``FetchError``."""
        data = await self.read_buffer(url, start, end)
        return data if type(data) is bytes else bytes(data)

    async def read_buffer(
        self,
        url: str,
        start: int,
        end: int,
        reference: tuple[int, int] | None = None,
        checksum: Checksum | None = None,
    ) -> bytes | memoryview:
        """Like ``read``, but a read inside one cached part comes back as a memoryview of
        it, without a copy.  pyfuse3 accepts any buffer from a ``read`` handler: a FUSE
        READ served this way costs the daemon no copy of its own (the kernel copies once
        into the page cache), and no fresh allocation per READ.

        ``reference`` is the ``[start, end)`` of the whole reference the read belongs to:
        given, a random read of a small reference fetches exactly it (see the module's
        docstring).  ``checksum``: the version of the object the bytes must be of."""
        if start < 0:
            raise ValueError(f"negative offset {start}")
        if end <= start:
            return b""
        # Fast path: one landed part holds the whole read.
        part = self._index.get((url, checksum, start // self.block_size))
        if part is not None and part.state is State.LANDED and end <= part.reach:
            self.memory.touch(part)
            self._counters["hits"] += 1
            self._observe(url, start, end, checksum)
            if part.prefetched:
                self.memory.consume(part, end - start)
            return part.view(start, end)
        if reference is not None and reference[1] - reference[0] <= self.max_part:
            ref_start, ref_end = reference
            if ref_start <= start and end <= ref_end:
                key = (url, checksum, ref_start, ref_end)
                result = await self._read_whole(url, start, end, key)
                if result is not None:
                    return result
        for _ in range(_ATTEMPTS):
            result = await self._read_parts(url, start, end, checksum)
            if result is not None:
                return result
        return await self._direct(url, start, end, checksum)

    def prefetch(self, ref: Ref) -> bool:
        """Fetch a whole reference ahead of its reader (grid read-ahead:
        :mod:`refmount.cache.chunkahead`), as one read-ahead part of the budget; True if
        its bytes are cached or on their way already (or it is not one to fetch ahead:
        too large for one part), False if the read-ahead budget has no room."""
        url, start = ref.url, ref.offset
        if url is None or ref.length is None or self._nursery is None:
            return True
        end = start + ref.length
        if not 0 < end - start <= self.max_part:
            return True
        key = (url, ref.checksum, start, end)
        if key in self._exact or (url, ref.checksum, start // self.block_size) in self._index:
            return True
        if not self._reserve((end - start) * INFLIGHT_COST, ahead=True):
            return False
        part = Part(url, start, end, ahead=True, exact=key, checksum=ref.checksum)
        self._exact[key] = part
        self._counters["grid_readahead_requests"] += 1
        self._counters["grid_readahead_bytes"] += end - start
        self._launch(part)
        return True

    def stats(self) -> dict[str, int]:
        """Counters for logs and the mount's extended attributes."""
        memory = self.memory
        out = dict(self._counters)
        # Bytes read ahead along chunk grids that no reader has read (so far).
        out["grid_readahead_unused"] = out["grid_readahead_bytes"] - out["grid_readahead_used"]
        out.update(
            evictions=memory.evictions,
            peak_bytes=memory.peak,
            readahead_unused=memory.readahead_unused,
            bytes_cached=memory.cached,
            readahead_cached=memory.ahead_cached,
            inflight_bytes=memory.inflight,
            parts_cached=len(memory.lru) + len(memory.ahead),
            whole_references=len(self._exact),
            inflight_parts=self._pending,
            streams=self.streams.count(),
            budget=self.budget,
            block_size=self.block_size,
        )
        if self.buffers is not None:
            out.update(self.buffers.stats())
        if self.source is not None:
            out.update(self.source.stats())
        return out

    # -- reading --------------------------------------------------------------------------

    async def _read_whole(
        self, url: str, start: int, end: int, key: ExactKey
    ) -> bytes | memoryview | None:
        """Serve a read from its whole reference's part, fetching the part if the read is
        random; None sends the read down the block path."""
        part = self._exact.get(key)
        _, checksum, ref_start, ref_end = key
        if part is None:
            block = (url, checksum, start // self.block_size)
            if block in self._index or self.streams.continues(url, start):
                return None
            if not self._reserve((ref_end - ref_start) * INFLIGHT_COST, ahead=False):
                return None
            part = Part(url, ref_start, ref_end, exact=key, checksum=checksum)
            self._exact[key] = part
            self._launch(part)
            self._counters["misses"] += 1
        elif part.pending:
            self._counters["misses"] += 1
            self._counters["joined"] += 1
        else:
            self._counters["hits"] += 1
        self._observe(url, start, end, checksum)
        if part.pending:
            if part.state is State.QUEUED:
                await self._fly_inline([part])
            await part.wait()
        part.check()
        if part.prefetched:
            if part.consumed == 0:
                self._counters["grid_readahead_used"] += part.end - part.start
            self.memory.consume(part, end - start)
        self.memory.touch(part)
        return part.view(start, end)

    async def _read_parts(
        self, url: str, start: int, end: int, checksum: Checksum | None
    ) -> bytes | memoryview | None:
        """One pass: use landed parts, join parts in flight, fetch missing blocks.

        None means "try again": a part turned out shorter than needed for a reason other
        than the end of the file (it was cut at an extent that has since grown).
        """
        bs = self.block_size
        index = self._index
        plan: list[PlanEntry] = []  # [part or None, lo, hi]: who serves bytes [lo, hi)
        missing: list[int] = []
        joined = False
        pos = start
        while pos < end:
            i = pos // bs
            block_end = min(end, (i + 1) * bs)
            part = index.get((url, checksum, i))
            if part is not None:
                stop = min(end, part.reach)
                if stop >= block_end:
                    plan.append([part, pos, stop])
                    joined = joined or part.pending
                    pos = stop
                    continue
                # The part ends inside this block (the end of the file, or an extent that
                # has grown since): fetch the block anew, its answer decides.
                del index[(url, checksum, i)]
            plan.append([None, pos, block_end])
            missing.append(i)
            pos = block_end

        if missing and not self._fetch_missing(url, checksum, plan, missing, end):
            self._observe(url, start, end, checksum)
            return await self._direct(url, start, end, checksum)
        self._observe(url, start, end, checksum)

        waits = list(dict.fromkeys(p for p, _, _ in plan if p.pending))
        if not waits and not missing:
            self._counters["hits"] += 1
        else:
            self._counters["misses"] += 1
            if joined:
                self._counters["joined"] += 1
        if waits:
            await self._fly_inline([p for p in waits if p.state is State.QUEUED])
            for p in waits:
                await p.wait()
        return self._assemble(url, plan)

    def _fetch_missing(
        self,
        url: str,
        checksum: Checksum | None,
        plan: list[PlanEntry],
        missing: list[int],
        end: int,
    ) -> bool:
        """Start fetches for the missing blocks of a read, adjacent ones as one request.

        Fills the new parts into ``plan``; False (and nothing started) if the budget has
        no room for all of them.  The last block stops at the extent, unless the read
        itself goes further.
        """
        bs = self.block_size
        extent = self.extent(url)
        limit = None if extent is None else max(extent, end)
        runs: list[list[int]] = []  # [first block, end block, end byte]
        for i in missing:
            if runs and runs[-1][1] == i and i - runs[-1][0] < self._part_blocks:
                runs[-1][1] = i + 1
            else:
                runs.append([i, i + 1, 0])
        for run in runs:
            run[2] = run[1] * bs if limit is None else min(run[1] * bs, limit)
        size = sum(stop - lo * bs for lo, _, stop in runs)
        if not self._reserve(size * INFLIGHT_COST, ahead=False):
            return False
        new = {}
        for lo, hi, stop in runs:
            part = self._start_blocks(url, checksum, lo, hi, stop, ahead=False)
            for i in range(lo, hi):
                new[i] = part
        for entry in plan:
            if entry[0] is None:
                entry[0] = new[entry[1] // bs]
        return True

    def _assemble(self, url: str, plan: list[PlanEntry]) -> bytes | memoryview | None:
        """The bytes the plan's parts hold, checked against what the store returned."""
        slices: list[PlanEntry] = []  # [part, lo, hi], one per part
        for entry in plan:
            part, _, hi = entry
            part.check()
            if hi > part.reach:
                if part.short:
                    raise FetchError(
                        f"{redact(url)} ends at byte {part.reach}, but byte {hi - 1} is referenced",
                        errno.EIO,
                    )
                return None
            if slices and slices[-1][0] is part:
                slices[-1][2] = hi  # same part, contiguous: one slice
            else:
                slices.append(list(entry))
        pieces: list[bytes | memoryview] = []
        for part, lo, hi in slices:
            self.memory.touch(part)
            pieces.append(part.view(lo, hi))
            if part.prefetched:
                self.memory.consume(part, hi - lo)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def _direct(self, url: str, start: int, end: int, checksum: Checksum | None) -> bytes:
        """Fetch exactly what a read needs, bypassing the cache (no room in the budget)."""
        self._counters["uncached_reads"] += 1
        data = self.fetcher.try_now(url, start, end, checksum)
        if data is not None:
            return data
        return await (self.source or self.fetcher).fetch(url, start, end, checksum=checksum)

    # -- read-ahead -----------------------------------------------------------------------

    def _observe(self, url: str, start: int, end: int, checksum: Checksum | None) -> None:
        """Follow the read in its URL's streams; issue the read-ahead they ask for (under
        the read's checksum)."""
        prefetch = self.streams.observe(url, start, end, read_ahead=self._nursery is not None)
        if prefetch is not None:
            prefetch.reached(self._prefetch(prefetch, checksum))

    def _ahead_limit_of(self, url: str) -> int | None:
        extent = self.extent(url)
        eof = self._eof.get(url)
        if extent is None:
            return eof
        return extent if eof is None else min(extent, eof)

    def _prefetch(self, want: Prefetch, checksum: Checksum | None) -> int:
        """Fetch the blocks of the wanted range not cached or in flight; return how far
        read-ahead now reaches (less than asked if the budget ran out)."""
        url, start, limit = want.url, want.start, want.limit
        bs = self.block_size
        index = self._index
        i = start // bs
        stop = -(-want.end // bs)
        run_lo = -1
        while i < stop:
            if (url, checksum, i) in index:
                if run_lo >= 0 and not self._issue_ahead(url, checksum, run_lo, i, limit):
                    return max(start, run_lo * bs)
                run_lo = -1
            elif run_lo < 0:
                run_lo = i
            elif i - run_lo >= self._part_blocks:
                if not self._issue_ahead(url, checksum, run_lo, i, limit):
                    return max(start, run_lo * bs)
                run_lo = i
            i += 1
        if run_lo >= 0 and not self._issue_ahead(url, checksum, run_lo, stop, limit):
            return max(start, run_lo * bs)
        return stop * bs if limit is None else min(stop * bs, limit)

    def _issue_ahead(
        self, url: str, checksum: Checksum | None, lo: int, hi: int, limit: int | None
    ) -> bool:
        end = hi * self.block_size if limit is None else min(hi * self.block_size, limit)
        if end <= lo * self.block_size:
            return True
        if not self._reserve((end - lo * self.block_size) * INFLIGHT_COST, ahead=True):
            return False
        self._start_blocks(url, checksum, lo, hi, end, ahead=True)
        return True

    # -- fetching -------------------------------------------------------------------------

    def _reserve(self, size: int, *, ahead: bool) -> bool:
        now = trio.current_time() if ahead else 0.0  # only read-ahead demotes stale parts
        return self.memory.reserve(size, ahead=ahead, now=now)

    def _start_blocks(
        self, url: str, checksum: Checksum | None, lo: int, hi: int, end: int, *, ahead: bool
    ) -> Part:
        """Fetch blocks ``[lo, hi)``, whose room is already reserved, in the background."""
        start = lo * self.block_size
        part = Part(url, start, end, first=lo, count=hi - lo, ahead=ahead, checksum=checksum)
        for i in range(lo, hi):
            self._index[(url, checksum, i)] = part
        self._launch(part)
        return part

    def _launch(self, part: Part) -> None:
        """Count a new part pending and start its fetch (if the cache has a nursery),
        or land it at once if the fetcher has its bytes without waiting."""
        self._pending += 1
        kind = "readahead" if part.ahead else "demand"
        self._counters[f"{kind}_requests"] += 1
        self._counters[f"{kind}_bytes"] += part.end - part.start
        data = self.fetcher.try_now(part.url, part.start, part.end, part.checksum)
        if data is not None:
            part.state = State.IN_FLIGHT
            self._land(part, data, None)
            return
        if self._nursery is not None:
            part.state = State.IN_FLIGHT
            self._nursery.start_soon(self._fly, part)

    async def _fly_inline(self, parts: list[Part]) -> None:
        """Without a nursery (tests, tools), a reader fetches its own queued parts."""
        if not parts:
            return
        for part in parts:
            part.state = State.IN_FLIGHT
        async with trio.open_nursery() as nursery:
            for part in parts:
                nursery.start_soon(self._fly, part)

    async def _fly(self, part: Part) -> None:
        data: bytes | None = None
        error: FetchError | None = None
        try:
            # A whole reference must come back whole; blocks may end with the file.  The
            # fast path has been tried (``_launch``).
            data = await (self.source or self.fetcher).fetch(
                part.url,
                part.start,
                part.end,
                allow_short=part.exact is None,
                checksum=part.checksum,
            )
        except FetchError as exc:
            error = exc
        except Exception as exc:
            # A fault in a filesystem layer must fail this read, not the whole cache.
            log.exception("fetch of %s failed unexpectedly", redact(part.url))
            error = FetchError(f"{redact(part.url)}: {type(exc).__name__}: {exc}")
        except BaseException:
            error = FetchError(f"{redact(part.url)}: the read was cancelled")
            raise
        finally:
            self._land(part, data, error)

    def _land(self, part: Part, data: bytes | None, error: FetchError | None) -> None:
        """Move a finished fetch from in flight into the cache; wake its readers."""
        self.memory.release(part)
        self._pending -= 1
        if data is None:
            self._counters["fetch_errors"] += 1
            self._unindex(part, part.first)
            part.fail(error or FetchError(f"{redact(part.url)}: no data"))
            return
        part.land(data)
        if part.short:
            self._eof[part.url] = part.reach
            # Blocks with no byte at all are forgotten: a later read asks again.
            self._unindex(part, -(-part.reach // self.block_size))
        if data:
            self.memory.hold(part, trio.current_time() if part.ahead else 0.0)

    def _forget(self, part: Part) -> None:
        """An evicted part leaves the indexes; its buffer goes to the fetcher's pool,
        which hands it out again only once nobody holds it (a reader may)."""
        self._unindex(part, part.first)
        if self.buffers is not None:
            self.buffers.give(part.data)

    def _unindex(self, part: Part, first: int) -> None:
        """Forget the part's block keys from block ``first`` on (a whole-reference part:
        its key)."""
        if part.exact is not None:
            if self._exact.get(part.exact) is part:
                del self._exact[part.exact]
            return
        index, url, checksum = self._index, part.url, part.checksum
        for i in range(max(first, part.first), part.first + part.count):
            key = (url, checksum, i)
            if index.get(key) is part:
                del index[key]

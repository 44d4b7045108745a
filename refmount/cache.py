"""One shared block cache for every open file, with read-ahead keyed by remote URL.

Blocks
    A remote file is cut into fixed blocks of ``block_size`` bytes, keyed by
    ``(url, index)``.  Every reference that points into the same bytes shares the same
    blocks, whichever key or open file asks.  A block that is being fetched sits in an
    in-flight table, so it is fetched once however many readers want it; they all wake
    when it lands, and all get the ``FetchError`` if the fetch fails (a failed block is
    not cached: a later read tries again).

Block size: 256 KiB
    A FUSE READ is 128 KiB to 1 MiB, so a read touches one to five blocks: a handful of
    dict lookups, which keeps the per-READ Python cost small.  A random read of a small
    chunk fetches at most two blocks (512 KiB), which on an object store (~50 MB/s per
    connection, 10+ ms first byte) costs little more time than the chunk alone.  Larger
    blocks would over-fetch random reads and coarsen LRU eviction; smaller ones multiply
    per-block work on the sequential path.  Request size is decoupled from block size:
    adjacent missing blocks go out as one request of up to ``max_part`` (8 MiB).

Memory
    One budget covers cached blocks *and* blocks in flight: a fetch reserves its size
    before it starts, evicting least recently used blocks to make room.  Read-ahead may
    use at most half the budget (cached-but-unread plus in flight), and never evicts
    blocks that read-ahead fetched and nobody has read yet; only a reader's own demand
    may, as a last resort.  Read-ahead that nobody has read for ``ahead_ttl`` seconds
    becomes ordinary evictable cache.  When a read cannot reserve room (a budget smaller
    than the read, or filled by fetches in flight), it is served by a direct, uncached
    fetch: correct, never a deadlock.

Read-ahead
    Streams are tracked per URL, not per open file, so zarr chunks that lie back to back
    in one remote file and are read in order become one growing sequential stream.  A
    URL keeps a few streams (interleaved sequential readers each get one).  A read that
    starts at most ``16 MiB`` ahead of or ``1 MiB`` behind a stream's position continues
    it; anything else starts a new stream.  A stream earns read-ahead after two reads
    and 512 KiB of sequential progress (a chunk read in two 128 KiB READs does not);
    its window starts at 1 MiB and doubles each time the reader gets through half of it,
    up to 64 MiB, fetched as parallel parts of up to 8 MiB in the background nursery.  A
    random read fetches only the blocks it needs.  Read-ahead never goes past
    ``extent(url)`` nor past an end of file already seen.

Short files
    Block fetches use ``allow_short``: the last block of a remote file may be short.  A
    read that needs a byte beyond what the store returned raises ``FetchError`` (EIO):
    a short file is never served as data.
"""

from __future__ import annotations

import errno
import logging
from collections import OrderedDict
from collections.abc import Callable

import trio

from refmount.errors import FetchError
from refmount.fetch import Fetcher, redact

log = logging.getLogger(__name__)

BLOCK_SIZE = 256 << 10
MAX_PART = 8 << 20  # the largest single request
INITIAL_WINDOW = 1 << 20
MAX_WINDOW = 64 << 20
SEQ_FORWARD = 16 << 20  # a read this far ahead of a stream still continues it
SEQ_BACK = 1 << 20  # ... and this far behind (the kernel reorders READs a little)
SEQ_MIN_BYTES = 512 << 10  # sequential progress before read-ahead starts
STREAMS_PER_URL = 4
MAX_TRACKED_URLS = 4096
AHEAD_TTL = 10.0  # seconds before unread read-ahead becomes ordinary cache
_ATTEMPTS = 3  # passes over the blocks before a read falls back to a direct fetch

Key = tuple[str, int]


class _Flight:
    """One request for ``count`` adjacent blocks; every reader of those blocks waits on it."""

    __slots__ = (
        "ahead",
        "blocks",
        "count",
        "end",
        "error",
        "event",
        "first",
        "reserved",
        "short",
        "start",
        "started",
        "url",
    )

    def __init__(self, url: str, first: int, count: int, start: int, end: int, ahead: bool):
        self.url = url
        self.first = first
        self.count = count
        self.start = start
        self.end = end
        self.reserved = end - start
        self.ahead = ahead
        self.event = trio.Event()
        self.blocks: list[bytes] = []
        self.error: FetchError | None = None
        self.short = False  # the store returned fewer bytes than asked: end of file
        self.started = False  # a task is fetching it

    def block(self, index: int) -> bytes:
        k = index - self.first
        return self.blocks[k] if k < len(self.blocks) else b""


class _Stream:
    """A sequential reader of one URL, as seen from the offsets it reads."""

    __slots__ = ("ahead_end", "grow_at", "pos", "reads", "run", "window")

    def __init__(self, start: int, end: int) -> None:
        self.pos = end  # where the next sequential read is expected
        self.run = end - start  # bytes of sequential progress
        self.reads = 1
        self.window = 0  # 0 until read-ahead starts
        self.ahead_end = end  # read-ahead has been issued up to here
        self.grow_at = 0  # the window doubles once pos reaches this


class BlockCache:
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
    ) -> None:
        if block_size <= 0 or max_part < block_size:
            raise ValueError("block_size must be positive and max_part at least block_size")
        self.fetcher = fetcher
        self.budget = budget
        self.extent = extent
        self.block_size = block_size
        self.max_part = max_part
        self.initial_window = initial_window
        self.max_window = max(max_window, initial_window)
        self.ahead_ttl = ahead_ttl
        self._part_blocks = max_part // block_size
        self._ahead_limit = budget // 2

        self._nursery: trio.Nursery | None = None
        # Blocks that have been read (or were fetched for a reader), least recent first.
        self._lru: OrderedDict[Key, bytes] = OrderedDict()
        # Read-ahead blocks nobody has read yet, oldest first, with their landing time.
        self._ahead: OrderedDict[Key, tuple[bytes, float]] = OrderedDict()
        self._inflight: dict[Key, _Flight] = {}
        self._lru_bytes = 0
        self._ahead_bytes = 0
        self._inflight_bytes = 0
        self._ahead_inflight = 0
        self._eof: dict[str, int] = {}  # ends of file seen in short answers
        self._streams: OrderedDict[str, list[_Stream]] = OrderedDict()
        self._counters = dict.fromkeys(
            (
                "hits",
                "misses",
                "joined",
                "evictions",
                "peak_bytes",
                "demand_requests",
                "demand_bytes",
                "readahead_requests",
                "readahead_bytes",
                "readahead_unused",
                "uncached_reads",
                "fetch_errors",
            ),
            0,
        )

    # -- public ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the nursery in which fetches run; cancelling this stops all of them."""
        if self._nursery is not None:
            raise RuntimeError("BlockCache.run is already running")
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                task_status.started()
                await trio.sleep_forever()
            finally:
                self._nursery = None

    async def read(self, url: str, start: int, end: int) -> bytes:
        """Exactly bytes ``[start, end)`` of ``url``, or ``FetchError``."""
        if start < 0:
            raise ValueError(f"negative offset {start}")
        if end <= start:
            return b""
        bs = self.block_size
        index = start // bs
        if (end - 1) // bs == index:
            # Fast path: one block, already cached.
            block = self._lookup((url, index))
            if block is not None:
                base = index * bs
                hi = end - base
                if len(block) >= hi:
                    self._counters["hits"] += 1
                    self._observe(url, start, end)
                    lo = start - base
                    return block if lo == 0 and hi == len(block) else block[lo:hi]
        for _ in range(_ATTEMPTS):
            data = await self._read_blocks(url, start, end)
            if data is not None:
                return data
        return await self._direct(url, start, end)

    def stats(self) -> dict[str, int]:
        """Counters for logs and the mount's extended attributes."""
        out = dict(self._counters)
        out.update(
            bytes_cached=self._lru_bytes + self._ahead_bytes,
            readahead_cached=self._ahead_bytes,
            inflight_bytes=self._inflight_bytes,
            blocks_cached=len(self._lru) + len(self._ahead),
            inflight_blocks=len(self._inflight),
            streams=sum(len(s) for s in self._streams.values()),
            budget=self.budget,
            block_size=self.block_size,
        )
        return out

    # -- reading --------------------------------------------------------------------------

    async def _read_blocks(self, url: str, start: int, end: int) -> bytes | None:
        """One pass: use cached blocks, join fetches in flight, fetch the rest.

        None means "try again": a block turned out shorter than needed for a reason
        other than the end of the file (it was cut at a since-grown extent).
        """
        bs = self.block_size
        first = start // bs
        last = (end - 1) // bs
        pieces: list[bytes | _Flight | None] = []
        missing: list[int] = []
        joined = False
        for i in range(first, last + 1):
            key = (url, i)
            need = min(end, (i + 1) * bs) - i * bs
            block = self._lookup(key)
            if block is not None:
                if len(block) >= need:
                    pieces.append(block)
                    continue
                self._drop(key)  # cut short: fetch it again, the answer will tell
            flight = self._inflight.get(key)
            if flight is not None:
                pieces.append(flight)
                joined = True
            else:
                pieces.append(None)
                missing.append(i)

        if missing and not self._fetch_missing(url, first, pieces, missing, end):
            self._observe(url, start, end)
            return await self._direct(url, start, end)
        self._observe(url, start, end)

        flights = list(dict.fromkeys(p for p in pieces if isinstance(p, _Flight)))
        if not flights:
            self._counters["hits"] += 1
        else:
            self._counters["misses"] += 1
            if joined:
                self._counters["joined"] += 1
            if self._nursery is None:
                mine = [f for f in flights if not f.started]
                for f in mine:
                    f.started = True
                await self._fly_inline(mine)
            for f in flights:
                await f.event.wait()
        return self._assemble(url, start, end, first, pieces)

    def _fetch_missing(
        self,
        url: str,
        first: int,
        pieces: list[bytes | _Flight | None],
        missing: list[int],
        end: int,
    ) -> bool:
        """Start fetches for the missing blocks of a read, adjacent ones as one request.

        Fills the flights into ``pieces``; False (and nothing started) if the budget has
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
        if not self._reserve(sum(stop - lo * bs for lo, _, stop in runs), ahead=False):
            return False
        for lo, hi, stop in runs:
            flight = self._start(url, lo, hi, stop, ahead=False)
            for i in range(lo, hi):
                pieces[i - first] = flight
        return True

    def _assemble(
        self, url: str, start: int, end: int, first: int, pieces: list[bytes | _Flight | None]
    ) -> bytes | None:
        bs = self.block_size
        views: list[bytes | memoryview] = []
        for n, piece in enumerate(pieces):
            i = first + n
            if isinstance(piece, _Flight):
                if piece.error is not None:
                    raise FetchError(str(piece.error), piece.error.errno) from piece.error
                block = piece.block(i)
                if piece.ahead:
                    self._lookup((url, i))  # a read-ahead block now read: ordinary cache
            else:
                assert piece is not None
                block = piece
            base = i * bs
            lo = max(start - base, 0)
            hi = min(end - base, bs)
            if len(block) < hi:
                if isinstance(piece, _Flight) and piece.short:
                    raise FetchError(
                        f"{redact(url)} ends at byte {base + len(block)}, "
                        f"but byte {base + hi - 1} is referenced",
                        errno.EIO,
                    )
                return None
            if len(pieces) == 1:
                return block if lo == 0 and hi == len(block) else block[lo:hi]
            views.append(block if lo == 0 and hi == len(block) else memoryview(block)[lo:hi])
        return b"".join(views)

    async def _direct(self, url: str, start: int, end: int) -> bytes:
        """Fetch exactly what a read needs, bypassing the cache (no room in the budget)."""
        self._counters["uncached_reads"] += 1
        return await self.fetcher.fetch(url, start, end)

    # -- read-ahead -----------------------------------------------------------------------

    def _observe(self, url: str, start: int, end: int) -> None:
        """Follow the read in its URL's streams; top up read-ahead of a sequential stream."""
        streams = self._streams.get(url)
        if streams is None:
            self._streams[url] = [_Stream(start, end)]
            if len(self._streams) > MAX_TRACKED_URLS:
                self._streams.popitem(last=False)
            return
        self._streams.move_to_end(url)
        best: _Stream | None = None
        best_distance = 0
        for s in streams:
            if s.pos - SEQ_BACK <= start <= s.pos + SEQ_FORWARD:
                distance = abs(start - s.pos)
                if best is None or distance < best_distance:
                    best, best_distance = s, distance
        if best is None:
            streams.append(_Stream(start, end))
            if len(streams) > STREAMS_PER_URL:
                del streams[0]  # the least recently used
            return
        if streams[-1] is not best:
            streams.remove(best)
            streams.append(best)
        best.reads += 1
        if end > best.pos:
            best.run += end - max(start, best.pos)
            best.pos = end
        if best.reads >= 2 and best.run >= SEQ_MIN_BYTES and self._nursery is not None:
            self._top_up(url, best)

    def _top_up(self, url: str, s: _Stream) -> None:
        pos = s.pos
        if s.window == 0:
            s.window = self.initial_window
            s.grow_at = pos + s.window // 2
        elif pos >= s.grow_at and s.window < self.max_window:
            s.window = min(2 * s.window, self.max_window)
            s.grow_at = pos + s.window // 2
        if s.ahead_end < pos:
            s.ahead_end = pos
        # Refill in whole steps once the reader has used one up: half of a small window,
        # one part of a large one (so large windows keep full-size parts flowing).
        step = max(min(s.window // 2, self.max_part), self.block_size)
        room = pos + s.window - s.ahead_end
        if room < step:
            return
        target = s.ahead_end + room // step * step
        limit = self._ahead_limit_of(url)
        if limit is not None:
            target = min(target, limit)
        if target > s.ahead_end:
            s.ahead_end = self._prefetch(url, s.ahead_end, target, limit)

    def _ahead_limit_of(self, url: str) -> int | None:
        extent = self.extent(url)
        eof = self._eof.get(url)
        if extent is None:
            return eof
        return extent if eof is None else min(extent, eof)

    def _prefetch(self, url: str, start: int, target: int, limit: int | None) -> int:
        """Fetch the blocks of ``[start, target)`` not cached or in flight; return how far
        read-ahead now reaches (less than ``target`` if the budget ran out)."""
        bs = self.block_size
        i = start // bs
        stop = -(-target // bs)
        run_lo = -1
        while i < stop:
            key = (url, i)
            if key in self._lru or key in self._ahead or key in self._inflight:
                if run_lo >= 0 and not self._issue_ahead(url, run_lo, i, limit):
                    return max(start, run_lo * bs)
                run_lo = -1
            elif run_lo < 0:
                run_lo = i
            elif i - run_lo >= self._part_blocks:
                if not self._issue_ahead(url, run_lo, i, limit):
                    return max(start, run_lo * bs)
                run_lo = i
            i += 1
        if run_lo >= 0 and not self._issue_ahead(url, run_lo, stop, limit):
            return max(start, run_lo * bs)
        return stop * bs if limit is None else min(stop * bs, limit)

    def _issue_ahead(self, url: str, lo: int, hi: int, limit: int | None) -> bool:
        end = hi * self.block_size if limit is None else min(hi * self.block_size, limit)
        if end <= lo * self.block_size:
            return True
        return self._issue(url, lo, hi, end, ahead=True) is not None

    # -- fetching -------------------------------------------------------------------------

    def _issue(self, url: str, lo: int, hi: int, end: int, *, ahead: bool) -> _Flight | None:
        """Reserve room for blocks ``[lo, hi)`` (bytes up to ``end``) and start fetching them."""
        if not self._reserve(end - lo * self.block_size, ahead):
            return None
        return self._start(url, lo, hi, end, ahead=ahead)

    def _start(self, url: str, lo: int, hi: int, end: int, *, ahead: bool) -> _Flight:
        """Fetch blocks ``[lo, hi)``, whose room is already reserved, in the background."""
        start = lo * self.block_size
        flight = _Flight(url, lo, hi - lo, start, end, ahead)
        for i in range(lo, hi):
            self._inflight[(url, i)] = flight
        kind = "readahead" if ahead else "demand"
        self._counters[f"{kind}_requests"] += 1
        self._counters[f"{kind}_bytes"] += end - start
        if self._nursery is not None:
            flight.started = True
            self._nursery.start_soon(self._fly, flight)
        return flight

    async def _fly_inline(self, flights: list[_Flight]) -> None:
        """Without ``run`` (tests, tools), a reader fetches its own blocks."""
        async with trio.open_nursery() as nursery:
            for flight in flights:
                nursery.start_soon(self._fly, flight)

    async def _fly(self, flight: _Flight) -> None:
        data: bytes | None = None
        try:
            data = await self.fetcher.fetch(flight.url, flight.start, flight.end, allow_short=True)
        except FetchError as exc:
            flight.error = exc
        except Exception as exc:
            # A fault in a filesystem layer must fail this read, not the whole cache.
            log.exception("fetch of %s failed unexpectedly", redact(flight.url))
            flight.error = FetchError(f"{redact(flight.url)}: {type(exc).__name__}: {exc}")
        except BaseException:
            flight.error = FetchError(f"{redact(flight.url)}: the read was cancelled")
            raise
        finally:
            self._land(flight, data)

    def _land(self, flight: _Flight, data: bytes | None) -> None:
        """Move a finished fetch from the in-flight table into the cache; wake its readers."""
        self._inflight_bytes -= flight.reserved
        if flight.ahead:
            self._ahead_inflight -= flight.reserved
        url, bs = flight.url, self.block_size
        for i in range(flight.first, flight.first + flight.count):
            key = (url, i)
            if self._inflight.get(key) is flight:
                del self._inflight[key]
        if data is None:
            self._counters["fetch_errors"] += 1
        else:
            if len(data) < flight.end - flight.start:
                flight.short = True
                self._eof[url] = flight.start + len(data)
            now = trio.current_time() if flight.ahead else 0.0
            blocks = flight.blocks
            for k in range(flight.count):
                block = data[k * bs : (k + 1) * bs]
                blocks.append(block)
                if block:
                    self._store((url, flight.first + k), block, flight.ahead, now)
        flight.reserved = 0
        flight.event.set()

    # -- memory ---------------------------------------------------------------------------

    def _lookup(self, key: Key) -> bytes | None:
        """A cached block, now the most recently used; read-ahead becomes ordinary cache."""
        block = self._lru.get(key)
        if block is not None:
            self._lru.move_to_end(key)
            return block
        entry = self._ahead.pop(key, None)
        if entry is None:
            return None
        block = entry[0]
        self._ahead_bytes -= len(block)
        self._lru[key] = block
        self._lru_bytes += len(block)
        return block

    def _store(self, key: Key, block: bytes, ahead: bool, now: float) -> None:
        self._drop(key)
        if ahead:
            self._ahead[key] = (block, now)
            self._ahead_bytes += len(block)
        else:
            self._lru[key] = block
            self._lru_bytes += len(block)

    def _drop(self, key: Key) -> None:
        block = self._lru.pop(key, None)
        if block is not None:
            self._lru_bytes -= len(block)
        entry = self._ahead.pop(key, None)
        if entry is not None:
            self._ahead_bytes -= len(entry[0])

    def _reserve(self, size: int, ahead: bool) -> bool:
        """Count ``size`` bytes in flight against the budget, evicting LRU blocks for room."""
        if ahead:
            if self._ahead_bytes + self._ahead_inflight + size > self._ahead_limit:
                self._demote_stale()
                if self._ahead_bytes + self._ahead_inflight + size > self._ahead_limit:
                    return False
            evictable = self._lru_bytes  # never unread read-ahead
        else:
            evictable = self._lru_bytes + self._ahead_bytes
        used = self._lru_bytes + self._ahead_bytes + self._inflight_bytes
        over = used + size - self.budget
        if over > evictable:
            return False
        while over > 0:
            if self._lru:
                _, block = self._lru.popitem(last=False)
                self._lru_bytes -= len(block)
            else:
                _, (block, _) = self._ahead.popitem(last=False)
                self._ahead_bytes -= len(block)
                self._counters["readahead_unused"] += len(block)
            over -= len(block)
            self._counters["evictions"] += 1
        self._inflight_bytes += size
        if ahead:
            self._ahead_inflight += size
        used = self._lru_bytes + self._ahead_bytes + self._inflight_bytes
        if used > self._counters["peak_bytes"]:
            self._counters["peak_bytes"] = used
        return True

    def _demote_stale(self) -> None:
        """Read-ahead unread for ``ahead_ttl`` seconds becomes evictable, oldest first."""
        cutoff = trio.current_time() - self.ahead_ttl
        while self._ahead:
            key, (block, landed) = next(iter(self._ahead.items()))
            if landed > cutoff:
                break
            del self._ahead[key]
            self._ahead_bytes -= len(block)
            self._lru[key] = block
            self._lru.move_to_end(key, last=False)
            self._lru_bytes += len(block)

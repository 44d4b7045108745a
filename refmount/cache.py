"""One shared block cache for every open file, with read-ahead keyed by remote URL.

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

Memory
    One budget covers cached parts *and* parts in flight: a fetch reserves twice its size
    before it starts (the HTTP client holds the received pieces, then their join), evicting
    least recently used parts to make room.  Read-ahead may use at most half the budget
    (landed-but-unread plus in flight), and never evicts parts that read-ahead fetched and
    nobody has read yet; only a reader's own demand may, as a last resort.  Read-ahead
    that nobody has read for ``ahead_ttl`` seconds becomes ordinary evictable cache.  A
    read-ahead part that has been read to the end goes to the cold end of the LRU, and is
    evicted at once when the cache is over half full (see ``_consume``).  When a read
    cannot reserve room (a budget smaller than the read, or filled by fetches in flight),
    it is served by a direct, uncached fetch: correct, never a deadlock.  Beyond the
    budget, memory is only what readers hold while they copy.

Read-ahead
    Streams are tracked per URL, not per open file, so zarr chunks that lie back to back
    in one remote file and are read in order become one growing sequential stream.  A URL
    keeps a few streams (interleaved sequential readers each get one).  A read that
    starts at most one block ahead of or 1 MiB behind a stream's position continues it
    (16 MiB ahead once the stream has read-ahead); anything else starts a new stream.
    A stream earns read-ahead after two reads and 512 KiB of sequential progress (a
    chunk read in two 128 KiB READs does not); its window starts at 1 MiB and doubles
    each time the reader gets through half of it, up to 64 MiB, and is refilled in whole
    steps (half the window, at most one 8 MiB part), fetched in parallel in the
    background nursery.  A random read fetches only the blocks it needs (or its whole
    small reference).  Read-ahead never goes past ``extent(url)`` nor past an end of file
    already seen.

Short files
    Fetches use ``allow_short``: the last block of a remote file may be short.  A read
    that needs a byte beyond what the store returned raises ``FetchError`` (EIO): a
    short file is never served as data.
"""

from __future__ import annotations

import contextlib
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
# A part in flight is counted twice: the HTTP client holds the received pieces and then
# their join, so the budget bounds real memory, not just the bytes that will be kept.
INFLIGHT_COST = 2
_ATTEMPTS = 3  # passes over a read before it falls back to a direct fetch

Key = tuple[str, int]


class _Part:
    """Bytes ``[start, end)`` of a URL (blocks ``first .. first+count-1``): one request.

    ``data`` is None while in flight; readers wait on ``event``.  Once landed, ``data``
    holds exactly what the store returned, which may be short at the end of a file.
    """

    __slots__ = (
        "ahead",
        "consumed",
        "count",
        "data",
        "end",
        "error",
        "event",
        "exact",
        "first",
        "landed",
        "prefetched",
        "reserved",
        "short",
        "start",
        "started",
        "url",
    )

    def __init__(
        self,
        url: str,
        first: int,
        count: int,
        start: int,
        end: int,
        ahead: bool,
        exact: tuple[str, int, int] | None = None,
    ):
        self.url = url
        self.exact = exact  # the key of a whole-reference part; None for block parts
        self.first = first
        self.count = count
        self.start = start
        self.end = end
        self.reserved = (end - start) * INFLIGHT_COST  # bytes counted while in flight
        self.ahead = ahead  # fetched by read-ahead and not read yet
        self.prefetched = ahead  # fetched by read-ahead
        self.consumed = 0  # bytes read from it so far
        self.event = trio.Event()
        self.data: bytes | None = None
        self.error: FetchError | None = None
        self.short = False  # the store returned fewer bytes than asked: end of file
        self.started = False  # a task is fetching it
        self.landed = 0.0


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
        # Every block key of every part, landed or in flight.
        self._index: dict[Key, _Part] = {}
        # Whole-reference parts, landed or in flight, by (url, start, end).
        self._exact: dict[tuple[str, int, int], _Part] = {}
        # Landed parts that have been read (or were fetched for a reader), least recent first.
        self._lru: OrderedDict[_Part, None] = OrderedDict()
        # Landed read-ahead parts nobody has read yet, oldest first.
        self._ahead: OrderedDict[_Part, None] = OrderedDict()
        self._cached_bytes = 0  # landed parts, both kinds
        self._ahead_bytes = 0  # landed unread read-ahead
        self._inflight_bytes = 0
        self._ahead_inflight = 0
        self._inflight_parts = 0
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
        data = await self.read_buffer(url, start, end)
        return data if type(data) is bytes else bytes(data)

    async def read_buffer(
        self, url: str, start: int, end: int, reference: tuple[int, int] | None = None
    ) -> bytes | memoryview:
        """Like ``read``, but a read inside one cached part comes back as a memoryview of
        it, without a copy.  pyfuse3 accepts any buffer from a ``read`` handler: a FUSE
        READ served this way costs the daemon no copy of its own (the kernel copies once
        into the page cache), and no fresh allocation per READ.

        ``reference`` is the ``[start, end)`` of the whole reference the read belongs to:
        given, a random read of a small reference fetches exactly it (see the module's
        docstring)."""
        if start < 0:
            raise ValueError(f"negative offset {start}")
        if end <= start:
            return b""
        # Fast path: one landed part holds the whole read.
        part = self._index.get((url, start // self.block_size))
        if part is not None and (data := part.data) is not None and end - part.start <= len(data):
            self._touch(part)
            self._counters["hits"] += 1
            self._observe(url, start, end)
            lo = start - part.start
            hi = end - part.start
            if part.prefetched:
                self._consume(part, hi - lo)
            return data if lo == 0 and hi == len(data) else memoryview(data)[lo:hi]
        if reference is not None and reference[1] - reference[0] <= self.max_part:
            ref_start, ref_end = reference
            if ref_start <= start and end <= ref_end:
                result = await self._read_whole(url, start, end, (url, ref_start, ref_end))
                if result is not None:
                    return result
        for _ in range(_ATTEMPTS):
            result = await self._read_parts(url, start, end)
            if result is not None:
                return result
        return await self._direct(url, start, end)

    def stats(self) -> dict[str, int]:
        """Counters for logs and the mount's extended attributes."""
        out = dict(self._counters)
        out.update(
            bytes_cached=self._cached_bytes,
            readahead_cached=self._ahead_bytes,
            inflight_bytes=self._inflight_bytes,
            parts_cached=len(self._lru) + len(self._ahead),
            whole_references=len(self._exact),
            inflight_parts=self._inflight_parts,
            streams=sum(len(s) for s in self._streams.values()),
            budget=self.budget,
            block_size=self.block_size,
        )
        return out

    # -- reading --------------------------------------------------------------------------

    async def _read_whole(
        self, url: str, start: int, end: int, key: tuple[str, int, int]
    ) -> bytes | memoryview | None:
        """Serve a read from its whole reference's part, fetching the part if the read is
        random; None sends the read down the block path."""
        part = self._exact.get(key)
        if part is None:
            if (url, start // self.block_size) in self._index or self._continues(url, start):
                return None
            _, ref_start, ref_end = key
            if not self._reserve((ref_end - ref_start) * INFLIGHT_COST, ahead=False):
                return None
            part = _Part(url, -1, 0, ref_start, ref_end, ahead=False, exact=key)
            self._exact[key] = part
            self._launch(part)
            self._counters["misses"] += 1
        elif part.data is None:
            self._counters["misses"] += 1
            self._counters["joined"] += 1
        else:
            self._counters["hits"] += 1
        self._observe(url, start, end)
        if part.data is None:
            if not part.started:
                part.started = True
                await self._fly_inline([part])
            await part.event.wait()
        if part.error is not None:
            raise FetchError(str(part.error), part.error.errno) from part.error
        self._touch(part)
        data = part.data
        assert data is not None
        lo, hi = start - part.start, end - part.start
        return data if lo == 0 and hi == len(data) else memoryview(data)[lo:hi]

    def _continues(self, url: str, start: int) -> bool:
        """Whether a read at ``start`` goes on from where one of the URL's streams stands:
        right where its last read ended (the next of back-to-back chunks), or inside the
        reach of its read-ahead."""
        return any(
            start == s.pos or (s.window and s.pos - SEQ_BACK <= start <= s.ahead_end)
            for s in self._streams.get(url, ())
        )

    async def _read_parts(self, url: str, start: int, end: int) -> bytes | memoryview | None:
        """One pass: use landed parts, join parts in flight, fetch missing blocks.

        None means "try again": a part turned out shorter than needed for a reason other
        than the end of the file (it was cut at an extent that has since grown).
        """
        bs = self.block_size
        index = self._index
        plan: list[list] = []  # [part or None, lo, hi]: who serves bytes [lo, hi)
        missing: list[int] = []
        joined = False
        pos = start
        while pos < end:
            i = pos // bs
            block_end = min(end, (i + 1) * bs)
            part = index.get((url, i))
            if part is not None:
                data = part.data
                stop = min(end, part.end if data is None else part.start + len(data))
                if stop >= block_end:
                    plan.append([part, pos, stop])
                    joined = joined or data is None
                    pos = stop
                    continue
                # The part ends inside this block (the end of the file, or an extent that
                # has grown since): fetch the block anew, its answer decides.
                del index[(url, i)]
            plan.append([None, pos, block_end])
            missing.append(i)
            pos = block_end

        if missing and not self._fetch_missing(url, plan, missing, end):
            self._observe(url, start, end)
            return await self._direct(url, start, end)
        self._observe(url, start, end)

        waits = [p for p, _, _ in plan if p.data is None]
        if not waits and not missing:
            self._counters["hits"] += 1
        else:
            self._counters["misses"] += 1
            if joined:
                self._counters["joined"] += 1
        if waits:
            if self._nursery is None:
                mine = list(dict.fromkeys(p for p in waits if not p.started))
                for p in mine:
                    p.started = True
                await self._fly_inline(mine)
            for p in dict.fromkeys(waits):
                await p.event.wait()
        return self._assemble(url, plan)

    def _fetch_missing(self, url: str, plan: list[list], missing: list[int], end: int) -> bool:
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
            part = self._start(url, lo, hi, stop, ahead=False)
            for i in range(lo, hi):
                new[i] = part
        for entry in plan:
            if entry[0] is None:
                entry[0] = new[entry[1] // bs]
        return True

    def _assemble(self, url: str, plan: list[list]) -> bytes | memoryview | None:
        """The bytes the plan's parts hold, checked against what the store returned."""
        slices: list[list] = []  # [part, lo, hi], one per part
        for entry in plan:
            part, _, hi = entry
            if part.error is not None:
                raise FetchError(str(part.error), part.error.errno) from part.error
            data = part.data
            if hi - part.start > len(data):
                if part.short:
                    raise FetchError(
                        f"{redact(url)} ends at byte {part.start + len(data)}, "
                        f"but byte {hi - 1} is referenced",
                        errno.EIO,
                    )
                return None
            if slices and slices[-1][0] is part:
                slices[-1][2] = hi  # same part, contiguous: one slice
            else:
                slices.append(list(entry))
        pieces: list[bytes | memoryview] = []
        for part, lo, hi in slices:
            self._touch(part)
            data = part.data
            lo -= part.start
            hi -= part.start
            pieces.append(data if lo == 0 and hi == len(data) else memoryview(data)[lo:hi])
            if part.prefetched:
                self._consume(part, hi - lo)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def _direct(self, url: str, start: int, end: int) -> bytes:
        """Fetch exactly what a read needs, bypassing the cache (no room in the budget)."""
        self._counters["uncached_reads"] += 1
        data = self.fetcher.try_now(url, start, end)
        return data if data is not None else await self.fetcher.fetch(url, start, end)

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
            # Until it earns read-ahead, a stream continues only with (nearly) adjacent
            # reads: many random readers of one large file would otherwise keep landing
            # within reach of each other's streams and start read-ahead nobody uses.
            reach = SEQ_FORWARD if s.window else self.block_size
            if s.pos - SEQ_BACK <= start <= s.pos + reach:
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
        index = self._index
        i = start // bs
        stop = -(-target // bs)
        run_lo = -1
        while i < stop:
            if (url, i) in index:
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
        if not self._reserve((end - lo * self.block_size) * INFLIGHT_COST, ahead=True):
            return False
        self._start(url, lo, hi, end, ahead=True)
        return True

    # -- fetching -------------------------------------------------------------------------

    def _start(self, url: str, lo: int, hi: int, end: int, *, ahead: bool) -> _Part:
        """Fetch blocks ``[lo, hi)``, whose room is already reserved, in the background."""
        part = _Part(url, lo, hi - lo, lo * self.block_size, end, ahead)
        for i in range(lo, hi):
            self._index[(url, i)] = part
        self._launch(part)
        return part

    def _launch(self, part: _Part) -> None:
        """Count a new part in flight and start its fetch (if the cache runs a nursery),
        or land it at once if the fetcher has its bytes without waiting."""
        self._inflight_parts += 1
        kind = "readahead" if part.ahead else "demand"
        self._counters[f"{kind}_requests"] += 1
        self._counters[f"{kind}_bytes"] += part.end - part.start
        data = self.fetcher.try_now(part.url, part.start, part.end)
        if data is not None:
            part.started = True
            self._land(part, data)
            return
        if self._nursery is not None:
            part.started = True
            self._nursery.start_soon(self._fly, part)

    async def _fly_inline(self, parts: list[_Part]) -> None:
        """Without ``run`` (tests, tools), a reader fetches its own blocks."""
        async with trio.open_nursery() as nursery:
            for part in parts:
                nursery.start_soon(self._fly, part)

    async def _fly(self, part: _Part) -> None:
        data: bytes | None = None
        try:
            # A whole reference must come back whole; blocks may end with the file.  The
            # fast path has been tried (``_launch``).
            data = await self.fetcher.fetch(
                part.url, part.start, part.end, allow_short=part.exact is None
            )
        except FetchError as exc:
            part.error = exc
        except Exception as exc:
            # A fault in a filesystem layer must fail this read, not the whole cache.
            log.exception("fetch of %s failed unexpectedly", redact(part.url))
            part.error = FetchError(f"{redact(part.url)}: {type(exc).__name__}: {exc}")
        except BaseException:
            part.error = FetchError(f"{redact(part.url)}: the read was cancelled")
            raise
        finally:
            self._land(part, data)

    def _land(self, part: _Part, data: bytes | None) -> None:
        """Move a finished fetch from in flight into the cache; wake its readers."""
        self._inflight_bytes -= part.reserved
        if part.ahead:
            self._ahead_inflight -= part.reserved
        part.reserved = 0
        self._inflight_parts -= 1
        if data is None:
            self._counters["fetch_errors"] += 1
            part.data = b""
            self._unindex(part, part.first)
        else:
            part.data = data
            got = part.start + len(data)
            if got < part.end:
                part.short = True
                self._eof[part.url] = got
                # Blocks with no byte at all are forgotten: a later read asks again.
                self._unindex(part, -(-got // self.block_size))
            if data:
                self._cached_bytes += len(data)
                if part.ahead:
                    part.landed = trio.current_time()
                    self._ahead[part] = None
                    self._ahead_bytes += len(data)
                else:
                    self._lru[part] = None
        part.event.set()

    def _unindex(self, part: _Part, first: int) -> None:
        """Forget the part's block keys from block ``first`` on (a whole-reference part:
        its key)."""
        if part.exact is not None:
            if self._exact.get(part.exact) is part:
                del self._exact[part.exact]
            return
        index, url = self._index, part.url
        for i in range(max(first, part.first), part.first + part.count):
            key = (url, i)
            if index.get(key) is part:
                del index[key]

    # -- memory ---------------------------------------------------------------------------

    def _touch(self, part: _Part) -> None:
        """The part was read: most recently used; read-ahead becomes ordinary cache."""
        if part.ahead:
            part.ahead = False
            if part in self._ahead:
                del self._ahead[part]
                self._ahead_bytes -= len(part.data)  # type: ignore[arg-type]
                self._lru[part] = None
            return
        with contextlib.suppress(KeyError):  # evicted while its reader waited
            self._lru.move_to_end(part)

    def _consume(self, part: _Part, n: int) -> None:
        """Count bytes read from a read-ahead part; let go of it once all have been read.

        A sequential stream rarely comes back (and the kernel's page cache serves a file's
        re-reads), so a fully read read-ahead part is the first to evict, and once the
        cache is half full it is evicted at once: a long stream then recycles the same
        memory instead of pushing out what random readers use (and fresh memory is slow
        to fault in on small VMs).
        """
        part.consumed += n
        if part.consumed < len(part.data) or part not in self._lru:  # type: ignore[arg-type]
            return
        if self._cached_bytes > self.budget // 2:
            del self._lru[part]
            self._evict(part)
        else:
            self._lru.move_to_end(part, last=False)

    def _evict(self, part: _Part) -> None:
        assert part.data is not None
        self._cached_bytes -= len(part.data)
        self._unindex(part, part.first)
        self._counters["evictions"] += 1

    def _reserve(self, size: int, ahead: bool) -> bool:
        """Count ``size`` bytes in flight against the budget, evicting LRU parts for room."""
        if ahead:
            if self._ahead_bytes + self._ahead_inflight + size > self._ahead_limit:
                self._demote_stale()
                if self._ahead_bytes + self._ahead_inflight + size > self._ahead_limit:
                    return False
            evictable = self._cached_bytes - self._ahead_bytes  # never unread read-ahead
        else:
            evictable = self._cached_bytes
        over = self._cached_bytes + self._inflight_bytes + size - self.budget
        if over > evictable:
            return False
        while over > 0:
            if self._lru:
                part, _ = self._lru.popitem(last=False)
            else:
                part, _ = self._ahead.popitem(last=False)
                assert part.data is not None
                part.ahead = False
                self._ahead_bytes -= len(part.data)
                self._counters["readahead_unused"] += len(part.data)
            self._evict(part)
            over -= len(part.data)
        self._inflight_bytes += size
        if ahead:
            self._ahead_inflight += size
        used = self._cached_bytes + self._inflight_bytes
        if used > self._counters["peak_bytes"]:
            self._counters["peak_bytes"] = used
        return True

    def _demote_stale(self) -> None:
        """Read-ahead unread for ``ahead_ttl`` seconds becomes evictable, oldest first."""
        cutoff = trio.current_time() - self.ahead_ttl
        while self._ahead:
            part = next(iter(self._ahead))
            if part.landed > cutoff:
                break
            del self._ahead[part]
            part.ahead = False
            assert part.data is not None
            self._ahead_bytes -= len(part.data)
            self._lru[part] = None
            self._lru.move_to_end(part, last=False)

"""Sequential streams of reads per remote URL, and the read-ahead they earn.

Pure bookkeeping, no trio and no I/O: :class:`StreamTracker` is told of every read and
answers with the range to prefetch, if any; the cache fetches what its budget allows and
says how far it got (``Prefetch.reached``).

Streams are tracked per URL, not per open file, so zarr chunks that lie back to back in
one remote file and are read in order become one growing sequential stream.  A URL keeps
a few streams (interleaved sequential readers each get one).  A read that starts at most
one block ahead of or 1 MiB behind a stream's position continues it (16 MiB ahead once
the stream has read-ahead); anything else starts a new stream.  A stream earns read-ahead
after two reads and 512 KiB of sequential progress (a chunk read in two 128 KiB READs
does not); its window starts at 1 MiB and doubles each time the reader gets through half
of it, up to 64 MiB, and is refilled in whole steps (half the window, at most one part).
Read-ahead never goes past the URL's limit (its extent, or an end of file already seen).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

INITIAL_WINDOW = 1 << 20
MAX_WINDOW = 64 << 20
SEQ_FORWARD = 16 << 20  # a read this far ahead of a stream with read-ahead continues it
SEQ_BACK = 1 << 20  # ... and this far behind (the kernel reorders READs a little)
SEQ_MIN_BYTES = 512 << 10  # sequential progress before read-ahead starts
STREAMS_PER_URL = 4
MAX_TRACKED_URLS = 4096


class Stream:
    """A sequential reader of one URL, as seen from the offsets it reads."""

    __slots__ = ("ahead_end", "grow_at", "pos", "reads", "run", "window")

    def __init__(self, start: int, end: int) -> None:
        self.pos = end  # where the next sequential read is expected
        self.run = end - start  # bytes of sequential progress
        self.reads = 1
        self.window = 0  # 0 until read-ahead starts
        self.ahead_end = end  # read-ahead has been issued up to here
        self.grow_at = 0  # the window doubles once pos reaches this


@dataclass(slots=True)
class Prefetch:
    """Bytes ``[start, end)`` of ``url`` a stream wants fetched ahead of its reader.

    ``limit`` is where the URL ends as far as is known (None: unknown); the cache must
    call ``reached`` with how far its read-ahead now goes.
    """

    url: str
    start: int
    end: int
    limit: int | None
    stream: Stream

    def reached(self, pos: int) -> None:
        self.stream.ahead_end = pos


class StreamTracker:
    """The streams of every URL read lately (at most ``MAX_TRACKED_URLS``)."""

    def __init__(
        self,
        *,
        block_size: int,
        max_part: int,
        initial_window: int = INITIAL_WINDOW,
        max_window: int = MAX_WINDOW,
        limit: Callable[[str], int | None] = lambda url: None,
    ) -> None:
        self.block_size = block_size
        self.max_part = max_part
        self.initial_window = initial_window
        self.max_window = max(max_window, initial_window)
        self.limit = limit
        self._streams: OrderedDict[str, list[Stream]] = OrderedDict()

    def of(self, url: str) -> list[Stream]:
        """The URL's streams, least recently used first."""
        return self._streams.get(url, [])

    def count(self) -> int:
        return sum(len(s) for s in self._streams.values())

    def continues(self, url: str, start: int) -> bool:
        """Whether a read at ``start`` goes on from where one of the URL's streams stands:
        right where its last read ended (the next of back-to-back chunks), or inside the
        reach of its read-ahead."""
        return any(
            start == s.pos or (s.window and s.pos - SEQ_BACK <= start <= s.ahead_end)
            for s in self._streams.get(url, ())
        )

    def observe(
        self, url: str, start: int, end: int, *, read_ahead: bool = True
    ) -> Prefetch | None:
        """Follow a read of ``[start, end)`` in its URL's streams; the read-ahead a
        sequential stream should issue now, if any (never without ``read_ahead``)."""
        streams = self._streams.get(url)
        if streams is None:
            self._streams[url] = [Stream(start, end)]
            if len(self._streams) > MAX_TRACKED_URLS:
                self._streams.popitem(last=False)
            return None
        self._streams.move_to_end(url)
        best: Stream | None = None
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
            streams.append(Stream(start, end))
            if len(streams) > STREAMS_PER_URL:
                del streams[0]  # the least recently used
            return None
        if streams[-1] is not best:
            streams.remove(best)
            streams.append(best)
        best.reads += 1
        if end > best.pos:
            best.run += end - max(start, best.pos)
            best.pos = end
        if best.reads >= 2 and best.run >= SEQ_MIN_BYTES and read_ahead:
            return self._top_up(url, best)
        return None

    def _top_up(self, url: str, s: Stream) -> Prefetch | None:
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
            return None
        target = s.ahead_end + room // step * step
        limit = self.limit(url)
        if limit is not None:
            target = min(target, limit)
        if target <= s.ahead_end:
            return None
        return Prefetch(url, s.ahead_end, target, limit, s)

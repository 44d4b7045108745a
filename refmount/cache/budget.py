"""One memory budget for landed parts and parts in flight, with least-recently-used eviction.

A fetch reserves its room (twice its size, ``INFLIGHT_COST``) before it starts, evicting
least recently used parts to make room; when it lands the reservation is released and
the part's bytes are held instead.  Read-ahead may use at most half the budget (landed
but unread, plus in flight), and never evicts parts that read-ahead fetched and nobody
has read yet; only a reader's own demand may, as a last resort.  Read-ahead unread for
``ahead_ttl`` seconds becomes ordinary evictable cache.  A read-ahead part read to the
end goes to the cold end of the LRU, and is evicted at once when the cache is over half
full (see ``consume``).

Pure bookkeeping: no trio, no I/O.  The clock comes in as ``now``; what an eviction
means for the cache's indexes is the ``forget`` callback's business.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator

from refmount.cache.parts import Part


class MemoryBudget:
    """Bytes held and reserved, within ``limit``; evicts through ``forget``."""

    def __init__(self, limit: int, *, ahead_ttl: float, forget: Callable[[Part], None]) -> None:
        self.limit = limit
        self.ahead_limit = limit // 2
        self.ahead_ttl = ahead_ttl
        self._forget = forget
        # Landed parts that have been read (or were fetched for a reader), least recent first.
        self.lru: OrderedDict[Part, None] = OrderedDict()
        # Landed read-ahead parts nobody has read yet, oldest first.
        self.ahead: OrderedDict[Part, None] = OrderedDict()
        self.cached = 0  # landed parts, both kinds
        self.ahead_cached = 0  # landed unread read-ahead
        self.inflight = 0  # reserved by parts in flight
        self.ahead_inflight = 0  # ... of which read-ahead
        self.peak = 0
        self.evictions = 0
        self.readahead_unused = 0  # bytes of read-ahead evicted unread

    def parts(self) -> Iterator[Part]:
        yield from self.lru
        yield from self.ahead

    def reserve(self, size: int, *, ahead: bool, now: float) -> bool:
        """Count ``size`` bytes in flight, evicting LRU parts for room; False (nothing
        evicted) if there is no room."""
        if ahead:
            if self.ahead_cached + self.ahead_inflight + size > self.ahead_limit:
                self.demote_stale(now)
                if self.ahead_cached + self.ahead_inflight + size > self.ahead_limit:
                    return False
            evictable = self.cached - self.ahead_cached  # never unread read-ahead
        else:
            evictable = self.cached
        over = self.cached + self.inflight + size - self.limit
        if over > evictable:
            return False
        while over > 0:
            if self.lru:
                part, _ = self.lru.popitem(last=False)
            else:
                part, _ = self.ahead.popitem(last=False)
                part.ahead = False
                self.ahead_cached -= len(part.data)
                self.readahead_unused += len(part.data)
            self._evict(part)
            over -= len(part.data)
        self.inflight += size
        if ahead:
            self.ahead_inflight += size
        self.peak = max(self.peak, self.cached + self.inflight)
        return True

    def release(self, part: Part) -> None:
        """The part's fetch ended: its reservation is no longer in flight."""
        self.inflight -= part.reserved
        if part.ahead:
            self.ahead_inflight -= part.reserved
        part.reserved = 0

    def hold(self, part: Part, now: float) -> None:
        """Keep a landed part's bytes: unread read-ahead apart, the rest in the LRU."""
        size = len(part.data)
        self.cached += size
        if part.ahead:
            part.landed_at = now
            self.ahead[part] = None
            self.ahead_cached += size
        else:
            self.lru[part] = None

    def touch(self, part: Part) -> None:
        """The part was read: most recently used; read-ahead becomes ordinary cache."""
        if part.ahead:
            part.ahead = False
            if part in self.ahead:
                del self.ahead[part]
                self.ahead_cached -= len(part.data)
                self.lru[part] = None
            return
        if part in self.lru:  # not if evicted while its reader waited
            self.lru.move_to_end(part)

    def consume(self, part: Part, n: int) -> None:
        """Count bytes read from a read-ahead part; let go of it once all have been read.

        A sequential stream rarely comes back (and the kernel's page cache serves a file's
        re-reads), so a fully read read-ahead part is the first to evict, and once the
        cache is half full it is evicted at once: a long stream then recycles the same
        memory instead of pushing out what random readers use (and fresh memory is slow
        to fault in on small VMs).
        """
        part.consumed += n
        if part.consumed < len(part.data) or part not in self.lru:
            return
        if self.cached > self.limit // 2:
            del self.lru[part]
            self._evict(part)
        else:
            self.lru.move_to_end(part, last=False)

    def demote_stale(self, now: float) -> None:
        """Read-ahead unread for ``ahead_ttl`` seconds becomes evictable, oldest first."""
        cutoff = now - self.ahead_ttl
        while self.ahead:
            part = next(iter(self.ahead))
            if part.landed_at > cutoff:
                break
            del self.ahead[part]
            part.ahead = False
            self.ahead_cached -= len(part.data)
            self.lru[part] = None
            self.lru.move_to_end(part, last=False)

    def _evict(self, part: Part) -> None:
        self.cached -= len(part.data)
        self.evictions += 1
        self._forget(part)

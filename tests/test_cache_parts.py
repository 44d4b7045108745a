"""The cache's pure pieces, without trio or a fetcher: streams and the memory budget."""

from __future__ import annotations

import itertools

from refmount.cache import MemoryBudget, Part, Prefetch, State, StreamTracker
from refmount.cache.streams import SEQ_BACK, SEQ_MIN_BYTES, STREAMS_PER_URL

KiB = 1 << 10
MiB = 1 << 20
URL = "http://host/a.bin"


def tracker(limit: int | None = None, **kwargs: int) -> StreamTracker:
    return StreamTracker(block_size=256 * KiB, max_part=8 * MiB, limit=lambda url: limit, **kwargs)


def read_sequentially(t: StreamTracker, size: int, step: int) -> list[Prefetch]:
    """Read ``[0, size)`` in steps; what the tracker asks for, each answered in full."""
    asked = []
    for start in range(0, size, step):
        prefetch = t.observe(URL, start, start + step)
        if prefetch is not None:
            asked.append(prefetch)
            prefetch.reached(prefetch.end)
    return asked


# -- StreamTracker ---------------------------------------------------------------------


def test_a_stream_earns_read_ahead_after_two_reads_and_512_kib() -> None:
    t = tracker()
    assert t.observe(URL, 0, 128 * KiB) is None  # first read: a new stream
    for start in range(128 * KiB, SEQ_MIN_BYTES - 128 * KiB, 128 * KiB):
        assert t.observe(URL, start, start + 128 * KiB) is None
    prefetch = t.observe(URL, SEQ_MIN_BYTES - 128 * KiB, SEQ_MIN_BYTES)
    assert prefetch is not None
    # The first window is 1 MiB from the reader's position, asked in one step of half.
    assert (prefetch.url, prefetch.start) == (URL, SEQ_MIN_BYTES)
    assert prefetch.end == SEQ_MIN_BYTES + 1 * MiB
    assert t.of(URL)[0].window == 1 * MiB


def test_the_window_doubles_up_to_its_maximum_and_is_refilled_in_steps() -> None:
    t = tracker(max_window=16 * MiB)
    asked = read_sequentially(t, 64 * MiB, 128 * KiB)
    assert t.of(URL)[0].window == 16 * MiB
    # Every byte from the first prefetch on is asked once, in order, without gaps.
    for before, after in itertools.pairwise(asked):
        assert after.start == before.end
    assert asked[-1].end >= 64 * MiB
    # Steps: half the window, never more than one part (8 MiB).
    sizes = [p.end - p.start for p in asked]
    assert max(sizes) == 8 * MiB
    assert min(sizes) >= 256 * KiB


def test_read_ahead_stops_at_the_limit() -> None:
    t = tracker(limit=3 * MiB)
    asked = read_sequentially(t, 3 * MiB, 128 * KiB)
    assert asked
    assert max(p.end for p in asked) == 3 * MiB
    assert all(p.limit == 3 * MiB for p in asked)


def test_a_budget_that_stops_short_is_asked_again() -> None:
    t = tracker()
    read_sequentially(t, SEQ_MIN_BYTES - 128 * KiB, 128 * KiB)
    first = t.observe(URL, SEQ_MIN_BYTES - 128 * KiB, SEQ_MIN_BYTES)
    assert first is not None
    first.reached(first.start)  # nothing could be fetched
    again = t.observe(URL, SEQ_MIN_BYTES, SEQ_MIN_BYTES + 128 * KiB)
    assert again is not None
    assert again.start == SEQ_MIN_BYTES + 128 * KiB  # from the reader's new position


def test_without_read_ahead_streams_are_followed_but_nothing_is_asked() -> None:
    t = tracker()
    for start in range(0, 8 * MiB, 128 * KiB):
        assert t.observe(URL, start, start + 128 * KiB, read_ahead=False) is None
    stream = t.of(URL)[0]
    assert (stream.pos, stream.run, stream.window) == (8 * MiB, 8 * MiB, 0)


def test_random_reads_make_new_streams_and_never_ask() -> None:
    t = tracker()
    for k in range(40):
        start = (k * 7919 % 97) * MiB
        assert t.observe(URL, start, start + 128 * KiB) is None
    assert len(t.of(URL)) == STREAMS_PER_URL
    assert all(s.window == 0 for s in t.of(URL))


def test_interleaved_readers_each_keep_a_stream() -> None:
    t = tracker()
    bases = [0, 100 * MiB, 200 * MiB]
    for step in range(0, 2 * MiB, 128 * KiB):
        for base in bases:
            prefetch = t.observe(URL, base + step, base + step + 128 * KiB)
            if prefetch is not None:
                prefetch.reached(prefetch.end)
    assert sorted(s.pos for s in t.of(URL)) == [b + 2 * MiB for b in bases]
    assert all(s.window >= 1 * MiB for s in t.of(URL))


def test_continues_means_the_next_chunk_or_inside_read_ahead() -> None:
    t = tracker()
    t.observe(URL, 0, 100 * KiB)
    assert t.continues(URL, 100 * KiB)
    assert not t.continues(URL, 101 * KiB)
    assert not t.continues("http://host/other", 0)
    read_sequentially(t, 4 * MiB, 128 * KiB)
    stream = t.of(URL)[-1]
    assert stream.window > 0
    assert t.continues(URL, stream.pos - SEQ_BACK)
    assert t.continues(URL, stream.ahead_end)
    assert not t.continues(URL, stream.ahead_end + 1)


# -- MemoryBudget ----------------------------------------------------------------------


def landed(size: int, *, ahead: bool = False, start: int = 0) -> Part:
    part = Part(URL, start, start + size, ahead=ahead)
    part.state = State.IN_FLIGHT
    part.land(bytes(size))
    return part


class Holder:
    """A budget with the parts it forgot recorded, as the cache's indexes would be."""

    def __init__(self, limit: int, ttl: float = 10.0) -> None:
        self.forgotten: list[Part] = []
        self.budget = MemoryBudget(limit, ahead_ttl=ttl, forget=self.forgotten.append)

    def fetch(self, size: int, *, ahead: bool = False, now: float = 0.0) -> Part | None:
        """Reserve, then land: what the cache does around one fetch."""
        if not self.budget.reserve(2 * size, ahead=ahead, now=now):
            return None
        part = Part(URL, 0, size, ahead=ahead)
        self.budget.release(part)
        part.land(bytes(size))
        self.budget.hold(part, now)
        return part


def test_reservations_count_twice_and_evict_least_recently_used() -> None:
    h = Holder(limit=700)
    a = h.fetch(200)
    b = h.fetch(200)
    assert a is not None and b is not None
    assert (h.budget.cached, h.budget.inflight) == (400, 0)
    h.budget.touch(a)  # b is now the least recently used
    c = h.fetch(200)  # 400 held + 400 reserved > 700: evicts b
    assert c is not None
    assert h.forgotten == [b]
    assert list(h.budget.lru) == [a, c]
    assert h.budget.cached == 400
    assert h.budget.evictions == 1
    assert h.budget.peak == 600  # 200 held + 400 reserved


def test_a_reservation_larger_than_what_can_be_evicted_fails_and_evicts_nothing() -> None:
    h = Holder(limit=1000)
    h.fetch(300)
    assert not h.budget.reserve(1200, ahead=False, now=0)
    assert h.forgotten == []
    assert (h.budget.cached, h.budget.inflight) == (300, 0)


def test_read_ahead_gets_half_the_budget_and_never_evicts_unread_read_ahead() -> None:
    h = Holder(limit=1000)
    first = h.fetch(200, ahead=True)
    assert first is not None
    assert h.budget.ahead_cached == 200
    assert not h.budget.reserve(400, ahead=True, now=1.0)  # 200 + 400 > half of 1000
    assert h.budget.reserve(300, ahead=True, now=1.0)
    assert h.budget.ahead_inflight == 300
    # Demand may evict unread read-ahead as a last resort, counted as unused.
    assert h.budget.reserve(600, ahead=False, now=1.0)  # 200 + 300 + 600 > 1000
    assert h.forgotten == [first]
    assert h.budget.readahead_unused == 200


def test_stale_read_ahead_becomes_evictable() -> None:
    h = Holder(limit=1000, ttl=5.0)
    old = h.fetch(200, ahead=True, now=0.0)
    assert old is not None
    assert not h.budget.reserve(400, ahead=True, now=4.0)
    assert h.budget.reserve(400, ahead=True, now=6.0)  # ``old`` demoted, not evicted
    assert list(h.budget.lru) == [old]
    assert h.budget.ahead_cached == 0
    assert h.forgotten == []


def test_touch_moves_read_ahead_into_the_lru() -> None:
    h = Holder(limit=1000)
    part = h.fetch(100, ahead=True)
    assert part is not None
    h.budget.touch(part)
    assert not part.ahead
    assert list(h.budget.lru) == [part]
    assert h.budget.ahead_cached == 0


def test_a_fully_read_read_ahead_part_goes_cold_or_is_dropped_when_half_full() -> None:
    h = Holder(limit=1000)
    keep = h.fetch(100)
    part = h.fetch(100, ahead=True)
    assert keep is not None and part is not None
    h.budget.touch(part)
    h.budget.consume(part, 60)
    assert list(h.budget.lru) == [keep, part]  # not all read yet
    h.budget.consume(part, 40)
    assert list(h.budget.lru) == [part, keep]  # cold end: evicted first
    big = h.fetch(200, ahead=True)
    filler = h.fetch(300)
    assert big is not None and filler is not None
    h.budget.touch(big)
    h.budget.consume(big, 200)  # 700 held > half of 1000: dropped at once
    assert big in h.forgotten
    assert big not in h.budget.lru


def test_part_states() -> None:
    part = Part(URL, 10, 20)
    assert part.state is State.QUEUED and part.pending
    assert part.reach == 20
    part.state = State.IN_FLIGHT
    part.land(b"abcde")
    assert part.state is State.LANDED and not part.pending
    assert part.short and part.reach == 15
    assert bytes(part.view(11, 13)) == b"bc"
    assert part.view(10, 15) is part.data

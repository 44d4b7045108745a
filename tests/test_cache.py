"""BlockCache: exact bytes, single flight, coalescing, read-ahead, budget, failures.

Everything runs against real local files through a real ``Fetcher``; a subclass records
every request so the tests can assert on what went to the store.
"""

from __future__ import annotations

import errno
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio

from refmount.cache import SEQ_MIN_BYTES, BlockCache
from refmount.errors import FetchError
from refmount.fetch import Fetcher
from refmount.refs.model import Checksum

KiB = 1 << 10
MiB = 1 << 20


class RecordingFetcher(Fetcher):
    """A real fetcher that records each request and can be slowed down or made to fail."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.calls: list[tuple[str, int, int]] = []
        self.delay: Callable[[], float] = lambda: 0.0
        self.fail: Callable[[str, int, int], bool] = lambda url, start, end: False
        self.gate: trio.Event | None = None  # when set, fetches wait for it
        self.active = 0
        self.max_active = 0

    async def fetch(
        self,
        url: str,
        start: int,
        end: int,
        *,
        allow_short: bool = False,
        checksum: Checksum | None = None,
    ) -> bytes:
        self.calls.append((url, start, end))
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if self.gate is not None:
                await self.gate.wait()
            delay = self.delay()
            if delay:
                await trio.sleep(delay)
            if self.fail(url, start, end):
                raise FetchError(f"injected failure at {start}", errno.EIO)
            return await super().fetch(url, start, end, allow_short=allow_short, checksum=checksum)
        finally:
            self.active -= 1

    def try_now(
        self, url: str, start: int, end: int, checksum: Checksum | None = None
    ) -> bytes | None:
        """Recorded like ``fetch``; never used while fetches are slowed, gated or failing."""
        if self.gate is not None or self.delay() or self.fail(url, start, end):
            return None
        data = super().try_now(url, start, end, checksum)
        if data is not None:
            self.calls.append((url, start, end))
        return data

    def fetched_bytes(self) -> int:
        return sum(end - start for _, start, end in self.calls)


def make_file(path: Path, size: int, seed: int = 0) -> tuple[str, bytes]:
    data = random.Random(seed).randbytes(size)
    path.write_bytes(data)
    return str(path), data


def with_cache(
    cache: BlockCache, body: Callable[[BlockCache], Awaitable[None]], *, run: bool = True
) -> None:
    """Run ``body`` inside trio with the cache's background task started."""

    async def main() -> None:
        if not run:
            await body(cache)
            return
        async with trio.open_nursery() as nursery:
            await nursery.start(cache.run)
            await body(cache)
            nursery.cancel_scope.cancel()

    trio.run(main)


def assert_accounting(cache: BlockCache) -> None:
    """The counters agree with what the cache really holds, and nothing is in flight."""
    parts = [*cache.memory.lru, *cache.memory.ahead]
    held = sum(len(p.data) for p in parts)
    stats = cache.stats()
    assert stats["bytes_cached"] == held
    assert stats["readahead_cached"] == sum(len(p.data) for p in cache.memory.ahead)
    assert stats["inflight_bytes"] == 0
    assert stats["inflight_parts"] == 0
    assert held <= cache.budget
    # Every indexed block belongs to a cached part that holds some of its bytes.
    bs = cache.block_size
    for (url, checksum, i), part in cache._index.items():
        assert part in cache.memory.lru or part in cache.memory.ahead
        assert (part.url, part.checksum) == (url, checksum)
        assert part.start <= i * bs < part.start + len(part.data)
    for (url, checksum, start, end), part in cache._exact.items():
        assert part in cache.memory.lru
        assert (part.url, part.checksum) == (url, checksum)
        assert (part.start, len(part.data)) == (start, end - start)


def held_or_reserved(cache: BlockCache) -> int:
    """Bytes of cached parts plus requested bytes of parts in flight, counted from scratch."""
    held = sum(len(p.data) for p in [*cache.memory.lru, *cache.memory.ahead])
    parts = [*cache._index.values(), *cache._exact.values()]
    flying = {id(p): 2 * (p.end - p.start) for p in parts if p.pending}
    return held + sum(flying.values())


# -- exact bytes ------------------------------------------------------------------------


def test_reads_return_exact_bytes(tmp_path: Path) -> None:
    url, data = make_file(tmp_path / "a.bin", 3 * MiB + 12345)
    fetcher = RecordingFetcher()
    cache = BlockCache(fetcher, budget=64 * MiB)
    ranges = [
        (0, 1),
        (0, 256 * KiB),
        (100, 300 * KiB),
        (256 * KiB - 1, 256 * KiB + 1),
        (1 * MiB, 2 * MiB + 77),
        (len(data) - 5, len(data)),
        (0, len(data)),
        (5, 5),
    ]

    async def body(cache: BlockCache) -> None:
        for _ in range(2):  # cold, then from the cache
            for start, end in ranges:
                assert await cache.read(url, start, end) == data[start:end]

    with_cache(cache, body)
    stats = cache.stats()
    assert stats["hits"] >= len(ranges) - 1
    assert fetcher.stats.bytes_fetched == len(data)  # every byte once
    assert_accounting(cache)


def test_cached_whole_block_is_returned_without_copy(tmp_path: Path) -> None:
    url, data = make_file(tmp_path / "a.bin", 1 * MiB)
    cache = BlockCache(RecordingFetcher(), budget=8 * MiB)

    async def body(cache: BlockCache) -> None:
        first = await cache.read(url, 256 * KiB, 512 * KiB)
        again = await cache.read(url, 256 * KiB, 512 * KiB)
        assert first == data[256 * KiB : 512 * KiB]
        assert again is first

    with_cache(cache, body)


def test_read_buffer_shares_the_cached_bytes(tmp_path: Path) -> None:
    url, data = make_file(tmp_path / "a.bin", 1 * MiB)
    cache = BlockCache(RecordingFetcher(), budget=8 * MiB)

    async def body(cache: BlockCache) -> None:
        whole = await cache.read(url, 0, 512 * KiB)  # one part of two blocks
        view = await cache.read_buffer(url, 1000, 300 * KiB)
        assert isinstance(view, memoryview)
        assert view.obj is whole  # no copy
        assert bytes(view) == data[1000 : 300 * KiB]
        # Across parts the bytes are joined; read() always gives bytes.
        joined = await cache.read_buffer(url, 500 * KiB, 600 * KiB)
        assert bytes(joined) == data[500 * KiB : 600 * KiB]
        copied = await cache.read(url, 1000, 300 * KiB)
        assert type(copied) is bytes
        assert copied == data[1000 : 300 * KiB]

    with_cache(cache, body)


def test_works_without_run(tmp_path: Path) -> None:
    url, data = make_file(tmp_path / "a.bin", 600 * KiB)
    fetcher = RecordingFetcher()
    fetcher.delay = lambda: 0.01
    cache = BlockCache(fetcher, budget=8 * MiB)

    async def body(cache: BlockCache) -> None:
        results: dict[int, bytes] = {}

        async def reader(n: int) -> None:
            results[n] = await cache.read(url, 1000, 300 * KiB)

        async with trio.open_nursery() as nursery:
            for n in range(5):
                nursery.start_soon(reader, n)
        assert all(r == data[1000 : 300 * KiB] for r in results.values())

    with_cache(cache, body, run=False)
    assert len(fetcher.calls) == 1
    assert_accounting(cache)


# -- single flight and coalescing -------------------------------------------------------


def test_concurrent_readers_of_one_block_fetch_it_once(tmp_path: Path) -> None:
    url, data = make_file(tmp_path / "a.bin", 1 * MiB)
    fetcher = RecordingFetcher()
    fetcher.delay = lambda: 0.05
    cache = BlockCache(fetcher, budget=8 * MiB)
    results: list[bytes] = []

    async def body(cache: BlockCache) -> None:
        async def reader(k: int) -> None:
            start = 300 * KiB + k * 1000
            results.append(await cache.read(url, start, start + 1000) == data[start : start + 1000])

        async with trio.open_nursery() as nursery:
            for k in range(20):
                nursery.start_soon(reader, k)

    with_cache(cache, body)
    assert results == [True] * 20
    assert fetcher.calls == [(url, 256 * KiB, 512 * KiB)]
    stats = cache.stats()
    assert stats["misses"] == 20
    assert stats["joined"] == 19
    assert stats["demand_requests"] == 1


def test_adjacent_missing_blocks_go_out_as_one_request(tmp_path: Path) -> None:
    url, data = make_file(tmp_path / "a.bin", 4 * MiB)
    fetcher = RecordingFetcher()
    cache = BlockCache(fetcher, budget=64 * MiB, block_size=16 * KiB)

    async def body(cache: BlockCache) -> None:
        # Block 2 cached first, so a read of blocks 0..5 needs [0, 2) and [3, 6).
        assert await cache.read(url, 32 * KiB, 40 * KiB) == data[32 * KiB : 40 * KiB]
        fetcher.calls.clear()
        assert await cache.read(url, 10, 96 * KiB - 10) == data[10 : 96 * KiB - 10]

    with_cache(cache, body)
    assert sorted(fetcher.calls) == [(url, 0, 32 * KiB), (url, 48 * KiB, 96 * KiB)]
    assert cache.stats()["readahead_bytes"] == 0


def test_large_read_is_split_into_parallel_parts(tmp_path: Path) -> None:
    url, data = make_file(tmp_path / "a.bin", 1 * MiB)
    fetcher = RecordingFetcher()
    fetcher.delay = lambda: 0.02
    cache = BlockCache(fetcher, budget=8 * MiB, block_size=4 * KiB, max_part=64 * KiB)

    async def body(cache: BlockCache) -> None:
        assert await cache.read(url, 0, 256 * KiB) == data[: 256 * KiB]

    with_cache(cache, body)
    assert sorted(fetcher.calls) == [(url, k * 64 * KiB, (k + 1) * 64 * KiB) for k in range(4)]
    assert fetcher.max_active == 4


# -- read-ahead ---------------------------------------------------------------------------


def small_cache(fetcher: Fetcher, **kw: object) -> BlockCache:
    """A cache scaled down 16 times, so that read-ahead tests run on small files."""
    options: dict[str, object] = dict(
        budget=16 * MiB,
        block_size=16 * KiB,
        max_part=512 * KiB,
        initial_window=64 * KiB,
        max_window=4 * MiB,
    )
    options.update(kw)
    return BlockCache(fetcher, **options)  # type: ignore[arg-type]


def test_sequential_reader_grows_the_window(tmp_path: Path) -> None:
    size = 24 * MiB
    url, data = make_file(tmp_path / "a.bin", size)
    fetcher = RecordingFetcher()
    fetcher.delay = lambda: 0.002
    cache = small_cache(fetcher, extent=lambda u: size)
    windows: list[int] = []

    async def body(cache: BlockCache) -> None:
        for start in range(0, size, 64 * KiB):
            assert await cache.read(url, start, start + 64 * KiB) == data[start : start + 64 * KiB]
            windows.append(cache.streams.of(url)[-1].window)

    with_cache(cache, body)
    stats = cache.stats()
    # The window starts small and doubles up to its maximum.
    assert windows[0] == 0
    grown = sorted(set(windows) - {0})
    assert grown == [64 * KiB << k for k in range(7)]  # 64 KiB ... 4 MiB
    assert windows[-1] == 4 * MiB
    # Nearly everything came from read-ahead, in few requests, and nothing twice.
    assert stats["readahead_bytes"] >= size - 1 * MiB
    # Demand fetches only until the stream has proven sequential.
    assert stats["demand_requests"] == SEQ_MIN_BYTES // (64 * KiB)
    assert len(fetcher.calls) < size // (256 * KiB)
    assert max(end - start for _, start, end in fetcher.calls) == 512 * KiB
    assert fetcher.fetched_bytes() == size
    assert_accounting(cache)


def test_back_to_back_chunks_form_one_stream(tmp_path: Path) -> None:
    """Small chunk files lying back to back, read in key order: URL-keyed read-ahead."""
    chunk = 40 * KiB + 7  # not block aligned
    count = 200
    url, data = make_file(tmp_path / "a.bin", chunk * count + 1000)
    fetcher = RecordingFetcher()
    fetcher.delay = lambda: 0.002
    cache = small_cache(fetcher, extent=lambda u: chunk * count)

    async def body(cache: BlockCache) -> None:
        for k in range(count):
            # Each chunk is read in the kernel's way: two READs.
            half = chunk // 2
            offset = k * chunk
            got = await cache.read(url, offset, offset + half)
            got += await cache.read(url, offset + half, offset + chunk)
            assert got == data[offset : offset + chunk]

    with_cache(cache, body)
    stats = cache.stats()
    assert len(cache.streams.of(url)) == 1
    assert stats["readahead_bytes"] >= chunk * count - 1 * MiB
    # About 13 demand fetches before read-ahead starts, then mostly 512 KiB parts.
    assert stats["demand_requests"] <= SEQ_MIN_BYTES // (chunk // 2) + 1
    assert stats["readahead_requests"] <= chunk * count // (512 * KiB) + 8
    # Never past the extent.
    assert max(end for _, _, end in fetcher.calls) <= chunk * count


def test_interleaved_sequential_readers_each_get_a_stream(tmp_path: Path) -> None:
    size = 16 * MiB
    url, data = make_file(tmp_path / "a.bin", size)
    fetcher = RecordingFetcher()
    cache = small_cache(fetcher, extent=lambda u: size)
    starts = [0, 4 * MiB, 8 * MiB]

    async def body(cache: BlockCache) -> None:
        for step in range(0, 3 * MiB, 32 * KiB):
            for base in starts:
                start = base + step
                assert (
                    await cache.read(url, start, start + 32 * KiB) == data[start : start + 32 * KiB]
                )

    with_cache(cache, body)
    streams = cache.streams.of(url)
    assert len(streams) == 3
    assert all(s.window >= 1 * MiB for s in streams)
    stats = cache.stats()
    assert stats["readahead_bytes"] >= 3 * (3 * MiB - 1 * MiB)
    assert stats["demand_requests"] == 3 * SEQ_MIN_BYTES // (32 * KiB)


def test_forward_jumps_do_not_start_read_ahead(tmp_path: Path) -> None:
    """Reads 2 MiB apart, in increasing order (random readers that happen to move forward):
    never adjacent, so no stream earns read-ahead and only the read blocks are fetched."""
    url, data = make_file(tmp_path / "a.bin", 48 * MiB)
    fetcher = RecordingFetcher()
    cache = BlockCache(fetcher, budget=64 * MiB)
    starts = range(0, 40 * MiB, 2 * MiB)

    async def body(cache: BlockCache) -> None:
        for start in starts:
            end = start + 256 * KiB
            assert await cache.read(url, start, end) == data[start:end]

    with_cache(cache, body)
    assert cache.stats()["readahead_requests"] == 0
    assert fetcher.calls == [(url, start, start + 256 * KiB) for start in starts]


def test_random_reads_fetch_only_their_blocks(tmp_path: Path) -> None:
    size = 64 * MiB
    url, data = make_file(tmp_path / "a.bin", size)
    fetcher = RecordingFetcher()
    cache = BlockCache(fetcher, budget=64 * MiB)
    rng = random.Random(7)
    # Each read more than 1 MiB behind every earlier one: never within a stream's reach.
    offsets = []
    offset = size - 300 * KiB
    while offset > 0:
        offsets.append(offset)
        offset -= rng.randrange(1300 * KiB, 2 * MiB)

    async def body(cache: BlockCache) -> None:
        for offset in offsets:
            length = rng.randrange(1, 200 * KiB)
            assert await cache.read(url, offset, offset + length) == data[offset : offset + length]

    with_cache(cache, body)
    stats = cache.stats()
    assert stats["readahead_bytes"] == 0
    assert len(fetcher.calls) <= len(offsets)
    # Each read costs at most its blocks: two 256 KiB blocks for a read under 256 KiB.
    assert all(end - start <= 512 * KiB for _, start, end in fetcher.calls)
    assert all(start % (256 * KiB) == 0 for _, start, _ in fetcher.calls)


def test_chunk_in_two_reads_does_not_start_read_ahead(tmp_path: Path) -> None:
    url, data = make_file(tmp_path / "a.bin", 8 * MiB)
    fetcher = RecordingFetcher()
    cache = BlockCache(fetcher, budget=64 * MiB)

    async def body(cache: BlockCache) -> None:
        for offset in (5 * MiB + 100, 1 * MiB + 3):
            for part in range(2):
                start = offset + part * 128 * KiB
                got = await cache.read(url, start, start + 128 * KiB)
                assert got == data[start : start + 128 * KiB]

    with_cache(cache, body)
    assert cache.stats()["readahead_bytes"] == 0


def test_unread_read_ahead_is_not_evicted_by_read_ahead(tmp_path: Path) -> None:
    size = 8 * MiB
    url, data = make_file(tmp_path / "a.bin", size)
    fetcher = RecordingFetcher()
    # Half of 2 MiB for read-ahead; windows of up to 4 MiB must be trimmed to fit.
    cache = small_cache(fetcher, budget=2 * MiB, extent=lambda u: size)
    peak_ahead = 0

    async def body(cache: BlockCache) -> None:
        nonlocal peak_ahead
        for start in range(0, size, 32 * KiB):
            assert await cache.read(url, start, start + 32 * KiB) == data[start : start + 32 * KiB]
            peak_ahead = max(peak_ahead, cache.memory.ahead_cached + cache.memory.ahead_inflight)

    with_cache(cache, body)
    stats = cache.stats()
    assert peak_ahead <= 1 * MiB
    assert stats["peak_bytes"] <= 2 * MiB
    assert stats["readahead_unused"] == 0  # nothing prefetched was thrown away unread
    assert fetcher.fetched_bytes() == size


def test_drop_behind_recycles_memory_of_long_streams(tmp_path: Path) -> None:
    size = 40 * MiB
    url, data = make_file(tmp_path / "a.bin", size)
    small_url, small = make_file(tmp_path / "b.bin", 3 * MiB, seed=1)
    fetcher = RecordingFetcher()
    cache = small_cache(fetcher)  # 16 MiB budget, windows up to 4 MiB
    cached_after_small = 0

    async def read_all(url: str, data: bytes) -> None:
        for start in range(0, len(data), 64 * KiB):
            got = await cache.read(url, start, start + 64 * KiB)
            assert got == data[start : start + 64 * KiB]

    async def body(cache: BlockCache) -> None:
        nonlocal cached_after_small
        # A short stream stays cached: a second pass is served without a request.
        await read_all(small_url, small)
        await trio.sleep(0.01)
        cached_after_small = cache.stats()["bytes_cached"]
        fetcher.calls.clear()
        await read_all(small_url, small)
        assert fetcher.calls == []
        # A long stream lets go of what it has read once the cache is half full.
        await read_all(url, data)

    with_cache(cache, body)
    stats = cache.stats()
    assert cached_after_small == 3 * MiB
    assert stats["bytes_cached"] <= 8 * MiB + 4 * MiB
    assert stats["readahead_unused"] == 0
    assert fetcher.stats.bytes_fetched == size + 3 * MiB
    assert_accounting(cache)


# -- memory budget ----------------------------------------------------------------------


def test_budget_never_exceeded_with_many_readers(tmp_path: Path) -> None:
    files = [make_file(tmp_path / f"f{n}.bin", 2 * MiB + n * 999, seed=n) for n in range(3)]
    fetcher = RecordingFetcher()
    rng = random.Random(3)
    fetcher.delay = lambda: rng.random() * 0.003
    budget = 160 * KiB
    cache = small_cache(fetcher, budget=budget)
    peak = 0
    done = False

    async def monitor() -> None:
        nonlocal peak
        while not done:
            peak = max(peak, held_or_reserved(cache))
            await trio.sleep(0)

    async def reader(n: int) -> None:
        url, data = files[n % 3]
        r = random.Random(n)
        pos = r.randrange(len(data))
        for _ in range(60):
            if r.random() < 0.3:
                pos = r.randrange(len(data))
            length = r.randrange(1, 100 * KiB)
            end = min(pos + length, len(data))
            assert await cache.read(url, pos, end) == data[pos:end]
            pos = end % len(data)

    async def body(cache: BlockCache) -> None:
        nonlocal done
        async with trio.open_nursery() as nursery:
            nursery.start_soon(monitor)
            async with trio.open_nursery() as readers:
                for n in range(12):
                    readers.start_soon(reader, n)
            done = True

    with_cache(cache, body)
    stats = cache.stats()
    # Whether reads were served from the cache or uncached depends on how the delayed
    # fetches interleave: only the bound is asserted.
    assert 0 < peak <= budget
    assert stats["peak_bytes"] <= budget
    assert_accounting(cache)


def test_read_larger_than_budget_is_served_uncached(tmp_path: Path) -> None:
    url, data = make_file(tmp_path / "a.bin", 2 * MiB)
    fetcher = RecordingFetcher()
    cache = BlockCache(fetcher, budget=600 * KiB)  # a block in flight counts twice

    async def body(cache: BlockCache) -> None:
        assert await cache.read(url, 1000, 1 * MiB + 5) == data[1000 : 1 * MiB + 5]
        # A read that fits still goes through the cache.
        assert await cache.read(url, 10, 20) == data[10:20]
        assert await cache.read(url, 30, 40) == data[30:40]

    with_cache(cache, body)
    stats = cache.stats()
    assert stats["uncached_reads"] == 1
    assert (url, 1000, 1 * MiB + 5) in fetcher.calls
    assert stats["hits"] == 1
    assert stats["peak_bytes"] <= 600 * KiB
    assert_accounting(cache)


# -- whole references -------------------------------------------------------------------


def test_random_read_of_a_small_reference_fetches_exactly_it(tmp_path: Path) -> None:
    """A 4 KiB chunk straddling a block boundary: one request of its 4 KiB, not two blocks;
    the file's further READs, and a second key over the same bytes, fetch nothing."""
    url, data = make_file(tmp_path / "a.bin", 4 * MiB)
    fetcher = RecordingFetcher()
    cache = BlockCache(fetcher, budget=64 * MiB)
    ref = (256 * KiB - 1000, 256 * KiB + 3096)

    async def body(cache: BlockCache) -> None:
        first = await cache.read_buffer(url, ref[0], ref[0] + 2048, ref)
        assert bytes(first) == data[ref[0] : ref[0] + 2048]
        rest = await cache.read_buffer(url, ref[0] + 2048, ref[1], ref)
        assert bytes(rest) == data[ref[0] + 2048 : ref[1]]
        assert await cache.read_buffer(url, *ref, ref) == data[ref[0] : ref[1]]

    with_cache(cache, body)
    assert fetcher.calls == [(url, *ref)]
    stats = cache.stats()
    assert (stats["hits"], stats["misses"]) == (2, 1)
    assert stats["bytes_cached"] == 4096
    assert stats["whole_references"] == 1
    assert_accounting(cache)


def test_many_random_chunk_reads_hold_only_the_chunks(tmp_path: Path) -> None:
    chunk, count = 4 * KiB, 300
    url, data = make_file(tmp_path / "a.bin", 64 * MiB)
    fetcher = RecordingFetcher()
    cache = BlockCache(fetcher, budget=64 * MiB)
    rng = random.Random(3)
    # Distinct and never adjacent: a read that starts where another ended begins a stream.
    starts = [slot * chunk for slot in rng.sample(range(0, len(data) // chunk, 2), count)]

    async def body(cache: BlockCache) -> None:
        for start in starts:
            ref = (start, start + chunk)
            assert await cache.read_buffer(url, *ref, ref) == data[start : start + chunk]

    with_cache(cache, body)
    stats = cache.stats()
    assert sorted(fetcher.calls) == sorted((url, start, start + chunk) for start in starts)
    assert stats["bytes_cached"] == count * chunk
    assert stats["readahead_requests"] == 0
    assert_accounting(cache)


def test_concurrent_readers_of_one_reference_share_one_fetch(tmp_path: Path) -> None:
    url, data = make_file(tmp_path / "a.bin", 2 * MiB)
    fetcher = RecordingFetcher()
    fetcher.gate = trio.Event()
    cache = BlockCache(fetcher, budget=64 * MiB)
    ref = (100_000, 400_000)
    got: list[bytes] = []

    async def reader(start: int, end: int) -> None:
        got.append(bytes(await cache.read_buffer(url, start, end, ref)))

    async def body(cache: BlockCache) -> None:
        async with trio.open_nursery() as nursery:
            for k in range(8):
                nursery.start_soon(reader, ref[0] + k * 1000, ref[1] - k * 1000)
            await trio.sleep(0.05)
            assert cache.stats()["inflight_parts"] == 1
            fetcher.gate.set()

    with_cache(cache, body)
    assert fetcher.calls == [(url, *ref)]
    assert sorted(got, key=len) == sorted(
        (data[ref[0] + k * 1000 : ref[1] - k * 1000] for k in range(8)), key=len
    )
    assert cache.stats()["joined"] == 7
    assert_accounting(cache)


def test_reference_past_the_end_of_the_remote_is_an_error_and_not_kept(tmp_path: Path) -> None:
    url, _ = make_file(tmp_path / "a.bin", 100 * KiB)
    fetcher = RecordingFetcher()
    cache = BlockCache(fetcher, budget=64 * MiB)
    ref = (90 * KiB, 110 * KiB)  # the refs claim 10 KiB more than the store has

    async def body(cache: BlockCache) -> None:
        for _ in range(2):
            with pytest.raises(FetchError) as info:
                await cache.read_buffer(url, ref[0], ref[0] + 100, ref)
            assert info.value.errno == errno.EIO

    with_cache(cache, body)
    assert fetcher.calls == [(url, *ref)] * 2  # a failure is not cached: asked again
    assert cache.stats()["whole_references"] == 0
    assert_accounting(cache)


def test_chunks_read_in_order_still_stream(tmp_path: Path) -> None:
    """Only the first chunk of a sequential run is fetched whole; the rest continue its
    stream and come from read-ahead."""
    chunk, count = 40 * KiB + 7, 200
    url, data = make_file(tmp_path / "a.bin", chunk * count)
    fetcher = RecordingFetcher()
    cache = small_cache(fetcher, extent=lambda u: chunk * count)

    async def body(cache: BlockCache) -> None:
        for k in range(count):
            ref = (k * chunk, (k + 1) * chunk)
            assert await cache.read_buffer(url, *ref, ref) == data[ref[0] : ref[1]]

    with_cache(cache, body)
    stats = cache.stats()
    assert stats["whole_references"] == 1
    assert stats["readahead_bytes"] >= chunk * count - 1 * MiB
    assert fetcher.fetched_bytes() <= chunk * count + chunk


def test_large_reference_reads_through_blocks(tmp_path: Path) -> None:
    url, data = make_file(tmp_path / "a.bin", 20 * MiB)
    fetcher = RecordingFetcher()
    cache = BlockCache(fetcher, budget=64 * MiB)
    ref = (1000, 1000 + 9 * MiB)  # more than one part: not fetched whole

    async def body(cache: BlockCache) -> None:
        got = await cache.read_buffer(url, ref[0], ref[0] + 128 * KiB, ref)
        assert got == data[ref[0] : ref[0] + 128 * KiB]

    with_cache(cache, body)
    assert fetcher.calls == [(url, 0, 256 * KiB)]
    assert cache.stats()["whole_references"] == 0


# -- short files, failures, extent ------------------------------------------------------


def test_short_last_block_is_served_and_bytes_past_the_end_are_an_error(tmp_path: Path) -> None:
    size = 2 * 256 * KiB + 100
    url, data = make_file(tmp_path / "a.bin", size)
    fetcher = RecordingFetcher()
    cache = BlockCache(fetcher, budget=8 * MiB)

    async def body(cache: BlockCache) -> None:
        assert await cache.read(url, size - 150, size) == data[size - 150 :]
        # The short last block is cached, and serves reads within it.
        assert await cache.read(url, size - 20, size - 10) == data[size - 20 : size - 10]
        for start, end in [(size - 10, size + 1), (size + 5, size + 10), (0, size + 1)]:
            with pytest.raises(FetchError) as info:
                await cache.read(url, start, end)
            assert info.value.errno == errno.EIO
        assert await cache.read(url, 0, size) == data

    with_cache(cache, body)
    stats = cache.stats()
    assert stats["hits"] >= 1
    assert_accounting(cache)


def test_remote_shorter_than_extent_is_never_padded(tmp_path: Path) -> None:
    size = 3 * MiB
    url, data = make_file(tmp_path / "a.bin", size)
    fetcher = RecordingFetcher()
    cache = small_cache(fetcher, extent=lambda u: 5 * MiB)  # the refs claim more

    async def body(cache: BlockCache) -> None:
        for start in range(0, size, 64 * KiB):
            assert await cache.read(url, start, start + 64 * KiB) == data[start : start + 64 * KiB]
        with pytest.raises(FetchError):
            await cache.read(url, size - 10, size + 64 * KiB)
        with pytest.raises(FetchError):
            await cache.read(url, size + 1, size + 2)

    with_cache(cache, body)
    # Read-ahead learnt the real end of the file and stopped there: at most one window
    # of requests was already out past it.
    past = [start for _, start, _ in fetcher.calls if start >= size]
    assert len(past) <= 4 * MiB // (512 * KiB)
    assert all(start < size + 4 * MiB for start in past)


def test_failure_reaches_every_waiter_and_a_later_read_retries(tmp_path: Path) -> None:
    url, data = make_file(tmp_path / "a.bin", 1 * MiB)
    fetcher = RecordingFetcher()
    fetcher.delay = lambda: 0.03
    failing = True
    fetcher.fail = lambda u, s, e: failing
    cache = BlockCache(fetcher, budget=8 * MiB)
    outcomes: list[object] = []

    async def body(cache: BlockCache) -> None:
        nonlocal failing

        async def reader(k: int) -> None:
            try:
                await cache.read(url, k * 100, k * 100 + 50)
            except FetchError as exc:
                outcomes.append(exc.errno)
            else:
                outcomes.append("ok")

        async with trio.open_nursery() as nursery:
            for k in range(10):
                nursery.start_soon(reader, k)
        assert cache.stats()["bytes_cached"] == 0
        failing = False
        assert await cache.read(url, 0, 1000) == data[:1000]

    with_cache(cache, body)
    assert outcomes == [errno.EIO] * 10
    assert len(fetcher.calls) == 2
    stats = cache.stats()
    assert stats["fetch_errors"] == 1
    assert stats["bytes_cached"] == 256 * KiB
    assert_accounting(cache)


def test_extent_is_never_fetched_past(tmp_path: Path) -> None:
    url, data = make_file(tmp_path / "a.bin", 4 * MiB)
    extent = 1 * MiB + 100 * KiB + 3
    fetcher = RecordingFetcher()
    cache = BlockCache(fetcher, budget=64 * MiB, extent=lambda u: extent)

    async def body(cache: BlockCache) -> None:
        for start in range(0, extent, 100 * KiB):
            end = min(start + 100 * KiB, extent)
            assert await cache.read(url, start, end) == data[start:end]
        # A read beyond a (stale) extent is still served exactly.
        assert (
            await cache.read(url, extent - 10, extent + 1000) == data[extent - 10 : extent + 1000]
        )

    with_cache(cache, body)
    # Only the read beyond the extent fetched past it, and only as far as it needed.
    beyond = [call for call in fetcher.calls if call[2] > extent]
    assert beyond == [(url, 1 * MiB, extent + 1000)]
    assert cache.stats()["readahead_bytes"] > 0


def test_cancelling_run_stops_fetches_and_fails_waiters(tmp_path: Path) -> None:
    url, _ = make_file(tmp_path / "a.bin", 1 * MiB)
    fetcher = RecordingFetcher()
    fetcher.gate = trio.Event()  # never set: fetches hang until cancelled
    cache = BlockCache(fetcher, budget=8 * MiB)
    errors: list[str] = []

    async def main() -> None:
        with trio.fail_after(5):
            await scenario()

    async def scenario() -> None:
        async def reader() -> None:
            try:
                await cache.read(url, 0, 10)
            except FetchError as exc:
                errors.append(str(exc))

        async with trio.open_nursery() as outer:
            async with trio.open_nursery() as cache_nursery:
                await cache_nursery.start(cache.run)
                outer.start_soon(reader)
                await trio.sleep(0.05)
                assert fetcher.active == 1
                cache_nursery.cancel_scope.cancel()
            assert fetcher.active == 0

    trio.run(main)
    assert len(errors) == 1
    assert "cancelled" in errors[0]
    assert_accounting(cache)


# -- everything at once -----------------------------------------------------------------


def test_stress_many_readers_every_byte_checked(tmp_path: Path) -> None:
    sizes = [3 * MiB + 17, 1 * MiB, 200 * KiB + 1, 777]
    files = [make_file(tmp_path / f"s{n}.bin", size, seed=10 + n) for n, size in enumerate(sizes)]
    extents = {url: len(data) for url, data in files}
    fetcher = RecordingFetcher()
    rng = random.Random(99)
    fetcher.delay = lambda: rng.choice((0.0, 0.0, 0.0005, 0.002))
    cache = BlockCache(
        fetcher,
        budget=600 * KiB,
        extent=extents.get,
        block_size=8 * KiB,
        max_part=64 * KiB,
        initial_window=32 * KiB,
        max_window=256 * KiB,
        ahead_ttl=0.05,
    )
    checked = 0
    peak = 0

    async def reader(n: int) -> None:
        nonlocal checked, peak
        r = random.Random(n)
        url, data = files[r.randrange(len(files))]
        pos = 0
        for _ in range(200):
            if r.random() < 0.1:
                url, data = files[r.randrange(len(files))]
            if r.random() < 0.4:
                pos = r.randrange(len(data))
            end = min(len(data), pos + r.choice((1, 100, 4 * KiB, 8 * KiB, 20 * KiB, 100 * KiB)))
            if r.random() < 0.5:
                assert await cache.read(url, pos, end) == data[pos:end]
            else:
                assert bytes(await cache.read_buffer(url, pos, end)) == data[pos:end]
            checked += 1
            peak = max(peak, held_or_reserved(cache))
            pos = end if end < len(data) else 0

    async def body(cache: BlockCache) -> None:
        async with trio.open_nursery() as nursery:
            for n in range(32):
                nursery.start_soon(reader, n)
        await trio.sleep(0.01)  # let the last read-ahead land

    with_cache(cache, body)
    # Every byte was checked above.  Hits, read-ahead and evictions depend on how the
    # randomly delayed fetches interleave (and on ahead_ttl against the clock), so only
    # what holds in every interleaving is asserted: the budget, and nothing fetched past
    # a file's end.
    assert checked == 32 * 200
    stats = cache.stats()
    assert 0 < peak <= 600 * KiB
    assert stats["peak_bytes"] <= 600 * KiB
    for url, start, end in fetcher.calls:
        assert end <= extents[url]
        assert start < end
    assert_accounting(cache)


def test_stats_has_the_documented_counters(tmp_path: Path) -> None:
    stats = BlockCache(Fetcher()).stats()
    for name in ("hits", "misses", "bytes_cached", "evictions", "readahead_bytes", "budget"):
        assert name in stats
    assert stats["budget"] == 512 << 20
    assert stats["block_size"] == 256 * KiB

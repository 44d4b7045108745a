"""The disk cache's parts without a mount: the entry format, the eviction plan, the
shared index (property-based and stateful), the directory's locks and temporary files,
validators, and the tier in front of a real fetcher of local files."""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from refmount.cache import BlockCache
from refmount.cache.disk import DiskCache, DiskCacheConfig, DiskCacheError, DiskTier
from refmount.cache.disk.cache import QUEUE_BYTES
from refmount.cache.disk.entry import (
    CorruptEntry,
    Entry,
    EntryKey,
    decode,
    encode,
    encoded_length,
)
from refmount.cache.disk.index import RESERVE_SECONDS, Index, Limits, plan_eviction
from refmount.cache.disk.store import Store
from refmount.fetch import Fetcher
from refmount.fetch.backend import version_of
from refmount.fetch.fsspec_backend import version_of_info
from refmount.options import parse_args
from refmount.service.serve import disk_queue_bytes
from tests.support.servers import RangeServer

KEY = EntryKey("https://example.org/a.nc", 'etag:"x"|size:9', 1 << 18, 1 << 18)


def blob(key: EntryKey, entry: Entry) -> bytes:
    return b"".join(bytes(p) for p in encode(key, entry))


# -- entries --------------------------------------------------------------------------------


@settings(deadline=None)  # a property, not a timing: a busy machine may take its time
@given(
    pieces=st.lists(
        st.tuples(st.integers(0, (1 << 18) - 1), st.integers(1, 5000)), min_size=1, max_size=8
    )
)
def test_merged_spans_hold_exactly_the_bytes_added(pieces: list[tuple[int, int]]) -> None:
    truth = bytes(random.Random(1).randbytes(1 << 18))
    entry = Entry()
    covered = set()
    for rel, size in pieces:
        stop = min(rel + size, 1 << 18)
        merged = entry.merged(KEY.offset + rel, truth[rel:stop], None)
        new = set(range(rel, stop)) - covered
        assert (merged is None) == (not new)
        entry = merged or entry
        covered |= set(range(rel, stop))
    assert encoded_length(KEY, entry) == len(blob(KEY, entry))
    back = decode(KEY, blob(KEY, entry))
    assert back.spans == entry.spans
    for lo, hi in back.spans:
        assert set(range(lo - KEY.offset, hi - KEY.offset)) <= covered
        assert bytes(back.get(lo, hi)) == truth[lo - KEY.offset : hi - KEY.offset]
    assert sum(hi - lo for lo, hi in back.spans) == len(covered)


def test_an_entry_serves_what_it_holds_and_no_more() -> None:
    entry = Entry().merged(KEY.offset + 10, b"abcdef", None)
    assert entry is not None
    assert bytes(entry.get(KEY.offset + 11, KEY.offset + 14)) == b"bcd"
    assert entry.get(KEY.offset + 9, KEY.offset + 12) is None
    assert entry.get(KEY.offset + 12, KEY.offset + 17) is None  # past the span
    ended = entry.merged(KEY.offset + 16, b"", KEY.offset + 16)
    assert ended is not None
    assert bytes(ended.get(KEY.offset + 12, KEY.offset + 100)) == b"cdef"  # the object ends
    assert bytes(ended.get(KEY.offset + 20, KEY.offset + 30)) == b""


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda b: b[:-1], "bytes of data"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "data checksum"),
        (lambda b: b[:70], "truncated header"),
        (lambda b: b"", "shorter than a header"),
        (lambda b: bytes(len(b)), "bad magic"),
        (lambda b: b[:30] + bytes([b[30] ^ 1]) + b[31:], "header checksum"),
        (lambda b: b + b"x", "bytes of data"),
    ],
)
def test_every_damage_is_caught(damage: object, why: str) -> None:
    good = blob(KEY, Entry([(KEY.offset, KEY.offset + 100)], bytes(range(100))))
    assert bytes(decode(KEY, good).data) == bytes(range(100))
    with pytest.raises(CorruptEntry, match=why):
        decode(KEY, damage(good))  # type: ignore[operator]


def test_an_entry_found_under_another_key_is_corrupt() -> None:
    good = blob(KEY, Entry([(KEY.offset, KEY.offset + 3)], b"abc"))
    other = EntryKey(KEY.url, 'etag:"y"|size:9', KEY.offset, KEY.length)
    with pytest.raises(CorruptEntry, match="another entry"):
        decode(other, good)
    assert other.name != KEY.name


# -- eviction plan and index ----------------------------------------------------------------

LIMITS = Limits(max_bytes=1000, min_free=100, slack=50)


@settings(deadline=None)
@given(
    sizes=st.lists(st.integers(1, 400), max_size=20),
    incoming=st.integers(1, 1200),
    free=st.integers(0, 2000),
)
def test_the_plan_makes_room_least_recent_first_or_refuses(
    sizes: list[int], incoming: int, free: int
) -> None:
    candidates = [(f"e{i}", s) for i, s in enumerate(sizes)]
    total = sum(sizes)
    victims = plan_eviction(candidates, total=total, incoming=incoming, free=free, limits=LIMITS)
    need = max(total + incoming - LIMITS.max_bytes, LIMITS.min_free - free)
    if victims is None:
        assert incoming > LIMITS.max_bytes or total < need
        return
    assert victims == candidates[: len(victims)]  # least recently used first
    freed = sum(s for _, s in victims)
    assert total + incoming - freed <= LIMITS.max_bytes
    assert free + freed >= LIMITS.min_free
    if need <= 0:
        assert victims == []
    else:  # hysteresis: no more than one entry past need + slack
        assert freed - victims[-1][1] < need + LIMITS.slack


_MACHINES = itertools.count()


class IndexMachine(RuleBasedStateMachine):
    """The index against a model: the total is the sum of the entries' sizes, the
    entries stay within the limit, eviction takes the least recently used."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(os.environ["DISK_CACHE_TEST_DIR"]) / f"i{next(_MACHINES)}"
        self.dir.mkdir()
        self.index = Index(str(self.dir / "index.sqlite"))
        self.model: dict[str, tuple[int, float]] = {}
        self.clock = 0.0
        self.removed: list[str] = []

    def teardown(self) -> None:
        self.index.close()

    @rule(name=st.sampled_from([f"{i:02x}/e{i}" for i in range(12)]), size=st.integers(1, 400))
    def admit(self, name: str, size: int) -> None:
        self.clock += 1
        placed = []
        self.removed = []
        limits = Limits(max_bytes=1000, min_free=0, slack=100)
        admitted, victims = self.index.admit(
            [(name, size, lambda: placed.append(name))],
            self.clock,
            limits,
            self.removed.append,
        )
        if not admitted:
            assert size > 1000 and not placed and not victims
            return
        assert placed == [name]
        assert victims == self.removed
        others = sorted((u, n) for n, (_, u) in self.model.items() if n != name)
        assert [n for _, n in others[: len(victims)]] == victims  # least recent first
        for victim in victims:
            del self.model[victim]
        self.model[name] = (size, self.clock)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def touch(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.model)))
        self.clock += 1
        self.index.touch([(self.clock, name)])
        self.model[name] = (self.model[name][0], self.clock)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def forget(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.model)))
        self.index.forget([name])
        del self.model[name]

    @invariant()
    def totals_agree(self) -> None:
        assert self.index.total() == sum(s for s, _ in self.model.values())
        assert self.index.count() == len(self.model)
        assert self.index.total() <= 1000


@pytest.fixture
def index_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DISK_CACHE_TEST_DIR", str(tmp_path))
    return tmp_path


def test_index_state_machine(index_dir: Path) -> None:
    run = IndexMachine.TestCase
    run.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
    run().runTest()


def test_reconcile_finds_files_without_rows_and_drops_rows_without_files(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "c"))
    index = Index(store.index_path)
    try:
        kept = EntryKey("u", "v", 0, 100)
        temp, size = store.write_temp(kept, Entry([(0, 3)], b"abc"))
        store.place(temp, kept.name)  # as if its process died before committing
        index.admit([("zz/gone", 7, lambda: None)], 1.0, Limits(10**9, 0, 0), print)
        prefix = kept.name[:2]
        assert index.reconcile(prefix, lambda: store.scan(prefix)) == (1, 0)
        assert index.reconcile("zz", lambda: store.scan("zz")) == (0, 1)
        assert index.total() == size
    finally:
        index.close()
        store.close()


def test_an_unreadable_index_is_replaced_and_rebuilt_from_the_files(tmp_path: Path) -> None:
    root = tmp_path / "c"
    store = Store(str(root))
    key = EntryKey("u", "v", 0, 100)
    temp, size = store.write_temp(key, Entry([(0, 3)], b"abc"))
    store.place(temp, key.name)
    store.close()
    (root / "index.sqlite").write_bytes(b"not a database" * 100)

    async def open_and_tidy() -> int:
        disk = DiskCache(DiskCacheConfig(str(root)))
        assert disk.index.created
        async with trio.open_nursery() as nursery:
            await nursery.start(disk.run)
            await disk._tidy()
            total = disk.index.total()
            nursery.cancel_scope.cancel()
        return total

    assert trio.run(open_and_tidy) == size


# -- reservations: the free-space floor held across processes --------------------------------

RESERVER = """
import sys, time
from refmount.cache.disk.index import Index, Limits
from refmount.cache.disk.store import Store
store = Store(sys.argv[1])
index = Index(store.index_path)
got = index.reserve(store.owner, [int(sys.argv[2])], time.time(), Limits(1 << 40, 0, 0), store)
print(got.granted, flush=True)
time.sleep(60)
"""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: its free space is what the floor is measured against."""
    if os.geteuid() != 0:
        pytest.skip("needs root (tmpfs)")
    path = tmp_path / "small"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_a_reservation_holds_the_floor_for_every_process_until_admitted(small_disk: Path) -> None:
    floor = Limits(max_bytes=1 << 40, min_free=512 << 10, slack=0)
    a, b = Store(str(small_disk)), Store(str(small_disk))
    index_a, index_b = Index(a.index_path), Index(b.index_path)
    key = EntryKey("https://example.org/r", "v", 0, 300 << 10)
    entry = Entry([(0, 300 << 10)], bytes(300 << 10))
    try:
        size = a.space().on_disk(encoded_length(key, entry))
        held = index_a.reserve(a.owner, [size, size], time.time(), floor, a)
        assert held.granted == 1 and held.id is not None  # the second would cross the floor
        # Another process sees the room taken, before and after the bytes are written.
        assert index_b.reserve(b.owner, [size], time.time(), floor, b).granted == 0
        temp, on_disk = a.write_temp(key, entry)
        assert on_disk == size  # what was reserved is what the file takes
        refused = index_b.reserve(b.owner, [size], time.time(), floor, b)
        assert (refused.granted, refused.others) == (0, size)
        admitted, _ = index_a.admit(
            [(key.name, on_disk, lambda: a.place(temp, key.name))],
            time.time(),
            floor,
            a.remove,
            held.id,
        )
        assert admitted == [key.name]
        # Admitted, the entry can go to make room: evicted before anything is written.
        again = index_b.reserve(b.owner, [size], time.time(), floor, b)
        assert (again.granted, again.evicted) == (1, [key.name])
        assert not os.path.exists(a.path(key.name))
        assert a.space().free - size >= floor.min_free
    finally:
        for index in (index_a, index_b):
            index.close()
        for store in (a, b):
            store.close()


def test_a_dead_process_reservation_is_let_go(small_disk: Path) -> None:
    floor = Limits(max_bytes=1 << 40, min_free=512 << 10, slack=0)
    holder = subprocess.Popen(
        [sys.executable, "-c", RESERVER, str(small_disk), str(400 << 10)],
        stdout=subprocess.PIPE,
        text=True,
    )
    store = Store(str(small_disk))
    index = Index(store.index_path)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "1"
        assert index.reserve(store.owner, [200 << 10], time.time(), floor, store).granted == 0
        holder.kill()
        holder.wait()
        assert index.reserve(store.owner, [200 << 10], time.time(), floor, store).granted == 1
    finally:
        holder.kill()
        holder.wait()
        index.close()
        store.close()


def test_an_expired_reservation_is_let_go(small_disk: Path) -> None:
    floor = Limits(max_bytes=1 << 40, min_free=512 << 10, slack=0)
    a, b = Store(str(small_disk)), Store(str(small_disk))
    index_a, index_b = Index(a.index_path), Index(b.index_path)
    try:
        assert index_a.reserve(a.owner, [400 << 10], time.time(), floor, a).granted == 1
        assert index_b.reserve(b.owner, [200 << 10], time.time(), floor, b).granted == 0
        later = time.time() + RESERVE_SECONDS + 1  # a live owner that never admitted
        assert index_b.reserve(b.owner, [200 << 10], later, floor, b).granted == 1
    finally:
        for index in (index_a, index_b):
            index.close()
        for store in (a, b):
            store.close()


# -- the directory --------------------------------------------------------------------------

HOLDER = """
import sys, time
from refmount.cache.disk.store import Store
from refmount.cache.disk.entry import Entry, EntryKey
store = Store(sys.argv[1])
store.write_temp(EntryKey("u", "v", 0, 10), Entry([(0, 1)], b"x"))
print(store.owner, flush=True)
time.sleep(60)
"""


def test_temporary_files_of_a_dead_process_go_and_a_live_ones_stay(tmp_path: Path) -> None:
    root = tmp_path / "c"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(root)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    try:
        owners = [p.stdout.readline().strip() for p in procs]  # type: ignore[union-attr]
        assert len(os.listdir(root / "tmp")) == 2
        procs[0].kill()
        procs[0].wait()
        store = Store(str(root))
        assert store.sweep() == 1
        left = os.listdir(root / "tmp")
        assert [n.partition(".")[0] for n in left] == [owners[1]]
        assert sorted(os.listdir(root / "locks")) == sorted([owners[1], store.owner])
        store.close()
        assert os.listdir(root / "locks") == [owners[1]]
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown)")
def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "theirs"
    root.mkdir()
    os.chown(root, 65534, 65534)
    with pytest.raises(DiskCacheError, match="belongs to uid 65534"):
        Store(str(root))


def test_validators() -> None:
    assert version_of(etag='"a"', size=3) == 'etag:"a"|size:3'
    assert version_of(etag='W/"a"', size=3) is None  # weak, and no date
    assert version_of(etag='W/"a"', size=3, modified="d") == 'modified:d|size:3|etag:W/"a"'
    assert version_of(generation=7, etag='"a"', size=3) == "generation:7|size:3"
    assert version_of(size=3) is None
    assert version_of_info({"size": 3, "LastModified": "x"}) == "modified:x|size:3"
    assert version_of_info({"size": 3, "ETag": '"e"'}) == 'etag:"e"|size:3'


# -- reading a part into one buffer -------------------------------------------------------

UNIT = 1 << 18


def _placed(store: Store, key: EntryKey, entry: Entry) -> Path:
    temp, _ = store.write_temp(key, entry)
    store.place(temp, key.name)
    return Path(store.path(key.name))


@pytest.mark.parametrize(
    ("where", "why"),
    [(-1, "data checksum"), (UNIT // 2, "data checksum"), (8, "header checksum")],
)
def test_a_whole_unit_read_in_place_is_checked(tmp_path: Path, where: int, why: str) -> None:
    store = Store(str(tmp_path / "cache"))
    data = random.Random(6).randbytes(UNIT)
    key = EntryKey("https://example.org/b.nc", 'etag:"b"', UNIT, UNIT)
    path = _placed(store, key, Entry([(key.offset, key.end)], data))
    out = bytearray(UNIT)
    fd = store.open(key)
    assert fd is not None
    try:
        assert store.read_whole(key, fd, memoryview(out)) is True
    finally:
        os.close(fd)
    assert out == data
    damaged = bytearray(path.read_bytes())
    damaged[where] ^= 0x40
    path.write_bytes(damaged)
    fd = store.open(key)
    assert fd is not None
    try:
        with pytest.raises(CorruptEntry, match=why):
            store.read_whole(key, fd, memoryview(bytearray(UNIT)))
    finally:
        os.close(fd)
    assert not path.exists()  # removed
    store.close()


def test_a_part_is_read_from_whole_partial_and_missing_units(tmp_path: Path) -> None:
    """Units 0 (whole), 1 (missing), 2 (half of it), 3 (the object ends inside it)."""
    truth = random.Random(7).randbytes(4 * UNIT - 1000)
    url, validator = "https://example.org/c.nc", 'etag:"c"'
    keys = [EntryKey(url, validator, i * UNIT, UNIT) for i in range(4)]

    async def main() -> None:
        disk = DiskCache(DiskCacheConfig(str(tmp_path / "cache")))
        store = disk.store
        _placed(store, keys[0], Entry([(0, UNIT)], truth[:UNIT]))
        _placed(
            store, keys[2], Entry([(2 * UNIT, 2 * UNIT + 100)], truth[2 * UNIT : 2 * UNIT + 100])
        )
        end_at = len(truth)
        _placed(store, keys[3], Entry([(3 * UNIT, end_at)], truth[3 * UNIT :], end_at))
        start, end = 100, 4 * UNIT
        wants = [(max(start, k.offset), min(end, k.end)) for k in keys]
        buffer, got = await disk.read_part(keys, wants, start, end)
        assert buffer is not None and len(buffer) == end - start
        assert got == [UNIT - 100, None, None, len(truth) - 3 * UNIT]
        assert buffer[: UNIT - 100] == truth[100:UNIT]
        assert buffer[3 * UNIT - start : len(truth) - start] == truth[3 * UNIT :]
        # A part inside unit 2's span, and one of units nobody holds.
        buffer, got = await disk.read_part(
            [keys[2]], [(2 * UNIT + 10, 2 * UNIT + 90)], 2 * UNIT + 10, 2 * UNIT + 90
        )
        assert got == [80] and buffer == truth[2 * UNIT + 10 : 2 * UNIT + 90]
        assert await disk.read_part([keys[1]], [(UNIT, 2 * UNIT)], UNIT, 2 * UNIT) == (None, [None])
        disk.close()

    trio.run(main)


def test_admission_never_waits_a_full_queue_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        disk = DiskCache(DiskCacheConfig(str(tmp_path / "cache")))
        async with trio.open_nursery() as nursery:
            await nursery.start(disk.run)
            piece = memoryview(bytes(UNIT))
            # admit() is synchronous: the writer cannot run in between, the queue fills.
            for i in range(400):  # 100 MiB, more than the queue holds
                disk.admit(
                    EntryKey("https://example.org/d", "v", i * UNIT, UNIT), i * UNIT, piece, None
                )
            assert disk.counters["disk_refusals"] == 400 - QUEUE_BYTES // UNIT
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_the_write_queue_is_bounded_by_its_config_and_by_the_memory_budget(
    tmp_path: Path,
) -> None:
    """A 64 MiB memory cache gets an 8 MiB queue (an eighth), a large one the default."""
    assert disk_queue_bytes(64 << 20) == 8 << 20
    assert disk_queue_bytes(8 << 30) == QUEUE_BYTES

    async def main() -> None:
        config = DiskCacheConfig(str(tmp_path / "cache"), queue_bytes=disk_queue_bytes(64 << 20))
        disk = DiskCache(config)
        async with trio.open_nursery() as nursery:
            await nursery.start(disk.run)
            piece = memoryview(bytes(UNIT))
            for i in range(100):  # 25 MiB
                disk.admit(
                    EntryKey("https://example.org/d", "v", i * UNIT, UNIT), i * UNIT, piece, None
                )
            assert disk.counters["disk_refusals"] == 100 - (8 << 20) // UNIT
            nursery.cancel_scope.cancel()

    trio.run(main)


# -- the tier with the block cache, against the range server -------------------------------


def test_the_tier_keeps_bytes_across_processes_and_notices_a_rewrite(tmp_path: Path) -> None:
    root = tmp_path / "www"
    root.mkdir()
    data = random.Random(3).randbytes(3 << 20)
    (root / "data.bin").write_bytes(data)
    config = DiskCacheConfig(str(tmp_path / "cache"), check_interval=3600)

    async def read(url: str, expected: bytes) -> dict[str, int]:
        disk = DiskCache(config)
        fetcher = Fetcher()
        async with trio.open_nursery() as nursery:
            await nursery.start(disk.run)
            cache = BlockCache(fetcher, budget=1 << 20, source=DiskTier(disk, fetcher))
            await nursery.start(cache.run)
            rng = random.Random(4)
            for _ in range(50):
                start = rng.randrange(len(expected))
                end = min(len(expected), start + rng.randrange(1, 600_000))
                ref = (start, end) if rng.random() < 0.5 else None
                got = await cache.read_buffer(url, start, end, ref)
                assert bytes(got) == expected[start:end]
            assert await cache.read(url, 0, len(expected)) == expected
            stats = cache.stats()
            nursery.cancel_scope.cancel()
        fetcher.close()
        return stats

    with RangeServer(root, validators=True) as server:
        url = f"{server.url}/data.bin"
        first = trio.run(read, url, data)
        assert first["disk_written_entries"] > 0
        server.reset_stats()
        second = trio.run(read, url, data)
        assert second["disk_misses"] == 0 and second["disk_hits"] > 0
        assert server.stats()["ranges"] == []
        time.sleep(0.01)
        changed = random.Random(5).randbytes(3 << 20)
        (root / "data.bin").write_bytes(changed)  # same inode and size: a new mtime
        server.reset_stats()
        trio.run(read, url, changed)
        # Every byte came from the server again (the third run's own entries aside).
        covered = 0
        for _, start, end in sorted((r for r in server.stats()["ranges"]), key=lambda r: r[1]):
            if start <= covered:
                covered = max(covered, end)
        assert covered == len(changed)


def test_disk_cache_options_as_mount_options() -> None:
    config = parse_args(
        ["r.json", "/mnt", "-o", "disk_cache=/c,disk_cache_min_free=5%,disk_cache_size=2G",
         "-o", "disk_cache_immutable,disk_cache_check_interval=30"]
    )  # fmt: skip
    assert config.disk_cache == "/c"
    assert config.disk_cache_min_free == 0.05
    assert config.disk_cache_size == 2 << 30
    assert config.disk_cache_immutable
    assert config.disk_cache_check_interval == 30.0
    assert parse_args(["r.json", "/mnt", "--disk-cache-min-free", "1G"]).disk_cache_min_free == (
        1 << 30
    )
    with pytest.raises(SystemExit):
        parse_args(["r.json", "/mnt", "--disk-cache-min-free", "150%"])


def test_a_part_half_on_disk_is_whole_and_the_rest_is_fetched(tmp_path: Path) -> None:
    """Units 0 and 5 of a 12-unit file on disk; a read of all of it fetches the two
    runs between and after (more than a megabyte each) and serves every byte."""
    root = tmp_path / "www"
    root.mkdir()
    data = random.Random(8).randbytes(12 * UNIT - 5)
    (root / "data.bin").write_bytes(data)

    async def main(url: str) -> dict[str, int]:
        disk = DiskCache(DiskCacheConfig(str(tmp_path / "cache"), check_interval=3600))
        fetcher = Fetcher()
        async with trio.open_nursery() as nursery:
            await nursery.start(disk.run)
            tier = DiskTier(disk, fetcher)
            for unit in (0, 5):
                got = await tier.fetch(url, unit * UNIT, (unit + 1) * UNIT)
                assert bytes(got) == data[unit * UNIT : (unit + 1) * UNIT]
            nursery.cancel_scope.cancel()  # written at the stop
        async with trio.open_nursery() as nursery:
            disk = DiskCache(DiskCacheConfig(str(tmp_path / "cache"), check_interval=3600))
            await nursery.start(disk.run)
            tier = DiskTier(disk, fetcher)
            whole = await tier.fetch(url, 0, 12 * UNIT, allow_short=True)
            assert bytes(whole) == data
            with pytest.raises(TypeError):
                memoryview(whole)[0] = 0  # nobody writes checked bytes
            stats = disk.stats()
            nursery.cancel_scope.cancel()
        fetcher.close()
        return stats

    with RangeServer(root, validators=True) as server:
        stats = trio.run(main, f"{server.url}/data.bin")
        assert (stats["disk_hits"], stats["disk_misses"]) == (2, 10)
        assert [(s, e) for _, s, e in server.stats()["ranges"]][-2:] == [
            (UNIT, 5 * UNIT),
            (6 * UNIT, 12 * UNIT - 5),
        ]


class _WrittenBetween(Store):
    """A store of the cache directory during whose reservation another process writes
    the bytes it reserved, just after the reservation's first look at the disk (free
    space, or what the temporary files take), before its second."""

    def __init__(self, root: str, other_writes: Callable[[], None]) -> None:
        super().__init__(root)
        self._other_writes: Callable[[], None] | None = other_writes

    def free(self) -> int:
        found = super().free()
        self._between()
        return found

    def writing(self) -> dict[str, int]:
        found = super().writing()
        self._between()
        return found

    def _between(self) -> None:
        write, self._other_writes = self._other_writes, None
        if write is not None:
            write()


def test_bytes_another_process_writes_during_a_reservation_are_never_room(
    small_disk: Path,
) -> None:
    """Process a reserved room for an entry; process b reserves while a writes it.
    Whatever order b looks at the free space and at a's temporary file in, a's bytes
    are counted as taken (twice at worst), never as free: b is refused when a's entry
    and b's together would cross the floor."""
    a = Store(str(small_disk))
    index_a = Index(a.index_path)
    key = EntryKey("https://example.org/r", "v", 0, 300 << 10)
    entry = Entry([(0, 300 << 10)], bytes(300 << 10))
    size = a.space().on_disk(encoded_length(key, entry))
    written: list[int] = []
    b = _WrittenBetween(str(small_disk), lambda: written.append(a.write_temp(key, entry)[1]))
    index_b = Index(b.index_path)
    try:
        free = a.space().free
        # Room for a's entry and half of b's: b's must be refused.
        floor = Limits(max_bytes=1 << 40, min_free=free - 2 * size + size // 2, slack=0)
        assert index_a.reserve(a.owner, [size], time.time(), floor, a).granted == 1
        got = index_b.reserve(b.owner, [size], time.time(), floor, b)
        assert written == [size]  # a wrote its entry while b looked
        assert got.granted == 0, f"granted with {a.space().free} bytes free, floor {floor}"
    finally:
        for index in (index_a, index_b):
            index.close()
        for store in (a, b):
            store.close()

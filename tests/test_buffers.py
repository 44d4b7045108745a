"""Receive buffers used again (refmount.fetch.buffers): a buffer is handed out only when
nothing else refers to it, so bytes a reader holds never change under it."""

from __future__ import annotations

import json
import os
import random
import subprocess
from collections.abc import Callable
from pathlib import Path

import trio

from refmount.cache import BlockCache
from refmount.fetch import Fetcher
from refmount.fetch.buffers import SMALLEST, BufferPool
from tests.conftest import Mounted
from tests.support.nginx import NginxServer
from tests.support.remote_files import write_refs

SIZE = 256 << 10


def test_a_free_buffer_is_handed_out_again() -> None:
    pool = BufferPool(4 * SIZE)
    first = pool.take(SIZE)
    address = id(first)
    pool.give(first)
    del first
    again = pool.take(SIZE)
    assert id(again) == address and pool.reused == 1
    assert pool.held == 0


def test_a_held_buffer_is_not_handed_out() -> None:
    pool = BufferPool(4 * SIZE)
    named = pool.take(SIZE)
    viewed = pool.take(SIZE)
    view = memoryview(viewed)[10:20]
    pool.give(named)  # still named by this test
    pool.give(viewed)  # only a view of it is left
    del viewed
    taken = [pool.take(SIZE) for _ in range(2)]
    assert all(t is not named for t in taken)
    assert all(t.__len__() == SIZE for t in taken)
    assert pool.reused == 0
    view.release()  # now free: handed out next
    again = pool.take(SIZE)
    assert pool.reused == 1 and again is not named


def test_a_buffer_given_twice_is_never_handed_out_twice() -> None:
    pool = BufferPool(4 * SIZE)
    buffer = pool.take(SIZE)
    pool.give(buffer)
    pool.give(buffer)
    del buffer
    a, b = pool.take(SIZE), pool.take(SIZE)
    assert a is not b


def test_the_pool_keeps_at_most_its_limit_and_no_small_or_foreign_buffers() -> None:
    pool = BufferPool(3 * SIZE)
    for _ in range(5):
        pool.give(bytearray(SIZE))
    assert pool.held == 3 * SIZE
    pool.give(bytearray(SMALLEST - 1))
    pool.give(bytes(SIZE))
    pool.give(bytearray(4 * SIZE))  # larger than the whole pool
    assert pool.held == 3 * SIZE
    assert BufferPool(0).give(bytearray(SIZE)) is None
    off = BufferPool(0)
    off.give(bytearray(SIZE))
    assert off.held == 0


def test_bytes_a_reader_holds_stay_while_their_part_is_evicted_and_its_buffer_wanted(
    nginx: NginxServer,
) -> None:
    """In process: a view of a part is held while the part is evicted and more parts
    are fetched through refmount's HTTP client; the view's bytes never change, and the
    buffers of parts nobody holds are used again."""
    data = random.Random(7).randbytes(64 * SIZE)
    (nginx.root / "buffers-held.bin").write_bytes(data)
    url = f"{nginx.url}/buffers-held.bin"

    async def main() -> None:
        fetcher = Fetcher()
        cache = BlockCache(fetcher, budget=16 * SIZE)
        held = await cache.read_buffer(url, 0, SIZE, reference=(0, SIZE))
        assert isinstance(held, (bytearray, memoryview))
        for n in range(1, 64):
            got = await cache.read_buffer(
                url, n * SIZE, (n + 1) * SIZE, reference=(n * SIZE, (n + 1) * SIZE)
            )
            assert bytes(got) == data[n * SIZE : (n + 1) * SIZE]
            del got
            assert bytes(held) == data[:SIZE]
        stats = cache.stats()
        assert stats["evictions"] > 40
        assert stats["buffers_reused"] > 30
        fetcher.close()

    trio.run(main)


def test_sixteen_readers_through_a_small_cache_read_exact_bytes(
    mount: Callable[..., Mounted], nginx: NginxServer, tmp_path: Path
) -> None:
    """Through a mount with a cache of 16 MiB: 16 ``cat`` processes read 400 distinct
    256 KiB chunks twice each, in different orders, while parts are evicted and their
    buffers received into again all the time; every byte is checked."""
    rng = random.Random(28)
    data = rng.randbytes(400 * SIZE)
    (nginx.root / "buffers-readers.bin").write_bytes(data)
    url = f"{nginx.url}/buffers-readers.bin"
    refs = {f"c/{n:04d}": [url, n * SIZE, SIZE] for n in range(400)}
    m = mount(write_refs(tmp_path, refs), "--cache-size", "16M", "--xattrs")
    keys = [*sorted(refs), *sorted(refs)]
    rng.shuffle(keys)
    lists = [keys[n::16] for n in range(16)]
    readers = [
        subprocess.Popen(["cat", *names], cwd=m.mountpoint, stdout=subprocess.PIPE)
        for names in lists
    ]
    outputs = [reader.communicate(timeout=600)[0] for reader in readers]
    for reader, names, got in zip(readers, lists, outputs, strict=True):
        assert reader.returncode == 0
        want = b"".join(data[int(k[2:]) * SIZE : (int(k[2:]) + 1) * SIZE] for k in names)
        assert got == want
    stats = json.loads(os.getxattr(m.mountpoint, "user.refmount.stats"))
    assert stats["buffers_reused"] > 100, stats
    assert m.process.poll() is None, m.log()


def test_with_fetch_workers_no_buffer_is_kept_for_nobody(
    mount: Callable[..., Mounted], nginx: NginxServer, tmp_path: Path
) -> None:
    """Bodies fetched by worker processes reach the daemon through pipes, into buffers
    of their own: the cache keeps no evicted buffer that no fetch would take."""
    data = random.Random(31).randbytes(160 * SIZE)
    (nginx.root / "buffers-workers.bin").write_bytes(data)
    url = f"{nginx.url}/buffers-workers.bin"
    refs = {f"c/{n:04d}": [url, n * SIZE, SIZE] for n in range(160)}
    m = mount(write_refs(tmp_path, refs), "--cache-size", "16M", "--xattrs",
              "--fetch-workers", "1")  # fmt: skip
    done = subprocess.run(["cat", *sorted(refs)], cwd=m.mountpoint, capture_output=True,
                          timeout=300, check=True)  # fmt: skip
    assert done.stdout == data
    stats = json.loads(os.getxattr(m.mountpoint, "user.refmount.stats"))
    assert stats["evictions"] > 50 and "buffers_free_bytes" not in stats, stats

"""Fetcher: filesystems are made off the serving loop, and can be made before any read."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import fsspec
import pytest
import trio
from fsspec.implementations.local import LocalFileSystem

from refmount.errors import FetchError
from refmount.fetch import OPEN_LOCAL_FILES, Fetcher
from refmount.refs import open_refset

MAKE_SECONDS = 0.5


class SlowToMakeFileSystem(LocalFileSystem):
    """Local files behind a filesystem whose construction blocks, like one whose first
    use imports a large client library (aiohttp, botocore): until ``gate`` is set, or
    ``MAKE_SECONDS`` when no test holds it."""

    protocol = "slowmake"
    made = 0
    gate: threading.Event | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Blocking on purpose: an import holds its thread.
        gate = type(self).gate
        if gate is None:
            time.sleep(MAKE_SECONDS)
        else:
            assert gate.wait(60), "the test never let the filesystem be made"
        type(self).made += 1
        super().__init__(*args, **kwargs)

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return super()._strip_protocol(path.removeprefix("slowmake://"))


@pytest.fixture
def slow_protocol() -> type[SlowToMakeFileSystem]:
    fsspec.register_implementation("slowmake", SlowToMakeFileSystem, clobber=True)
    SlowToMakeFileSystem.made = 0
    SlowToMakeFileSystem.gate = None
    SlowToMakeFileSystem.clear_instance_cache()
    return SlowToMakeFileSystem


def test_making_a_filesystem_does_not_stall_other_reads(
    tmp_path: Path, slow_protocol: type[SlowToMakeFileSystem]
) -> None:
    data = bytes(range(256)) * 64
    (tmp_path / "a.bin").write_bytes(data)
    fetcher = Fetcher()
    done: list[str] = []
    gate = slow_protocol.gate = threading.Event()

    async def fetch(name: str, url: str) -> None:
        assert await fetcher.fetch(url, 100, 200) == data[100:200]
        done.append(name)

    async def main() -> None:
        await fetcher.fetch(str(tmp_path / "a.bin"), 0, 1)  # the local filesystem exists
        async with trio.open_nursery() as nursery:
            for k in range(3):  # three readers wait for one filesystem
                nursery.start_soon(fetch, f"slow{k}", f"slowmake://{tmp_path}/a.bin")
            await trio.sleep(0.05)
            # Not timed: the filesystem is made only once the local read is done, so the
            # local read cannot wait for it (it would never end: `gate.wait` fails).
            await fetch("local", str(tmp_path / "a.bin"))
            gate.set()

    trio.run(main)
    assert done[0] == "local"
    assert sorted(done[1:]) == ["slow0", "slow1", "slow2"]
    assert slow_protocol.made == 1


def test_prepare_makes_filesystems_before_the_first_read(
    tmp_path: Path, slow_protocol: type[SlowToMakeFileSystem]
) -> None:
    (tmp_path / "a.bin").write_bytes(b"x" * 1000)
    fetcher = Fetcher()

    async def main() -> None:
        await fetcher.prepare(["slowmake"])
        assert slow_protocol.made == 1  # made ahead: the read has nothing to wait for
        assert await fetcher.fetch(f"slowmake://{tmp_path}/a.bin", 10, 20) == b"x" * 10

    trio.run(main)
    assert slow_protocol.made == 1


def test_prepare_leaves_an_unknown_protocol_to_the_read_that_needs_it() -> None:
    fetcher = Fetcher()

    async def main() -> None:
        await fetcher.prepare(["nosuchprotocol"])  # no exception here
        with pytest.raises(FetchError) as info:
            await fetcher.fetch("nosuchprotocol://bucket/key", 0, 10)
        assert "no filesystem for protocol 'nosuchprotocol'" in str(info.value)
        assert info.value.errno == errno.EIO

    trio.run(main)


def test_a_json_set_names_the_protocols_it_points_at(tmp_path: Path) -> None:
    refs = {
        "version": 1,
        "refs": {
            "inline": "text",
            "a/0": ["s3://bucket/f.nc", 0, 10],
            "a/1": ["https://example.org/f.nc", 0, 10],
            "a/2": ["data.bin", 0, 10],  # relative: a local file next to the refs
            "b/0": ["s3://bucket/g.nc"],
        },
    }
    path = tmp_path / "refs.json"
    path.write_text(json.dumps(refs))
    assert open_refset(str(path)).protocols() == {"s3", "https", "file"}


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_local_reads_after_the_first_are_answered_from_memory(tmp_path: Path) -> None:
    data = os.urandom(300_000)
    path = tmp_path / "a.bin"
    path.write_bytes(data)
    fetcher = Fetcher()

    async def main() -> None:
        assert fetcher.try_now(str(path), 0, 10) is None  # never read: no descriptor yet
        assert await fetcher.fetch(str(path), 0, 10) == data[:10]  # a worker thread
        assert fetcher.stats.local_nowait_reads == 0
        for start, end in [(5, 4096), (100_000, 200_000), (0, 300_000), (299_999, 300_000)]:
            assert fetcher.try_now(str(path), start, end) == data[start:end]
        assert fetcher.stats.local_nowait_reads == 4
        # Past the end the kernel answers short: not now; the ordinary path decides.
        assert fetcher.try_now(str(path), 299_000, 301_000) is None
        assert await fetcher.fetch(str(path), 299_000, 301_000, allow_short=True) == data[299_000:]
        with pytest.raises(FetchError):
            await fetcher.fetch(str(path), 299_000, 301_000)
        assert fetcher.stats.local_nowait_reads == 4
        # Remote URLs never take this path.
        assert fetcher.try_now("http://127.0.0.1:1/x", 0, 10) is None

    trio.run(main)
    fetcher.close()


def test_pages_not_in_memory_are_read_by_a_worker(tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    path = tmp_path / "a.bin"
    path.write_bytes(data)
    fetcher = Fetcher()

    async def main() -> None:
        assert await fetcher.fetch(str(path), 0, 10) == data[:10]
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # out of the page cache
        finally:
            os.close(fd)
        assert fetcher.try_now(str(path), 500_000, 600_000) is None
        assert await fetcher.fetch(str(path), 500_000, 600_000) == data[500_000:600_000]
        assert fetcher.stats.local_nowait_reads == 0

    trio.run(main)
    fetcher.close()


def test_open_local_files_are_bounded_and_closed(tmp_path: Path) -> None:
    count = OPEN_LOCAL_FILES + 44
    for i in range(count):
        (tmp_path / f"{i}.bin").write_bytes(b"%06d" % i)
    fetcher = Fetcher()
    before = open_fds()

    async def main() -> None:
        for i in range(count):
            assert await fetcher.fetch(str(tmp_path / f"{i}.bin"), 0, 6) == b"%06d" % i

    trio.run(main)
    assert open_fds() - before == OPEN_LOCAL_FILES
    fetcher.close()
    assert open_fds() == before


@pytest.mark.parametrize(
    "header",
    [
        "bytes \u0661\u0660-\u0661\u0669/100",  # Arabic-Indic 10-19: int() reads them
        "bytes 10-19/\u0661\u0660\u0660",
        "bytes\u00a010-19/100",  # a no-break space, which \s matches
        "bytes 10-19/100\n",  # $ matches before a final newline
    ],
)
def test_a_content_range_not_in_ascii_is_a_wrong_answer(header: str) -> None:
    """aiohttp and botocore hand headers over decoded: a Content-Range for the asked range
    written with other digits or spaces is refused, not read as the range."""
    from refmount.fetch.backend import WrongAnswer
    from refmount.fetch.bounded import check_content_range

    assert check_content_range("bytes 10-19/100", 10, 20) == 10
    with pytest.raises(WrongAnswer):
        check_content_range(header, 10, 20)

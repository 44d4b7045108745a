"""Reads of references that carry a checksum (Icechunk's virtual chunks) serve only bytes
of the object's version the checksum names: at the fetcher, the block cache and the disk
cache, without a mount, against real servers on 127.0.0.1 (nginx, which honours
``If-Match`` and ``If-Unmodified-Since``; the range server, which ignores them but sends
the new ``ETag``; moto's S3) and local files.  Both HTTP and S3 backends (obstore, and
fsspec's aiohttp / s3fs path) are covered."""

from __future__ import annotations

import errno
import functools
import os
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import obstore
import pytest
import trio
from obstore.store import LocalStore

from refmount.cache import BlockCache
from refmount.cache.disk import DiskCache, DiskCacheConfig, DiskTier
from refmount.errors import FetchError
from refmount.fetch import Fetcher, FetchPolicy, checksums
from refmount.fetch.checksums import ChangedObject, local_etag
from refmount.refs.model import Checksum
from tests.support.changed_files import etag, replace, touch_later
from tests.support.nginx import NginxServer
from tests.support.servers import MotoServer, RangeServer

SIZE = 600_000
BACKENDS = ("auto", "fsspec")  # obstore where it serves the protocol; fsspec always


def fetcher(backend: str = "auto", **remote_options: Any) -> Fetcher:
    policy = FetchPolicy(timeout=10.0, retries=2, backoff=0.01)
    return Fetcher(remote_options=remote_options, policy=policy, backend=backend)


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    return trio.run(body)


def refused(fetch: Callable[[], Awaitable[Any]]) -> FetchError:
    """The error a read of a changed object ends in: EIO, a :class:`ChangedObject`."""

    async def body() -> FetchError:
        with pytest.raises(ChangedObject) as info:
            await fetch()
        return info.value

    error: FetchError = run(body)
    assert error.errno == errno.EIO
    return error


# -- the rules -------------------------------------------------------------------------------


def test_what_matches_a_checksum() -> None:
    etag = Checksum(etag='"abc"')
    assert checksums.mismatch(etag, etag='"abc"', modified=None) is None
    assert checksums.mismatch(etag, etag="abc", modified=None) is None  # quotes differ
    assert checksums.mismatch(etag, etag='W/"abc"', modified=None) is None
    assert "ETag" in (checksums.mismatch(etag, etag='"abd"', modified=None) or "")
    assert "no ETag" in (checksums.mismatch(etag, etag=None, modified=5) or "")
    when = Checksum(last_modified=1_700_000_000)
    http_date = "Tue, 14 Nov 2023 22:13:20 GMT"  # 1_700_000_000
    assert checksums.mismatch(when, etag=None, modified=http_date) is None
    assert checksums.mismatch(when, etag=None, modified=1_699_999_000) is None
    assert "after" in (checksums.mismatch(when, etag=None, modified=1_700_000_001) or "")
    assert "no modification" in (checksums.mismatch(when, etag='"x"', modified=None) or "")
    assert checksums.http_conditions(when) == {"If-Unmodified-Since": http_date}
    assert checksums.http_conditions(etag) == {"If-Match": '"abc"'}


# -- local files -----------------------------------------------------------------------------


def test_a_touched_local_file_is_refused_fast_path_and_all(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    data = random.Random(1).randbytes(SIZE)
    path.write_bytes(data)
    url = path.as_uri()
    mtime = path.stat().st_mtime_ns // 10**9
    by_time = Checksum(last_modified=mtime)
    by_etag = Checksum(etag=local_etag(path.stat()))
    # the ETag object_store (so icechunk) gives the file, which a checksum would record
    assert obstore.head(LocalStore(str(tmp_path)), path.name)["e_tag"] == by_etag.etag
    fetch = fetcher()

    async def read_all() -> None:
        for checksum in (by_time, by_etag, None):
            assert await fetch.fetch(url, 10, 5000, checksum=checksum) == data[10:5000]
        # the descriptor is kept: the next small read is answered on the serving thread
        assert fetch.try_now(url, 10, 5000, by_time) == data[10:5000]

    run(read_all)
    touch_later(path)
    for checksum in (by_time, by_etag):
        assert fetch.try_now(url, 10, 5000, checksum) is None
        error = refused(lambda c=checksum: fetch.fetch(url, 10, 5000, checksum=c))
        assert str(path) in str(error)
    assert fetch.try_now(url, 10, 5000) == data[10:5000]  # no checksum: bytes as they are
    fetch.close()


# -- HTTP ------------------------------------------------------------------------------------


@pytest.fixture
def on_nginx(nginx: NginxServer, request: pytest.FixtureRequest) -> tuple[Path, str, bytes]:
    name = f"checksums-{request.node.name.replace('[', '-').rstrip(']')}.bin"
    data = random.Random(name).randbytes(SIZE)
    (nginx.root / name).write_bytes(data)
    return nginx.root / name, f"{nginx.url}/{name}", data


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_file_replaced_on_nginx_is_refused(
    on_nginx: tuple[Path, str, bytes], backend: str
) -> None:
    path, url, data = on_nginx
    by_etag = Checksum(etag=etag(url))
    by_time = Checksum(last_modified=path.stat().st_mtime_ns // 10**9)
    fetch = fetcher(backend)

    async def read_before() -> None:
        for checksum in (by_etag, by_time):
            assert await fetch.fetch(url, 100, 70_000, checksum=checksum) == data[100:70_000]

    run(read_before)
    new = replace(path, 2)
    assert etag(url) != by_etag.etag
    for checksum in (by_etag, by_time):
        error = refused(lambda c=checksum: fetch.fetch(url, 100, 70_000, checksum=c))
        assert "412" in str(error) and url in str(error)  # nginx refused: a 412

    async def read_after() -> None:
        assert await fetch.fetch(url, 100, 70_000) == new[100:70_000]

    run(read_after)
    fetch.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_server_ignoring_if_match_is_caught_by_its_etag(tmp_path: Path, backend: str) -> None:
    """The range server sends ETag and Last-Modified but honours no condition: the new
    bytes arrive, and are refused by the answer's own ETag; no retry turns that into
    success (one request for the refused read)."""
    root = tmp_path / "www"
    root.mkdir()
    path = root / "data.bin"
    path.write_bytes(random.Random(3).randbytes(SIZE))
    with RangeServer(root, validators=True) as server:
        url = f"{server.url}/data.bin"
        old = Checksum(etag=etag(url))
        replace(path, 4)
        fetch = fetcher(backend)
        server.reset_stats()
        error = refused(lambda: fetch.fetch(url, 0, 4096, checksum=old))
        assert "ETag" in str(error) and "412" not in str(error)
        stats = server.stats()
        assert stats["requests"] == 1  # not retried
        assert stats["headers"][-1].get("if-match") == old.etag  # it was asked
        fetch.close()


# -- S3 --------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_overwritten_s3_object_is_refused(s3_server: MotoServer, backend: str) -> None:
    bucket = f"checksums-{backend}-{os.getpid()}"
    s3_server.make_bucket(bucket)
    data = random.Random(5).randbytes(SIZE)
    s3_server.put(bucket, "data.bin", data)
    etag = s3_server.client().head_object(Bucket=bucket, Key="data.bin")["ETag"]
    url = f"s3://{bucket}/data.bin"
    fetch = fetcher(backend, s3=s3_server.storage_options)
    checksum = Checksum(etag=etag)

    async def read_before() -> None:
        assert await fetch.fetch(url, 1000, 9000, checksum=checksum) == data[1000:9000]

    run(read_before)
    s3_server.put(bucket, "data.bin", random.Random(6).randbytes(SIZE))
    error = refused(lambda: fetch.fetch(url, 1000, 9000, checksum=checksum))
    assert url in str(error)
    fetch.close()


# -- the block cache -------------------------------------------------------------------------


def test_the_memory_cache_keeps_parts_apart_by_checksum(tmp_path: Path) -> None:
    """A part fetched under a checksum serves later reads of that checksum (even after
    the object changed: they are the bytes it names); a part fetched without one never
    serves a checksummed read; a refused read is not cached."""
    root = tmp_path / "www"
    root.mkdir()
    path = root / "data.bin"
    data = random.Random(7).randbytes(SIZE)
    path.write_bytes(data)
    with RangeServer(root, validators=True) as server:
        url = f"{server.url}/data.bin"
        old = Checksum(etag=etag(url))
        original = path.stat()
        fetch = fetcher()
        cache = BlockCache(fetch, budget=64 << 20)

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                await nursery.start(cache.run)
                ref = (5000, 9000)
                assert await cache.read(url, 0, 300_000) == data[:300_000]  # no checksum
                assert bytes(await cache.read_buffer(url, *ref, ref, old)) == data[5000:9000]
                new = replace(path, 8)
                server.reset_stats()
                # the same checksum: from memory, no request
                assert bytes(await cache.read_buffer(url, *ref, ref, old)) == data[5000:9000]
                assert server.stats()["requests"] == 0
                # the same checksum, bytes only cached without one: asked, and refused
                with pytest.raises(FetchError, match="changed since it was referenced"):
                    await cache.read_buffer(url, 100_000, 100_100, (100_000, 100_100), old)
                assert server.stats()["requests"] == 1
                # the new version's checksum: its own bytes
                fresh = Checksum(etag=etag(url))
                got = await cache.read_buffer(url, 100_000, 100_100, (100_000, 100_100), fresh)
                assert bytes(got) == new[100_000:100_100]
                # refused by time, then the old time back: the refusal was not kept
                by_time = Checksum(last_modified=original.st_mtime_ns // 10**9)
                ref = (200_000, 200_100)
                with pytest.raises(FetchError, match="changed since it was referenced"):
                    await cache.read_buffer(url, *ref, ref, by_time)
                os.utime(path, ns=(original.st_atime_ns, original.st_mtime_ns))
                assert (
                    bytes(await cache.read_buffer(url, *ref, ref, by_time)) == new[200_000:200_100]
                )
                nursery.cancel_scope.cancel()

        run(main)
        fetch.close()


# -- the disk cache --------------------------------------------------------------------------


async def read_through_disk(
    config: DiskCacheConfig, url: str, checksum: Checksum | None
) -> tuple[bytes | FetchError, dict[str, int]]:
    """All of ``url`` as one process reads it: a fresh disk cache, fetcher and block
    cache; the bytes or the error, and the counters."""
    disk = DiskCache(config)
    fetch = fetcher()
    result: bytes | FetchError
    async with trio.open_nursery() as nursery:
        await nursery.start(disk.run)
        cache = BlockCache(fetch, budget=8 << 20, source=DiskTier(disk, fetch))
        await nursery.start(cache.run)
        try:
            result = bytes(await cache.read_buffer(url, 0, SIZE, None, checksum))
        except FetchError as exc:
            result = exc
        nursery.cancel_scope.cancel()
    fetch.close()
    return result, cache.stats()  # once the disk cache has written what it was given


def test_a_disk_entry_from_before_the_change_is_not_served(tmp_path: Path) -> None:
    root = tmp_path / "www"
    root.mkdir()
    path = root / "data.bin"
    data = random.Random(9).randbytes(SIZE)
    path.write_bytes(data)
    config = DiskCacheConfig(str(tmp_path / "cache"), check_interval=3600)
    read = functools.partial(read_through_disk, config)

    with RangeServer(root, validators=True) as server:
        url = f"{server.url}/data.bin"
        old = Checksum(etag=etag(url))
        first, stats = trio.run(read, url, old)
        assert first == data and stats["disk_written_entries"] > 0
        server.reset_stats()
        again, stats = trio.run(read, url, old)
        assert again == data and stats["disk_hits"] > 0  # served from disk: it matches
        assert server.stats()["ranges"] == []
        new = replace(path, 10)
        server.reset_stats()
        after, stats = trio.run(read, url, old)
        assert isinstance(after, FetchError) and after.errno == errno.EIO
        assert "changed since it was referenced" in str(after)
        assert stats["disk_hits"] == 0 and stats["disk_bypassed"] > 0
        unchecked, _ = trio.run(read, url, None)
        assert unchecked == new  # without a checksum, the new version
        fresh = Checksum(etag=etag(url))
        assert trio.run(read, url, fresh)[0] == new


def test_a_disk_entry_that_cannot_be_checked_is_not_served(tmp_path: Path) -> None:
    """Data declared immutable on a server that names no version: entries written by
    reads without a checksum are served to those, never to a checksummed read (which the
    server cannot confirm: refused)."""
    root = tmp_path / "www"
    root.mkdir()
    data = random.Random(11).randbytes(SIZE)
    (root / "data.bin").write_bytes(data)
    config = DiskCacheConfig(str(tmp_path / "cache"), check_interval=3600, immutable=True)
    read = functools.partial(read_through_disk, config)
    with RangeServer(root) as server:  # no ETag, no Last-Modified
        url = f"{server.url}/data.bin"
        first, stats = trio.run(read, url, None)
        assert first == data and stats["disk_written_entries"] > 0
        assert trio.run(read, url, None)[1]["disk_hits"] > 0
        checked, stats = trio.run(read, url, Checksum(etag='"any"'))
        assert isinstance(checked, FetchError) and "no ETag" in str(checked)
        assert stats["disk_hits"] == 0


def test_a_modification_time_in_other_digits_is_no_time() -> None:
    """An HTTP date whose day is written in Arabic-Indic digits (int() reads them) is not
    the date it spells: it cannot vouch for a version, so it matches none."""
    ascii_date = "Sun, 06 Nov 1994 08:49:37 GMT"
    assert checksums.seconds(ascii_date) == 784111777
    assert checksums.seconds(ascii_date.replace("06", "\u0660\u0666")) is None
    checksum = Checksum(last_modified=784111777)
    other_digits = ascii_date.replace("06", "\u0660\u0666")
    assert checksums.mismatch(checksum, etag=None, modified=other_digits) is not None

"""Fetch worker processes without a mount: failures keep their meaning across the
process boundary, and a fetcher whose remote backend runs in real worker processes
(against the range server on 127.0.0.1) reads the right bytes, retries and gives up as
in-process, survives a worker killed mid-request, and leaves no process behind."""

from __future__ import annotations

import datetime
import errno
import os
import pickle
import random
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio

from refmount.errors import FetchError
from refmount.fetch import Fetcher, FetchPolicy
from refmount.fetch.backend import Version, WrongAnswer
from refmount.fetch.checksums import ChangedObject
from refmount.fetch.fetcher import classify
from refmount.fetch.obstore_backend import ObstoreError
from refmount.workers.fetching import FetchWorkers
from refmount.workers.fetching.protocol import (
    RemoteFailure,
    WorkerLost,
    decode_error,
    decode_value,
    encode_error,
    encode_value,
)
from tests.support.remote_files import Remote
from tests.support.servers import RangeServer
from tests.test_workers import alive


class NoCredentialsError(Exception):
    """Named like botocore's: the fetcher refuses by the name."""


class CodedError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


FAILURES: list[BaseException] = [
    ObstoreError("HTTP 503 from the store", 503),
    ObstoreError("HTTP 403 from the store", 403),
    ObstoreError("HTTP 404 from the store", 404),
    ObstoreError("HTTP 416 from the store", 416),
    CodedError("too many requests", 429),
    NoCredentialsError("no credentials found"),
    TimeoutError("the store did not answer"),
    ConnectionResetError(104, "reset by peer"),
    ValueError("something else"),
    WrongAnswer("asked for 10 bytes at offset 0, got 11"),
    FileNotFoundError(2, "no such object"),
    PermissionError(13, "not yours"),
]


@pytest.mark.parametrize("failure", FAILURES, ids=lambda e: f"{type(e).__name__}-{e}")
def test_a_failure_is_classified_the_same_after_crossing(failure: BaseException) -> None:
    crossed = decode_error(encode_error(failure))
    assert classify(crossed) == classify(failure)
    for kind in (WrongAnswer, FileNotFoundError, PermissionError):
        assert isinstance(crossed, kind) == isinstance(failure, kind)


@pytest.mark.parametrize(
    ("failure", "kind", "err"),
    [
        (FetchError("refused", errno.EACCES), FetchError, errno.EACCES),
        (FetchError("failed"), FetchError, errno.EIO),
        (ChangedObject("http://h/x.bin", "ETag now 2"), ChangedObject, errno.EIO),
    ],
)
def test_a_fetch_error_keeps_its_class_errno_and_message(
    failure: FetchError, kind: type[FetchError], err: int
) -> None:
    crossed = decode_error(encode_error(failure))
    assert type(crossed) is kind
    assert isinstance(crossed, FetchError)
    assert (crossed.errno, str(crossed)) == (err, str(failure))


def test_an_unknown_failure_keeps_its_class_name_and_status() -> None:
    crossed = decode_error(encode_error(CodedError("slow down", 503)))
    assert isinstance(crossed, RemoteFailure)
    assert (type(crossed).__name__, crossed.status, str(crossed)) == (
        "CodedError",
        503,
        "slow down",
    )


# -- real worker processes ----------------------------------------------------------------


def put(server: RangeServer, name: str, size: int) -> Remote:
    data = random.Random(name).randbytes(size)
    (server.root / name).write_bytes(data)
    return Remote(name, f"{server.url}/{name}", data)


def with_workers(
    test: Callable[[Fetcher, FetchWorkers], Awaitable[None]], workers: int = 2, **policy: float
) -> FetchWorkers:
    """Run ``test`` with a fetcher whose remote reads run in ``workers`` processes; check
    that none is left after."""
    pool = FetchWorkers(workers, per_worker=32)
    fetcher = Fetcher(policy=FetchPolicy(**{"timeout": 10.0, "backoff": 0.01, **policy}))
    fetcher.make_remote = pool.backend
    seen: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pool.run)
            await test(fetcher, pool)
            seen.extend(pool.pids())
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert not [pid for pid in seen if alive(pid)]
    assert pool.pids() == []
    return pool


def test_reads_sizes_and_versions_come_from_the_workers(http: RangeServer) -> None:
    remote = put(http, "fw-reads.bin", 3_000_000)

    async def test(fetcher: Fetcher, pool: FetchWorkers) -> None:
        assert await fetcher.size(remote.url) == len(remote.data)
        assert (await fetcher.version(remote.url)).size == len(remote.data)

        async def read(k: int) -> None:
            start = k * 9_973
            got = await fetcher.fetch(remote.url, start, start + 262_144)
            assert bytes(got) == remote.data[start : start + 262_144]

        async with trio.open_nursery() as nursery:
            for k in range(100):
                nursery.start_soon(read, k)
        tail = await fetcher.fetch(remote.url, 2_999_000, 3_100_000, allow_short=True)
        assert bytes(tail) == remote.data[2_999_000:]
        assert pool.stats()["fetch_worker_starts"] == 2
        assert pool.stats()["fetch_worker_deaths"] == 0

    with_workers(test)
    assert http.stats()["requests"] == 1 + 1 + 100 + 1


@pytest.mark.parametrize(
    ("fault", "err", "requests"),
    [("404", errno.EIO, 1), ("403", errno.EACCES, 1), ("503", errno.EIO, 3)],
)
def test_failures_are_retried_or_final_as_in_process(
    http: RangeServer, fault: str, err: int, requests: int
) -> None:
    remote = put(http, f"fw-fault-{fault}.bin", 10_000)
    http.fault(remote.path, fault, count=-1)

    async def test(fetcher: Fetcher, pool: FetchWorkers) -> None:
        with pytest.raises(FetchError) as failed:
            await fetcher.fetch(remote.url, 0, 1000)
        assert failed.value.errno == err

    with_workers(test, retries=2)
    assert http.stats()["requests"] == requests


def test_a_transient_failure_is_retried_to_the_right_bytes(http: RangeServer) -> None:
    remote = put(http, "fw-transient.bin", 10_000)
    http.fault(remote.path, "503", count=2)

    async def test(fetcher: Fetcher, pool: FetchWorkers) -> None:
        assert bytes(await fetcher.fetch(remote.url, 100, 5000)) == remote.data[100:5000]
        assert fetcher.stats.retries == 2

    with_workers(test)


def test_a_stalled_store_is_an_error_after_each_attempts_deadline(http: RangeServer) -> None:
    """Counted, not timed: one request per attempt; the cancelled requests are given up
    by the workers, and the next read is served.  The workers are started before the
    first read, so that a busy machine's slow start is not spent from its deadline."""
    remote = put(http, "fw-stall.bin", 10_000)
    http.fault(remote.path, "stall", count=2)

    async def test(fetcher: Fetcher, pool: FetchWorkers) -> None:
        with trio.fail_after(60):
            while len(pool.pids()) < 2:
                await trio.sleep(0.01)
        with pytest.raises(FetchError) as failed:
            await fetcher.fetch(remote.url, 0, 1000)
        assert failed.value.errno == errno.EIO
        assert "no answer within" in str(failed.value)
        assert bytes(await fetcher.fetch(remote.url, 0, 1000)) == remote.data[:1000]
        for _ in range(3000):
            if pool.stats()["fetch_worker_requests"] == 0:
                break
            await trio.sleep(0.01)
        assert pool.stats()["fetch_worker_requests"] == 0
        assert pool.stats()["fetch_worker_deaths"] == 0

    with_workers(test, timeout=3.0, retries=1)
    assert http.stats()["requests"] == 3


def test_a_worker_killed_mid_request_is_replaced_and_reads_are_retried(tmp_path: Path) -> None:
    with RangeServer(tmp_path, delay=0.3) as slow:
        remote = put(slow, "fw-killed.bin", 2_000_000)

        async def test(fetcher: Fetcher, pool: FetchWorkers) -> None:
            while len(pool.pids()) < 2:
                await trio.sleep(0.01)
            before = pool.pids()
            results: dict[int, bytes | BaseException] = {}

            async def read(k: int) -> None:
                start = k * 50_000
                try:
                    results[k] = bytes(await fetcher.fetch(remote.url, start, start + 65_536))
                except FetchError as exc:
                    results[k] = exc

            async with trio.open_nursery() as nursery:
                for k in range(20):
                    nursery.start_soon(read, k)
                while pool.stats()["fetch_worker_requests"] < 20:
                    await trio.sleep(0.01)
                os.kill(before[0], signal.SIGKILL)
            for k, got in results.items():
                assert got == remote.data[k * 50_000 : k * 50_000 + 65_536], got
            stats = pool.stats()
            assert stats["fetch_worker_deaths"] == 1
            while len(pool.pids()) < 2:
                await trio.sleep(0.01)
            assert before[0] not in pool.pids()
            assert before[1] in pool.pids()
            assert fetcher.stats.retries >= 1

        with_workers(test)


def test_a_closed_pool_fails_requests_and_leaves_no_process(http: RangeServer) -> None:
    remote = put(http, "fw-closed.bin", 1000)

    async def test(fetcher: Fetcher, pool: FetchWorkers) -> None:
        assert bytes(await fetcher.fetch(remote.url, 0, 10)) == remote.data[:10]
        pids = pool.pids()
        pool.close()
        assert not [pid for pid in pids if alive(pid)]
        with pytest.raises(FetchError):
            await fetcher.fetch(remote.url, 10, 20)

    with_workers(test, retries=1)


class _Planted:
    """A pickle that would run a command when loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_values_cross_as_json_and_a_pickle_from_a_worker_is_never_loaded(tmp_path: Path) -> None:
    when = datetime.datetime(2026, 11, 26, 12, 0, 5, tzinfo=datetime.UTC)
    for value in (
        None,
        0,
        7_340_032,
        Version('etag:"x"|size:3', 3, '"x"', when),
        Version(None, None),
    ):
        assert decode_value(encode_value(value)) == value
    marker = tmp_path / "ran"
    planted = pickle.dumps(_Planted(marker))
    with pytest.raises(WorkerLost):
        decode_value(planted)
    assert isinstance(decode_error(planted), WorkerLost)
    assert isinstance(decode_error(b'["other", "X", "m", "not a status"]'), RemoteFailure)
    assert not marker.exists()

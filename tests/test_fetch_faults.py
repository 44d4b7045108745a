"""The fetcher's retries, errno mapping, deadlines, limits and option scoping, in
milliseconds, against a fault-injecting in-memory fsspec filesystem.

``FaultyFileSystem`` (protocol ``faulty``) serves bytes from a dict and follows a
schedule of faults, one per request, like mountpoint-s3's ``failure_client``: it fails
with any exception, stalls, or answers short or long.  The end-to-end suites
(test_faults.py, test_hostile_store.py) do the same against real servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import fsspec
import pytest
import trio
from fsspec.asyn import AsyncFileSystem

from refmount.errors import FetchError
from refmount.fetch import Fetcher, FetchPolicy
from refmount.fetch.backend import MAX_FILE_SIZE, WrongAnswer
from refmount.fetch.bounded import check_content_range
from refmount.options import per_protocol

DATA = bytes(range(256)) * 40  # 10240 bytes
URL = "faulty://store/data.bin"


class Status(Exception):
    """An error carrying an HTTP status, as aiohttp's and botocore's do."""

    def __init__(self, status: int) -> None:
        super().__init__(f"status {status}")
        self.status = status


class FaultyFileSystem(AsyncFileSystem):
    """Files in memory behind a schedule of faults, one taken per request.

    A fault is an exception (raised), ``"stall"`` (never answers), ``"short"`` /
    ``"long"`` (one byte fewer / more than asked), ``("size", n)`` (info reports n) or
    ``None`` (answer right).  Once the schedule is empty, every request is answered right,
    unless ``forever`` repeats one fault for every request.
    """

    protocol = "faulty"
    cachable = False
    files: ClassVar[dict[str, bytes]] = {}
    schedule: ClassVar[list[Any]] = []
    forever: ClassVar[Any] = None
    calls: ClassVar[int] = 0
    in_flight: ClassVar[int] = 0
    most_in_flight: ClassVar[int] = 0  # the most requests that were ever open at once
    made_with: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, **options: Any) -> None:
        super().__init__(**{k: v for k, v in options.items() if k == "loop"})
        type(self).made_with.append(options)

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return path.removeprefix("faulty://")

    async def _fault(self) -> Any:
        cls = type(self)
        cls.calls += 1
        fault = self.schedule.pop(0) if self.schedule else self.forever
        if isinstance(fault, BaseException):
            raise fault
        if fault == "stall":
            cls.in_flight += 1
            cls.most_in_flight = max(cls.most_in_flight, cls.in_flight)
            try:
                await asyncio.sleep(3600)
            finally:
                cls.in_flight -= 1
        return fault

    async def _cat_file(self, path: str, start: int | None = None, end: int | None = None,
                        **kwargs: Any) -> bytes:  # fmt: skip
        fault = await self._fault()
        data = self.files[path][start:end]
        if fault == "short":
            return data[:-1]
        if fault == "long":
            return data + b"!"
        return data

    async def _info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        fault = await self._fault()
        if isinstance(fault, tuple) and fault[0] == "size":
            return {"name": path, "type": "file", "size": fault[1]}
        if fault == "directory":
            return {"name": path, "type": "directory", "size": 0}
        return {"name": path, "type": "file", "size": len(self.files[path])}


class BrokenToMakeFileSystem(FaultyFileSystem):
    """A filesystem whose constructor fails with an exception nobody expects."""

    protocol = "brokenmake"

    def __init__(self, **options: Any) -> None:
        raise RuntimeError("this filesystem cannot be made")


class HangingToMakeFileSystem(FaultyFileSystem):
    """A filesystem whose constructor waits on a host that never answers."""

    protocol = "hangingmake"

    def __init__(self, **options: Any) -> None:
        time.sleep(10)
        super().__init__(**options)


@pytest.fixture(autouse=True)
def faulty() -> Iterator[type[FaultyFileSystem]]:
    fsspec.register_implementation("faulty", FaultyFileSystem, clobber=True)
    fsspec.register_implementation("brokenmake", BrokenToMakeFileSystem, clobber=True)
    fsspec.register_implementation("hangingmake", HangingToMakeFileSystem, clobber=True)
    FaultyFileSystem.files = {
        "store/data.bin": DATA,
        "other/data.bin": DATA[::-1],
        "third/data.bin": DATA[::2],
    }
    FaultyFileSystem.schedule = []
    FaultyFileSystem.forever = None
    FaultyFileSystem.calls = 0
    FaultyFileSystem.in_flight = FaultyFileSystem.most_in_flight = 0
    FaultyFileSystem.made_with = []
    yield FaultyFileSystem
    FaultyFileSystem.schedule = []
    FaultyFileSystem.forever = None


def quick(**policy: Any) -> Fetcher:
    """A fetcher with deadlines and backoffs short enough for unit tests."""
    settings: dict[str, Any] = {"timeout": 2.0, "retries": 2, "backoff": 0.001} | policy
    return Fetcher(policy=FetchPolicy(**settings))


def fetch(fetcher: Fetcher, url: str = URL, start: int = 100, end: int = 300) -> bytes:
    async def main() -> bytes:
        return await fetcher.fetch(url, start, end)

    return trio.run(main)


def failure(fetcher: Fetcher, url: str = URL, start: int = 100, end: int = 300) -> FetchError:
    with pytest.raises(FetchError) as info:
        fetch(fetcher, url, start, end)
    return info.value


def size_failure(fetcher: Fetcher, url: str = URL) -> FetchError:
    with pytest.raises(FetchError) as info:
        trio.run(fetcher.size, url)
    return info.value


# -- errno mapping and retries ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "err", "calls", "reason"),
    [
        (FileNotFoundError("gone"), errno.EIO, 1, "not found"),
        (Status(404), errno.EIO, 1, "HTTP 404: not found"),
        (PermissionError("no"), errno.EACCES, 1, "access denied"),
        (Status(403), errno.EACCES, 1, "HTTP 403"),
        (Status(401), errno.EACCES, 1, "HTTP 401"),
        (Status(416), errno.EIO, 1, "HTTP 416"),
        (Status(503), errno.EIO, 3, "HTTP 503"),
        (Status(500), errno.EIO, 3, "HTTP 500"),
        (ConnectionResetError("reset by peer"), errno.EIO, 3, "ConnectionResetError"),
        (KeyError("odd"), errno.EIO, 3, "KeyError"),
        (ZeroDivisionError("very odd"), errno.EIO, 3, "ZeroDivisionError"),
        (asyncio.CancelledError(), errno.EIO, 3, "CancelledError"),
    ],
)
def test_every_failure_ends_as_one_errno(
    exc: BaseException, err: int, calls: int, reason: str, faulty: type[FaultyFileSystem]
) -> None:
    """Missing is EIO (never ENOENT: zarr would read fill values), refused is EACCES,
    anything else is retried and then EIO; no other exception type reaches the caller."""
    faulty.forever = exc
    fetcher = quick()

    error = failure(fetcher)

    assert error.errno == err
    assert error.errno != errno.ENOENT
    assert reason in str(error)
    assert faulty.calls == calls
    assert fetcher.stats.errors == 1
    assert fetcher.stats.retries == calls - 1


def test_transient_failures_are_retried_to_the_right_bytes(
    faulty: type[FaultyFileSystem],
) -> None:
    faulty.schedule = [Status(503), ConnectionResetError("reset"), None]
    fetcher = quick()

    assert fetch(fetcher) == DATA[100:300]
    assert faulty.calls == 3
    assert fetcher.stats.retries == 2
    assert fetcher.stats.errors == 0


@pytest.mark.parametrize("lie", ["short", "long"])
def test_a_wrong_length_is_never_data(lie: str, faulty: type[FaultyFileSystem]) -> None:
    faulty.forever = lie
    fetcher = quick()

    error = failure(fetcher)

    assert error.errno == errno.EIO
    assert "asked for 200 bytes at offset 100, got" in str(error)
    assert faulty.calls == 3

    faulty.forever = None
    faulty.schedule = [lie]  # once: the retry gets it right
    assert fetch(fetcher) == DATA[100:300]


def test_a_wrong_answer_from_a_backend_is_retried(faulty: type[FaultyFileSystem]) -> None:
    faulty.schedule = [WrongAnswer("a 200 to bytes 100-299")]
    fetcher = quick()
    assert fetch(fetcher) == DATA[100:300]
    faulty.forever = WrongAnswer("a 200 to bytes 100-299")
    error = failure(fetcher)
    assert "a 200 to bytes 100-299 (after 3 attempts)" in str(error)


# -- deadlines and limits ----------------------------------------------------------------------


def test_a_stalled_store_fails_after_each_attempts_deadline(
    faulty: type[FaultyFileSystem],
) -> None:
    faulty.forever = "stall"
    fetcher = quick(timeout=0.3, retries=1)

    began = time.monotonic()
    error = failure(fetcher)
    elapsed = time.monotonic() - began

    assert error.errno == errno.EIO
    assert "no answer within 0.3 s (after 2 attempts)" in str(error)
    assert elapsed > 0.55, elapsed  # two deadlines waited out; a deadline never fires early
    assert faulty.calls == 2


def test_readers_queued_behind_a_stalled_host_get_their_answer_in_time(
    faulty: type[FaultyFileSystem],
) -> None:
    """Two request slots, every request stalls, ten readers: the ones queued for a slot
    fail within the same bound as the ones in front, (retries + 1) * timeout plus the
    backoffs, not after five rounds of timeouts."""
    faulty.forever = "stall"
    timeout, retries, readers = 1.0, 1, 10
    fetcher = quick(timeout=timeout, retries=retries, max_requests_per_host=2)
    answers: list[tuple[float, FetchError]] = []

    async def reader(k: int) -> None:
        began = trio.current_time()
        with pytest.raises(FetchError) as info:
            await fetcher.fetch(URL, k * 100, k * 100 + 50)
        answers.append((trio.current_time() - began, info.value))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for k in range(readers):
                nursery.start_soon(reader, k)

    trio.run(main)

    assert len(answers) == readers
    # Every reader, queued or in front, had its retries + 1 deadlines and no more (before
    # the fix, a queued reader waited for a slot through several rounds of timeouts):
    # counted, not timed.
    assert all(f"(after {retries + 1} attempts)" in str(error) for _, error in answers)
    assert all(error.errno == errno.EIO for _, error in answers)
    assert any("request slot" in str(error) for _, error in answers)
    # Never more than two requests open at a time.  How many were made, and how many
    # were open together, depends on when each reader's deadline fell (a slot freed by a
    # timeout may go to a queued reader just before its own deadline, which then never
    # reaches the store), so the rest is bounded only.
    assert 1 <= faulty.most_in_flight <= 2
    assert faulty.calls <= readers * (retries + 1)


def test_a_stalled_host_takes_no_slot_from_other_hosts(faulty: type[FaultyFileSystem]) -> None:
    """Readers waiting for a stalled host's slots hold none of the slots all hosts share."""
    faulty.schedule = ["stall"] * 2
    fetcher = quick(timeout=3.0, retries=0, max_requests=3, max_requests_per_host=2)
    done: dict[str, float] = {}

    async def read(name: str, url: str) -> None:
        with contextlib.suppress(FetchError):
            await fetcher.fetch(url, 0, 10)
        done[name] = trio.current_time()

    async def main() -> float:
        began = trio.current_time()
        async with trio.open_nursery() as nursery:
            for k in range(6):  # two stall, four queue for store's slots
                nursery.start_soon(read, f"stalled{k}", URL)
            await trio.sleep(0.1)
            nursery.start_soon(read, "other", "faulty://other/data.bin")
        return began

    began = trio.run(main)
    assert done["other"] - began < 1.5, done


# -- making filesystems, sizes -----------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "brokenmake://host/file",
        "nosuchprotocol://host/file",
        "reference://x/y",
        "tar::file:///nonexistent.tar",
        "zip::file:///nonexistent.zip",
        "dir::file:///nonexistent",
        "ftp://127.0.0.1:1/x",
    ],
)
def test_a_filesystem_that_cannot_be_made_is_eio_for_that_read(url: str) -> None:
    fetcher = quick(timeout=5.0, retries=0)

    assert failure(fetcher, url).errno == errno.EIO
    assert size_failure(fetcher, url).errno == errno.EIO
    trio.run(fetcher.prepare, [url.partition("://")[0]])  # never raises
    # The fetcher still serves other reads.
    assert fetch(fetcher) == DATA[100:300]


def test_making_a_filesystem_is_under_the_reads_deadline() -> None:
    fetcher = quick(timeout=0.5, retries=0)
    error = failure(fetcher, "hangingmake://host/file")
    # The read's deadline, not the constructor's 10 s, ended it (named, not timed).
    assert "no answer within 0.5 s" in str(error)


def test_options_no_filesystem_can_take_are_eio_for_that_read() -> None:
    fetcher = Fetcher(remote_options={"s3": {"config_kwargs": 7}})
    error = failure(fetcher, "s3://bucket/key")
    assert error.errno == errno.EIO
    assert "TypeError" in str(error)


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        (("size", MAX_FILE_SIZE + 1), "the store reports a size of 9223372036854775808 bytes"),
        (("size", -1), "the store reports a size of -1 bytes"),
        (("size", "12"), "the store gives no size"),
        (("size", None), "the store gives no size"),
        ("directory", "is a directory"),
        (FileNotFoundError("gone"), "not found"),
        (RuntimeError("odd"), "RuntimeError: odd"),
    ],
)
def test_a_size_that_no_file_can_have_is_eio(
    fault: Any, message: str, faulty: type[FaultyFileSystem]
) -> None:
    faulty.forever = fault
    error = size_failure(quick(retries=1))
    assert error.errno == errno.EIO
    assert message in str(error)


def test_the_largest_size_a_file_can_have_is_a_size(faulty: type[FaultyFileSystem]) -> None:
    faulty.schedule = [("size", MAX_FILE_SIZE)]
    assert trio.run(quick().size, URL) == MAX_FILE_SIZE


def test_a_deleted_local_file_is_eio(tmp_path: Path) -> None:
    path = tmp_path / "a.bin"
    path.write_bytes(DATA)
    fetcher = quick()
    assert fetch(fetcher, str(path)) == DATA[100:300]
    assert fetcher.try_now(str(path), 0, 10) == DATA[:10]  # a descriptor is kept
    os.unlink(path)
    assert fetcher.try_now(str(path), 0, 10) is None  # not the deleted file's old bytes
    assert failure(fetcher, str(path)).errno == errno.EIO
    assert size_failure(fetcher, str(path)).errno == errno.EIO
    assert size_failure(fetcher, str(tmp_path)).errno == errno.EIO  # a directory
    fetcher.close()


# -- Content-Range -----------------------------------------------------------------------------


def test_content_range_must_be_the_asked_range() -> None:
    assert check_content_range("bytes 100-299/10240", 100, 300) == 200
    assert check_content_range("bytes 100-199/200", 100, 300) == 100  # the file ends first
    for header in [
        None,
        "bytes 101-300/10240",  # shifted
        "bytes 100-298/10240",  # short, though the file goes on
        "bytes 100-199/*",  # short, file size unknown
        "bytes 100-399/10240",  # longer than asked
        "bytes 0-9/10240",
        "bytes */10240",
        "items 100-299/10240",
    ]:
        with pytest.raises(WrongAnswer):
            check_content_range(header, 100, 300)


# -- which hosts receive which options -----------------------------------------------------------


def test_options_go_only_to_their_protocol_and_host(faulty: type[FaultyFileSystem]) -> None:
    fetcher = Fetcher(
        remote_options={
            "faulty": {"shared": 1, "token": "for everyone"},
            "faulty://store": {"token": "for store only"},
        }
    )
    assert fetch(fetcher, "faulty://store/data.bin", 0, 10) == DATA[:10]
    assert fetch(fetcher, "faulty://other/data.bin", 0, 10) == DATA[::-1][:10]
    assert fetch(fetcher, "faulty://third/data.bin", 0, 10) == DATA[::2][:10]
    assert {"shared": 1, "token": "for store only"} in faulty.made_with
    assert {"shared": 1, "token": "for everyone"} in faulty.made_with
    # One filesystem per host with options of its own; the other hosts share one.
    assert len(faulty.made_with) == 2


def test_flat_options_go_to_the_one_remote_host_only(faulty: type[FaultyFileSystem]) -> None:
    fetcher = Fetcher(remote_options=per_protocol({"token": "secret"}, None))
    fetcher.confine_flat_options(["faulty://store/data.bin", "faulty://store/x", "/local/file"])
    fetch(fetcher, "faulty://store/data.bin", 0, 10)
    fetch(fetcher, "faulty://other/data.bin", 0, 10)  # not in the set: no options
    assert faulty.made_with == [{"token": "secret"}, {}]


def test_flat_options_for_many_hosts_are_refused() -> None:
    fetcher = Fetcher(remote_options=per_protocol({"headers": {"Authorization": "x"}}, None))
    with pytest.raises(ValueError) as info:
        fetcher.confine_flat_options(["https://a.example/f", "https://b.example:8443/f"])
    message = str(info.value)
    assert "2 remote hosts (https://a.example, https://b.example:8443)" in message
    assert '{"https://a.example": {...}}' in message
    with pytest.raises(ValueError, match="does not list the hosts"):
        fetcher.confine_flat_options(None)  # a Parquet set: hosts unknown up front
    fetcher.confine_flat_options([])  # nothing remote: the options are unused
    assert fetcher.remote_options == {}


@pytest.mark.parametrize(
    ("given", "protocol", "scoped"),
    [
        ({"s3": {"anon": True}}, None, {"s3": {"anon": True}}),
        ({"https://h.example/": {"a": 1}}, None, {"https://h.example/": {"a": 1}}),
        ({"http://h:8080": {"a": 1}, "s3": {}}, None, {"http://h:8080": {"a": 1}, "s3": {}}),
        ({"anon": True}, "s3", {"s3": {"anon": True}}),
        ({"anon": True}, None, {"*": {"anon": True}}),
        ({"s3": {"anon": True}, "key": "k"}, None, {"*": {"s3": {"anon": True}, "key": "k"}}),
        # a URL prefix (an Icechunk virtual chunk container) is a scope of its own
        ({"https://h.example/path/": {"a": 1}}, None, {"https://h.example/path/": {"a": 1}}),
        ({"https://": {"a": 1}}, None, {"*": {"https://": {"a": 1}}}),
    ],
)
def test_per_protocol_tells_keyed_from_flat(
    given: dict[str, Any], protocol: str | None, scoped: dict[str, Any]
) -> None:
    assert per_protocol(given, protocol) == scoped

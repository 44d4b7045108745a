"""Stores that lie, stall or flood, as readers of the mount see them.

Each test mounts a reference set with a 64 MiB cache, makes tests/support/rangeserver.py
answer one target in a hostile way (see its docstring: a 10 GiB body to a ranged request,
an endless body, a gzip bomb, a 200 or a Content-Range that is not the asked range, long
and short bodies, errors after mount, resets), reads through the mount with ``cat`` or
``dd`` in a child process, and asserts three things: the reader gets the right bytes or
EIO (never wrong bytes, never ENOENT), the daemon still serves another key, and the
daemon's peak resident memory stayed under the cache budget plus ``RSS_MARGIN``.
The last tests check that options given for one host (a bearer token) reach no other.
"""

from __future__ import annotations

import errno
import json
import random
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from refmount.errors import FetchError
from refmount.fetch import Fetcher, FetchPolicy
from tests.conftest import Mounted, is_mounted, refmount_cli
from tests.support.remote_files import Remote, write_refs
from tests.support.servers import RangeServer

CACHE = 64 << 20
CACHE_OPTION = "64M"
RSS_MARGIN = 200 << 20  # the interpreter, pyarrow, aiohttp and one request's buffers
EIO = "Input/output error"
SIZE = 2_000_000  # bytes of each data file
KEY_OFFSET = 1_000_000  # where a key starts in its target (non-zero: a 200 is then a lie)
KEY_LENGTH = 300_000


def read(path: Path, tool: str = "cat") -> subprocess.CompletedProcess[bytes]:
    argv = ["cat", str(path)] if tool == "cat" else ["dd", f"if={path}", "bs=1M", "status=none"]
    return subprocess.run(argv, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)


def peak_rss(m: Mounted) -> int:
    """The daemon's peak resident set (VmHWM), in bytes."""
    status = Path(f"/proc/{m.process.pid}/status").read_text()
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    assert match, status
    return int(match[1]) * 1024


def mount_hostile(
    mount: Callable[..., Mounted],
    tmp_path: Path,
    refs: dict[str, object],
    *extra: str,
) -> Mounted:
    return mount(
        write_refs(tmp_path, refs),
        "--cache-size", CACHE_OPTION, "--timeout", "5", "--retries", "1", *extra,
    )  # fmt: skip


def assert_alive_and_bounded(m: Mounted, good: Remote, key: str = "good") -> None:
    assert m.process.poll() is None, m.log()
    result = read(m.mountpoint / key)
    assert result.returncode == 0, result.stderr
    assert result.stdout == good.data[KEY_OFFSET : KEY_OFFSET + KEY_LENGTH]
    peak = peak_rss(m)
    assert peak < CACHE + RSS_MARGIN, f"peak RSS {peak >> 20} MiB"


def assert_eio(result: subprocess.CompletedProcess[bytes], expected: bytes) -> None:
    assert result.returncode != 0, f"read {len(result.stdout)} bytes instead of failing"
    assert EIO in result.stderr.decode(), result.stderr
    assert expected.startswith(result.stdout), "bytes read before the error are wrong"


# -- bodies that are not the asked range ---------------------------------------------------------


@pytest.mark.parametrize(
    "mode", ["huge", "endless", "gzip-bomb", "exact-200", "wrong-range", "long", "short",
             "truncate"],
)  # fmt: skip
@pytest.mark.parametrize("tool", ["cat", "dd"])
def test_a_lying_body_is_eio_at_bounded_cost(
    mode: str,
    tool: str,
    mount: Callable[..., Mounted],
    remote: Callable[..., Remote],
    http: RangeServer,
    tmp_path: Path,
) -> None:
    bad, good = remote("bad", SIZE), remote("good", SIZE)
    refs = {
        "bad": [bad.url, KEY_OFFSET, KEY_LENGTH],
        "good": [good.url, KEY_OFFSET, KEY_LENGTH],
    }
    m = mount_hostile(mount, tmp_path, refs)
    http.fault(bad.path, mode, count=-1)

    assert_eio(read(m.mountpoint / "bad", tool), bad.data[KEY_OFFSET : KEY_OFFSET + KEY_LENGTH])

    stats = http.stats()
    assert stats["requests"] >= 2, stats  # the lie was retried once before EIO
    for headers in stats["headers"]:
        assert headers.get("accept-encoding") == "identity", headers
    assert_alive_and_bounded(m, good)
    # Nothing about the lie is remembered: once the store tells the truth, the bytes are right.
    http.clear_faults()
    result = read(m.mountpoint / "bad", tool)
    assert result.returncode == 0, result.stderr
    assert result.stdout == bad.data[KEY_OFFSET : KEY_OFFSET + KEY_LENGTH]


@pytest.mark.parametrize("mode", ["huge", "exact-200"])
def test_a_200_from_byte_zero_is_used_for_its_prefix_only(
    mode: str,
    mount: Callable[..., Mounted],
    remote: Callable[..., Remote],
    http: RangeServer,
    tmp_path: Path,
) -> None:
    """A 200 is the whole object from byte 0: for a key at offset 0 its first bytes are
    the right ones, and no more of it than the key needs is read (the huge body is 10 GiB)."""
    first, good = remote("first", SIZE), remote("good", SIZE)
    refs = {"first": [first.url, 0, 50_000], "good": [good.url, KEY_OFFSET, KEY_LENGTH]}
    m = mount_hostile(mount, tmp_path, refs)
    http.fault(first.path, mode, count=-1)

    result = read(m.mountpoint / "first")

    assert result.returncode == 0, result.stderr
    assert result.stdout == first.data[:50_000]
    assert_alive_and_bounded(m, good)


def test_a_size_no_file_can_have_is_eio(
    mount: Callable[..., Mounted],
    remote: Callable[..., Remote],
    http: RangeServer,
    tmp_path: Path,
) -> None:
    whole, good = remote("whole", 1000), remote("good", SIZE)
    refs = {"whole": [whole.url], "good": [good.url, KEY_OFFSET, KEY_LENGTH]}
    m = mount_hostile(mount, tmp_path, refs)
    http.fault(whole.path, "huge-size", count=-1, method="HEAD")

    result = subprocess.run(["stat", "-c", "%s", str(m.mountpoint / "whole")],
                            capture_output=True, timeout=60)  # fmt: skip

    assert result.returncode != 0, result.stdout
    assert EIO in result.stderr.decode(), result.stderr
    assert "the store reports a size of 9223372036854775808 bytes" in m.log()
    assert_alive_and_bounded(m, good)


# -- errors after mount ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "message"),
    [("404", EIO), ("403", EIO), ("500", EIO), ("reset", EIO), ("stall", EIO)],
)
def test_errors_after_mount_are_eio_or_eacces_never_enoent(
    mode: str,
    message: str,
    mount: Callable[..., Mounted],
    remote: Callable[..., Remote],
    http: RangeServer,
    tmp_path: Path,
) -> None:
    bad, good = remote("bad", SIZE), remote("good", SIZE)
    refs = {
        "range": [bad.url, KEY_OFFSET, KEY_LENGTH],
        "whole": [bad.url],
        "good": [good.url, KEY_OFFSET, KEY_LENGTH],
    }
    m = mount_hostile(mount, tmp_path, refs)
    http.fault(bad.path, mode, count=-1)

    for key in ("range", "whole"):
        result = read(m.mountpoint / key)
        assert result.returncode != 0, f"{key}: read {len(result.stdout)} bytes"
        stderr = result.stderr.decode()
        assert message in stderr, stderr
        assert "No such file or directory" not in stderr
        assert result.stdout == b""
    assert_alive_and_bounded(m, good)


# -- secrets go only where they were given for ----------------------------------------------------


@pytest.fixture
def second_http(tmp_path: Path) -> Iterator[RangeServer]:
    """Another server on 127.0.0.1: another port, so another host to refmount."""
    root = tmp_path / "second-root"
    root.mkdir()
    with RangeServer(root) as server:
        yield server


def two_host_refs(
    tmp_path: Path, first: RangeServer, second: RangeServer
) -> tuple[Path, bytes, bytes]:
    one, two = random.Random(1).randbytes(5000), random.Random(2).randbytes(5000)
    (first.root / f"{tmp_path.name}-one.bin").write_bytes(one)
    (second.root / "two.bin").write_bytes(two)
    refs = {
        "one": [f"{first.url}/{tmp_path.name}-one.bin", 100, 1000],
        "two": [f"{second.url}/two.bin", 200, 1000],
    }
    return write_refs(tmp_path, refs), one, two


def test_options_for_one_host_never_reach_another(
    mount: Callable[..., Mounted], http: RangeServer, second_http: RangeServer, tmp_path: Path
) -> None:
    refs, one, two = two_host_refs(tmp_path, http, second_http)
    options = {http.url: {"headers": {"Authorization": "Bearer for-the-first-only"}}}
    m = mount(refs, "--remote-options", json.dumps(options))

    assert read(m.mountpoint / "one").stdout == one[100:1100]
    assert read(m.mountpoint / "two").stdout == two[200:1200]

    first_headers, second_headers = http.stats()["headers"], second_http.stats()["headers"]
    assert first_headers and second_headers
    assert all(h.get("authorization") == "Bearer for-the-first-only" for h in first_headers)
    assert all("authorization" not in h for h in second_headers), second_headers


def test_flat_options_for_a_set_of_many_hosts_are_refused(
    mountpoint: Path, http: RangeServer, second_http: RangeServer, tmp_path: Path
) -> None:
    refs, _, _ = two_host_refs(tmp_path, http, second_http)
    flat = {"headers": {"Authorization": "Bearer secret"}}

    result = refmount_cli(str(refs), str(mountpoint), "-f", "--remote-options", json.dumps(flat))

    assert result.returncode != 0
    assert "points at 2 remote hosts" in result.stderr, result.stderr
    assert "key the options by protocol or host" in result.stderr
    assert "Bearer secret" not in result.stderr
    assert not is_mounted(mountpoint)
    assert http.stats()["requests"] == 0 and second_http.stats()["requests"] == 0


def test_flat_options_go_to_the_one_host_of_the_set(
    mount: Callable[..., Mounted], http: RangeServer, tmp_path: Path
) -> None:
    data = random.Random(3).randbytes(3000)
    (http.root / f"{tmp_path.name}-only.bin").write_bytes(data)
    refs = write_refs(tmp_path, {"k": [f"{http.url}/{tmp_path.name}-only.bin", 10, 2000]})
    flat = {"headers": {"Authorization": "Bearer the-one-host"}}
    m = mount(refs, "--remote-options", json.dumps(flat))

    assert read(m.mountpoint / "k").stdout == data[10:2010]
    headers = http.stats()["headers"]
    assert headers and all(h.get("authorization") == "Bearer the-one-host" for h in headers)


# -- in process, against the real server -----------------------------------------------------------


@pytest.mark.parametrize("mode", ["long", "endless", "short", "wrong-range"])
def test_an_answer_past_the_end_of_the_file_is_no_short_file(
    mode: str, remote: Callable[..., Remote], http: RangeServer
) -> None:
    """A read that may end with the file (a block past the file's end) still refuses a
    body longer than its Content-Range: the extra bytes would pass for the file's end."""
    small = remote("small", 50_000)
    fetcher = Fetcher(policy=FetchPolicy(timeout=5, retries=0))

    async def main() -> None:
        assert (
            await fetcher.fetch(small.url, 40_000, 100_000, allow_short=True) == small.data[40_000:]
        )
        http.fault(small.path, mode, count=-1)
        with pytest.raises(FetchError) as info:
            await fetcher.fetch(small.url, 40_000, 100_000, allow_short=True)
        assert info.value.errno == errno.EIO

    trio.run(main)
    fetcher.close()

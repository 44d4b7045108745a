"""Redirects and the options keyed to a host, through real mounts with each fetch backend
(refmount's own client, obstore, fsspec): a header given for one host reaches no other
host, whoever follows the redirect.  A redirect to another host is refused (EIO) when the
read carries a header of the user's, followed when it carries none; a redirect within
the host is followed with the header.  Two raw socket servers of this file's
(tests/support/rawserver.py) on two ports: two hosts to refmount.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Mounted
from tests.support.rawserver import RawServer, Reply, asked_range, header_lines, partial
from tests.support.remote_files import write_refs

DATA = bytes((i * 71 + (i >> 6)) % 247 for i in range(1 << 16))
OFFSET, LENGTH = 2000, 3000
SECRET = b"x-api-key: for-the-first-host-only"
BACKENDS = ["auto", "obstore", "fsspec"]


def cat(path: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["cat", str(path)], capture_output=True, timeout=60)


def ranged(head: bytes) -> bytes:
    return partial(*asked_range(head), DATA)


def redirecting(elsewhere: str) -> Callable[[bytes], tuple[Reply, bool]]:
    """``/other`` redirects to ``elsewhere``, ``/here`` to ``/data.bin`` on the same
    server, which answers the range."""

    def answer(head: bytes) -> tuple[Reply, bool]:
        path = head.split(b" ")[1]
        if path in (b"/other", b"/here"):
            to = elsewhere if path == b"/other" else "/data.bin"
            return (
                f"HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\n\r\n".encode(),
                True,
            )
        return ranged(head), True

    return answer


@pytest.fixture
def two_hosts(raw_server: Callable[..., RawServer]) -> tuple[RawServer, RawServer]:
    second = raw_server(lambda head: (ranged(head), True))
    first = raw_server(redirecting(second.url("/data.bin")))
    return first, second


def mount_with_key(
    mount: Callable[..., Mounted], tmp_path: Path, first: RawServer, backend: str, keyed: bool
) -> Mounted:
    refs = {
        "other": [first.url("/other"), OFFSET, LENGTH],
        "here": [first.url("/here"), OFFSET, LENGTH],
    }
    args = ["--fetch-backend", backend, "--timeout", "5", "--retries", "1"]
    if keyed:
        options = {first.url(""): {"headers": {"X-Api-Key": "for-the-first-host-only"}}}
        args += ["--remote-options", json.dumps(options)]
    return mount(write_refs(tmp_path, refs), *args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_redirect_to_another_host_is_followed_with_nothing_keyed_to_the_first(
    mount: Callable[..., Mounted],
    tmp_path: Path,
    two_hosts: tuple[RawServer, RawServer],
    backend: str,
) -> None:
    first, second = two_hosts
    m = mount_with_key(mount, tmp_path, first, backend, keyed=True)
    moved = cat(m.mountpoint / "other")
    assert moved.returncode == 0, (moved.stderr, m.log()[-2000:])
    assert moved.stdout == DATA[OFFSET : OFFSET + LENGTH]
    assert second.requests
    assert all(b"x-api-key" not in h.lower() for h in second.requests), second.requests
    # Within the host, the redirect is followed, the header sent on both requests.
    here = cat(m.mountpoint / "here")
    assert here.returncode == 0, (here.stderr, m.log()[-2000:])
    assert here.stdout == DATA[OFFSET : OFFSET + LENGTH]
    asked = [h for h in first.requests if h.split(b" ")[1] in (b"/here", b"/data.bin")]
    assert {h.split(b" ")[1] for h in asked} == {b"/here", b"/data.bin"}
    assert all(SECRET in header_lines(h) for h in first.requests)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_redirect_to_another_host_is_followed_when_nothing_is_keyed_to_the_first(
    mount: Callable[..., Mounted],
    tmp_path: Path,
    two_hosts: tuple[RawServer, RawServer],
    backend: str,
) -> None:
    first, second = two_hosts
    m = mount_with_key(mount, tmp_path, first, backend, keyed=False)
    moved = cat(m.mountpoint / "other")
    assert moved.returncode == 0, (moved.stderr, m.log()[-2000:])
    assert moved.stdout == DATA[OFFSET : OFFSET + LENGTH]
    assert second.requests and all(b"x-api-key" not in h.lower() for h in second.requests)


@pytest.mark.parametrize("backend", ["auto", "fsspec"])
def test_the_new_origin_gets_what_is_keyed_to_it_and_only_that(
    mount: Callable[..., Mounted],
    tmp_path: Path,
    two_hosts: tuple[RawServer, RawServer],
    backend: str,
) -> None:
    first, second = two_hosts
    refs = {"other": [first.url("/other"), OFFSET, LENGTH]}
    options = {
        first.url(""): {"headers": {"X-Api-Key": "for-the-first-host-only"}},
        second.url(""): {"headers": {"X-Api-Key": "for-the-second-host"}},
    }
    m = mount(
        write_refs(tmp_path, refs),
        *("--fetch-backend", backend, "--remote-options", json.dumps(options)),
    )
    moved = cat(m.mountpoint / "other")
    assert moved.returncode == 0, (moved.stderr, m.log()[-2000:])
    assert moved.stdout == DATA[OFFSET : OFFSET + LENGTH]
    assert second.requests
    for head in second.requests:
        assert b"x-api-key: for-the-second-host" in header_lines(head)
        assert SECRET not in header_lines(head)


def hops(count: int) -> Callable[[bytes], tuple[Reply, bool]]:
    """``/hop/N`` redirects to ``/hop/N+1`` up to ``/hop/count``, which answers, with a
    signature in each redirect's query."""

    def answer(head: bytes) -> tuple[Reply, bool]:
        path = head.split(b" ")[1].decode()
        number = int(path.split("/")[2].split("?")[0])
        if number < count:
            to = f"/hop/{number + 1}?X-Amz-Signature=sig-{number}-never-logged"
            reply = f"HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\n\r\n"
            return reply.encode(), True
        return ranged(head), True

    return answer


@pytest.mark.parametrize("backend", ["auto", "fsspec"])
def test_at_most_five_hops_and_no_signature_in_the_log(
    mount: Callable[..., Mounted],
    tmp_path: Path,
    raw_server: Callable[..., RawServer],
    backend: str,
) -> None:
    five, six = raw_server(hops(5)), raw_server(hops(6))
    refs = {
        "five": [five.url("/hop/0"), OFFSET, LENGTH],
        "six": [six.url("/hop/0"), OFFSET, LENGTH],
    }
    m = mount(write_refs(tmp_path, refs), "--fetch-backend", backend, "-d", "--retries", "0")
    ok = cat(m.mountpoint / "five")
    assert ok.returncode == 0, (ok.stderr, m.log()[-2000:])
    assert ok.stdout == DATA[OFFSET : OFFSET + LENGTH]
    refused = cat(m.mountpoint / "six")
    assert refused.returncode != 0 and b"Input/output error" in refused.stderr, refused
    asked = {h.split(b" ")[1].split(b"?")[0] for h in six.requests}
    assert asked == {f"/hop/{n}".encode() for n in range(6)}  # the sixth hop is not taken
    assert "more than 5 redirects" in m.log()
    assert "never-logged" not in m.log()

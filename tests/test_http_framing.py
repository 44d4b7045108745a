"""How refmount's own HTTP client frames answers, through a real mount, against a raw
socket server of this file's (tests/support/rawserver.py): Transfer-Encoding on a range
(with or without a Content-Length) is EIO, never the encoded bytes; interim answers
(100, 103) before the final one are skipped, a bounded number of them; bytes a server
sends that nobody asked for never become the answer to the next request.

Each test mounts a reference set whose keys are ranges of paths on the raw server, reads
them with ``cat`` and asserts the bytes or EIO, and what the server received.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Mounted
from tests.support import rawserver
from tests.support.rawserver import RawServer, Reply, asked_range
from tests.support.remote_files import write_refs

DATA = bytes((i * 197 + (i >> 9) * 31) % 253 for i in range(1 << 20))
OTHER = bytes(255 - b for b in DATA)  # what a lying answer carries instead
OFFSET, LENGTH = 100_000, 4096
EIO = "Input/output error"


def read(path: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["cat", str(path)], capture_output=True, timeout=60, stdin=subprocess.DEVNULL
    )


def path_of(head: bytes) -> str:
    return head.split(b" ", 2)[1].decode()


def partial(first: int, last: int, data: bytes = DATA, extra: str = "") -> bytes:
    return rawserver.partial(first, last, data, extra)


def chunked(body: bytes) -> bytes:
    return f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"


def mount_keys(
    mount: Callable[..., Mounted],
    tmp_path: Path,
    server: RawServer,
    keys: dict[str, str],
    length: int = LENGTH,
) -> Mounted:
    """Each key ``length`` bytes at ``OFFSET`` of its path on ``server``."""
    refs = {key: [server.url(path), OFFSET, length] for key, path in keys.items()}
    return mount(write_refs(tmp_path, refs), "--timeout", "3", "--retries", "1")


def assert_eio(result: subprocess.CompletedProcess[bytes]) -> None:
    assert result.returncode != 0, f"read {len(result.stdout)} bytes instead of failing"
    assert EIO in result.stderr.decode(), result.stderr
    assert result.stdout == b""


def assert_good(m: Mounted, key: str = "good", length: int = LENGTH) -> None:
    result = read(m.mountpoint / key)
    assert result.returncode == 0, (result.stderr, m.log()[-2000:])
    assert result.stdout == DATA[OFFSET : OFFSET + length]
    assert m.process.poll() is None


def _encoded(first: int, last: int, mode: str) -> Reply:
    body = DATA[first : last + 1]
    head = f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {first}-{last}/{len(DATA)}\r\n"
    if mode == "chunked-with-length":
        return (head + f"Content-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n\r\n")\
            .encode() + chunked(body)  # fmt: skip
    if mode == "chunked-huge":
        return (head + f"Content-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n\r\n"
                "e8d4a51000\r\n").encode() + body  # fmt: skip
    if mode == "gzip-with-length":
        return (head + f"Content-Length: {len(body)}\r\nTransfer-Encoding: gzip\r\n\r\n")\
            .encode() + body  # fmt: skip
    if mode == "chunked-alone":
        return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + chunked(body)
    if mode == "length-then-encoding-folded":
        # The encoding hidden behind a bare LF in another header's value.
        return (head + f"Content-Length: {len(body)}\r\nX-A: 1\nTransfer-Encoding: chunked"
                "\r\n\r\n").encode() + chunked(body)  # fmt: skip
    raise AssertionError(mode)


@pytest.mark.parametrize(
    "mode",
    [
        "chunked-with-length",
        "chunked-huge",
        "gzip-with-length",
        "chunked-alone",
        "length-then-encoding-folded",
    ],
)
def test_a_transfer_encoding_on_a_range_is_eio(
    mount: Callable[..., Mounted], tmp_path: Path, raw_server: Callable[..., RawServer], mode: str
) -> None:
    def answer(head: bytes) -> tuple[Reply, bool]:
        first, last = asked_range(head)
        if path_of(head) == "/good.bin":
            return partial(first, last), True
        return _encoded(first, last, mode), True

    server = raw_server(answer)
    m = mount_keys(mount, tmp_path, server, {"encoded": "/encoded.bin", "good": "/good.bin"})
    assert_eio(read(m.mountpoint / "encoded"))
    asked = [path_of(h) for h in server.requests]
    assert asked.count("/encoded.bin") >= 2  # a try and a retry per read, then EIO
    assert_good(m)


@pytest.mark.parametrize("together", [True, False], ids=["one-write", "separate-writes"])
def test_interim_answers_before_the_final_one_are_skipped(
    mount: Callable[..., Mounted],
    tmp_path: Path,
    raw_server: Callable[..., RawServer],
    together: bool,
) -> None:
    interim = [
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
    ]

    def answer(head: bytes) -> tuple[Reply, bool]:
        final = partial(*asked_range(head))
        if together:
            return b"".join(interim) + final, True
        return [interim[0], 0.05, interim[1], 0.05, final], True

    server = raw_server(answer)
    m = mount_keys(mount, tmp_path, server, {"good": "/a.bin", "again": "/b.bin"})
    assert_good(m)
    assert_good(m, "again")  # the connection is still in step after the interim answers
    assert len(server.requests) == 2
    assert server.connections == 1


def test_endless_interim_answers_are_eio(
    mount: Callable[..., Mounted], tmp_path: Path, raw_server: Callable[..., RawServer]
) -> None:
    def answer(head: bytes) -> tuple[Reply, bool]:
        if path_of(head) == "/good.bin":
            return partial(*asked_range(head)), True
        return b"HTTP/1.1 103 Early Hints\r\n\r\n" * 50 + partial(*asked_range(head)), True

    server = raw_server(answer)
    m = mount_keys(mount, tmp_path, server, {"hints": "/hints.bin", "good": "/good.bin"})
    assert_eio(read(m.mountpoint / "hints"))
    assert_good(m)
    assert "interim" in m.log()


def test_a_101_is_eio(
    mount: Callable[..., Mounted], tmp_path: Path, raw_server: Callable[..., RawServer]
) -> None:
    def answer(head: bytes) -> tuple[Reply, bool]:
        if path_of(head) == "/good.bin":
            return partial(*asked_range(head)), True
        return b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n" + DATA[:LENGTH], True

    server = raw_server(answer)
    m = mount_keys(mount, tmp_path, server, {"switch": "/switch.bin", "good": "/good.bin"})
    assert_eio(read(m.mountpoint / "switch"))
    assert_good(m)


@pytest.mark.parametrize(
    ("length", "late"),
    [(LENGTH, True), (200_000, False)],
    ids=["written-later", "after-a-200KB-body-in-one-write"],
)
def test_an_answer_nobody_asked_for_never_answers_the_next_request(
    mount: Callable[..., Mounted],
    tmp_path: Path,
    raw_server: Callable[..., RawServer],
    length: int,
    late: bool,
) -> None:
    # After the right answer for the first key, the server sends another 206 for the
    # same range, which the second key (another path) asks next, filled with other bytes.
    def answer(head: bytes) -> tuple[Reply, bool]:
        first, last = asked_range(head)
        right = partial(first, last)
        if path_of(head) != "/first.bin":
            return right, True
        unasked = partial(first, last, OTHER)
        return ([right, 0.3, unasked] if late else right + unasked), True

    server = raw_server(answer)
    keys = {"first": "/first.bin", "second": "/second.bin"}
    m = mount_keys(mount, tmp_path, server, keys, length)
    assert_good(m, "first", length)
    time.sleep(1.0)  # the unasked answer has arrived
    assert_good(m, "second", length)
    assert [path_of(h) for h in server.requests] == ["/first.bin", "/second.bin"]
    assert server.connections == 2  # the first connection was closed, not used again


@pytest.mark.parametrize(
    "header",
    [
        b"Content-Length: \xb2",  # a superscript two in Latin-1: str.isdigit() says yes
        b"Content-Length: \xa04096",  # a no-break space before the number
        "Content-Length: \u0664\u0660\u0669\u0666".encode(),  # Arabic-Indic 4096, UTF-8
    ],
    ids=["superscript", "nbsp", "arabic-indic"],
)
def test_a_length_not_in_ascii_digits_is_a_protocol_error(
    mount: Callable[..., Mounted],
    tmp_path: Path,
    raw_server: Callable[..., RawServer],
    header: bytes,
) -> None:
    def answer(head: bytes) -> tuple[Reply, bool]:
        first, last = asked_range(head)
        if path_of(head) == "/good.bin":
            return partial(first, last), True
        head_lines = (
            f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {first}-{last}/{len(DATA)}\r\n"
        ).encode()
        return head_lines + header + b"\r\n\r\n" + DATA[first : last + 1], True

    server = raw_server(answer)
    m = mount_keys(mount, tmp_path, server, {"odd": "/odd.bin", "good": "/good.bin"})
    assert_eio(read(m.mountpoint / "odd"))
    log = m.log()
    assert "ProtocolError: Content-Length" in log, log[-2000:]
    assert "ValueError" not in log
    assert_good(m)

"""refmount's own HTTP/1.1 client for plain http:// ranges (refmount.fetch.http).

Reads go through the Fetcher (deadlines, retries, length checks) against real servers on
127.0.0.1: the range server with its fault modes, nginx, and for what no well-behaved
server does (closing a kept-alive connection unannounced, redirecting) a raw socket
server in this file.  The hostile answers (a 200 for a range, a long or short body, a
compressed one, an endless one) are in test_hostile_store.py and test_obstore.py, whose
http:// reads go through this client by default.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from refmount.errors import FetchError
from refmount.fetch import Fetcher, FetchPolicy, redirects
from refmount.fetch.http import HttpBackend
from refmount.fetch.http import backend as http_backend
from refmount.fetch.http.response import MAX_HEAD, ProtocolError, parse_head
from tests.support.nginx import NginxServer
from tests.support.rawserver import RawServer, asked_range, partial
from tests.support.servers import HOST, RangeServer

DATA = bytes((i * 131 + (i >> 8) * 17) % 251 for i in range(300_001))


def fetcher(**policy: float) -> Fetcher:
    settings = {"timeout": 3.0, "retries": 1, "backoff": 0.01, **policy}
    return Fetcher(policy=FetchPolicy(**settings))  # type: ignore[arg-type]


@pytest.fixture
def served(http: RangeServer, http_root: Path) -> str:
    (http_root / "client.bin").write_bytes(DATA)
    return f"{http.url}/client.bin"


# -- the head of an answer ------------------------------------------------------------------


def test_a_head_is_parsed_with_repeated_headers_joined() -> None:
    head = parse_head(
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 5-9/100\r\n"
        b"Content-Length: 5\r\nVary: a\r\nvary: b\r\nConnection: close"
    )
    assert head.status == 206
    assert head.content_range() == (5, 9, 100)
    assert head.content_length() == 5
    assert head.get("vary") == "a, b"
    assert not head.keeps_alive
    assert parse_head(b"HTTP/1.0 200 OK\r\nConnection: keep-alive").keeps_alive
    assert not parse_head(b"HTTP/1.0 200 OK").keeps_alive
    assert parse_head(b"HTTP/1.1 206 x\r\nContent-Range: bytes 0-0/*").content_range() == (
        0,
        0,
        None,
    )


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/2 200 OK",
        b"ICY 200 OK",
        b"HTTP/1.1 20 OK",
        b"HTTP/1.1 200 OK\r\nno colon here",
        b"HTTP/1.1 200 OK\r\nbad name: x",
        b"HTTP/1.1 200 OK\r\nX: a\nTransfer-Encoding: chunked",
        b"HTTP/1.1 200 OK\r\nX: a\rb",
        b"HTTP/1.1 200 OK\r\nX: a\x00b",
        b"HTTP/1.1 101 Switching Protocols",
    ],
)
def test_a_head_that_does_not_parse_is_a_protocol_error(head: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_head(head)


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("content-length", "12, 13"),
        ("content-length", "-1"),
        ("content-length", "1" * 20),
        ("content-range", "bytes 1-2"),
        ("content-range", "items 1-2/3"),
        ("content-length", "\xb2"),  # Latin-1 superscript two: isdigit(), not int()
        ("content-length", "\xa012"),  # a no-break space, which str.strip() takes away
        ("content-length", "12\x85"),  # Latin-1 NEL, another one
        ("content-range", "bytes 1-2/3\xa0"),
    ],
)
def test_lengths_and_ranges_that_are_not_numbers_are_refused(header: str, value: str) -> None:
    head = parse_head(f"HTTP/1.1 206 x\r\n{header}: {value}".encode("latin-1"))
    with pytest.raises(ProtocolError):
        head.content_length() if header == "content-length" else head.content_range()


# -- through the fetcher ------------------------------------------------------------------


def test_ranges_come_over_a_few_kept_alive_connections(served: str, http: RangeServer) -> None:
    reader = fetcher()
    spans = [(0, 10), (10, 70_000), (123_456, 123_457), (299_990, 300_001)] * 25

    async def main() -> HttpBackend:
        for start, end in spans:
            assert await reader.fetch(served, start, end) == DATA[start:end]
        # Read-ahead past the end: what there is, only when short answers are allowed.
        assert await reader.fetch(served, 299_000, 400_000, allow_short=True) == DATA[299_000:]
        with pytest.raises(FetchError):
            await reader.fetch(served, 299_000, 400_000)
        backend = reader._backend(served)
        assert isinstance(backend, HttpBackend)
        return backend

    backend = trio.run(main)
    ranges = [tuple(r[1:]) for r in http.stats()["ranges"]]
    assert ranges[: len(spans)] == spans
    assert backend.pool.opened == 1  # one reader in sequence: one connection, kept alive
    reader.close()


def test_many_readers_get_their_own_bytes(served: str) -> None:
    reader = fetcher()
    starts = list(range(0, 300_000, 7_919))

    async def main() -> None:
        async def one(start: int) -> None:
            end = min(start + 50_000, len(DATA))
            assert await reader.fetch(served, start, end) == DATA[start:end]

        async with trio.open_nursery() as nursery:
            for start in starts:
                nursery.start_soon(one, start)

    trio.run(main)
    backend = reader._backend(served)
    assert isinstance(backend, HttpBackend)
    assert 1 <= backend.pool.opened <= reader.policy.max_requests_per_host
    reader.close()


@pytest.mark.parametrize(("fault", "err"), [("403", errno.EACCES), ("404", errno.EIO)])
def test_refusals_are_their_errno_without_retries(
    served: str, http: RangeServer, fault: str, err: int
) -> None:
    reader = fetcher(retries=3)
    http.fault("/client.bin", fault, count=-1)
    with pytest.raises(FetchError) as caught:
        trio.run(reader.fetch, served, 0, 100)
    assert caught.value.errno == err
    assert http.stats()["requests"] == 1
    reader.close()


@pytest.mark.parametrize("fault", ["503", "reset", "truncate", "short"])
def test_a_transient_fault_is_retried_into_the_right_bytes(
    served: str, http: RangeServer, fault: str
) -> None:
    reader = fetcher(retries=2)
    http.fault("/client.bin", fault)
    assert trio.run(reader.fetch, served, 1_000, 200_000) == DATA[1_000:200_000]
    assert http.stats()["requests"] == 2
    assert reader.stats.retries == 1
    reader.close()


def test_a_stalled_server_meets_the_deadline_and_the_connection_is_dropped(
    served: str, http: RangeServer
) -> None:
    reader = fetcher(timeout=0.5, retries=1)
    http.fault("/client.bin", "stall", count=2)
    with pytest.raises(FetchError, match="no answer within"):
        trio.run(reader.fetch, served, 0, 100)
    # The stalled connections were closed, not pooled: the next read opens a new one.
    assert trio.run(reader.fetch, served, 0, 100) == DATA[:100]
    backend = reader._backend(served)
    assert isinstance(backend, HttpBackend)
    assert backend.pool.opened == 3
    reader.close()


def test_nginx_ranges_and_short_reads_at_the_end(nginx: NginxServer) -> None:
    (nginx.root / "client.bin").write_bytes(DATA)
    url = f"{nginx.url}/client.bin"
    reader = fetcher()

    async def main() -> None:
        for start in range(0, len(DATA), 65_536):
            end = start + 65_536
            got = await reader.fetch(url, start, end, allow_short=True)
            assert got == DATA[start:end]

    trio.run(main)
    reader.close()


# -- a server of this file: what well-behaved servers rarely do ----------------------------


def ranged_answer(head: bytes) -> bytes:
    return partial(*asked_range(head), DATA)


def test_a_kept_alive_connection_closed_unannounced_is_asked_again(
    raw_server: Callable[..., RawServer],
) -> None:
    # Each answer says nothing of closing, and the server closes after it anyway, as a
    # server does when an idle connection's time is up.
    server = raw_server(lambda head: (ranged_answer(head), False))
    url = f"http://{HOST}:{server.port}/x.bin"
    reader = fetcher(retries=0)

    async def main() -> None:
        for start in (0, 1_000, 2_000):
            assert await reader.fetch(url, start, start + 500) == DATA[start : start + 500]

    trio.run(main)
    assert len(server.requests) == 3  # each asked once: the resend is no retry
    assert server.connections == 3
    assert reader.stats.retries == 0
    reader.close()


def test_a_head_without_end_is_refused_at_its_bound(raw_server: Callable[..., RawServer]) -> None:
    server = raw_server(lambda head: (b"HTTP/1.1 206 x\r\nX: " + b"a" * MAX_HEAD, True))
    reader = fetcher(retries=0)
    with pytest.raises(FetchError, match="head longer than"):
        trio.run(reader.fetch, f"http://{HOST}:{server.port}/x.bin", 0, 10)
    reader.close()


def test_a_redirect_is_followed_by_the_fetcher_and_its_target_remembered(
    raw_server: Callable[..., RawServer], served: str, http: RangeServer
) -> None:
    """The first read is redirected and follows to the target through refmount's
    client; the next reads of the URL ask the target directly (a pre-signed URL is
    valid for a while), not the first host again."""
    server = raw_server(lambda head: (f"HTTP/1.1 302 Found\r\nLocation: {served}\r\n"
                                      "Content-Length: 0\r\n\r\n".encode(), True))  # fmt: skip
    url = f"http://{HOST}:{server.port}/moved.bin"
    reader = fetcher()

    async def main() -> None:
        for start in (0, 5_000, 250_000):
            assert await reader.fetch(url, start, start + 300) == DATA[start : start + 300]

    trio.run(main)
    assert isinstance(reader._backend(url), HttpBackend)
    assert len(server.requests) == 1
    assert http.stats()["requests"] == 3
    reader.close()


def test_a_remembered_target_that_fails_is_forgotten_and_the_redirect_asked_again(
    raw_server: Callable[..., RawServer],
) -> None:
    """A pre-signed URL revoked (403) before the expiry its query states: the read
    asks the first host again and reads where it now leads."""
    revoked: set[bytes] = set()

    def target(head: bytes) -> tuple[bytes, bool]:
        path = head.split(b" ")[1].split(b"?")[0]
        if path in revoked:
            return b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n", True
        return ranged_answer(head), True

    second = raw_server(target)
    leads_to = [b"/signed-1"]

    def first(head: bytes) -> tuple[bytes, bool]:
        location = f"http://{HOST}:{second.port}{leads_to[-1].decode()}?Expires=9999999999"
        reply = f"HTTP/1.1 307 Moved\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n"
        return reply.encode(), True

    server = raw_server(first)
    url = f"http://{HOST}:{server.port}/granule.nc"
    reader = fetcher(retries=0)

    async def main() -> None:
        assert await reader.fetch(url, 0, 100) == DATA[:100]
        assert await reader.fetch(url, 100, 200) == DATA[100:200]
        assert len(server.requests) == 1
        revoked.add(b"/signed-1")
        leads_to.append(b"/signed-2")
        assert await reader.fetch(url, 200, 300) == DATA[200:300]

    trio.run(main)
    assert len(server.requests) == 2
    asked = [h.split(b" ")[1].split(b"?")[0] for h in second.requests]
    assert asked == [b"/signed-1", b"/signed-1", b"/signed-1", b"/signed-2"]
    reader.close()


def test_how_long_a_presigned_url_is_valid() -> None:
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now - 100))
    sigv4 = f"https://b.s3.amazonaws.com/k?X-Amz-Date={stamp}&X-Amz-Expires=3600&X-Amz-Signature=s"
    assert 3400 < redirects.valid_for(sigv4) < 3500
    assert redirects.valid_for(f"https://d.cloudfront.net/k?Expires={int(now) + 3}") <= 0
    assert redirects.valid_for("https://mirror.example/k") == float("inf")
    assert redirects.valid_for("https://h/k?Expires=soon") == 0


def test_requests_carry_the_users_headers_and_never_compression(
    raw_server: Callable[..., RawServer],
) -> None:
    server = raw_server(lambda head: (ranged_answer(head), True))
    url = f"http://{HOST}:{server.port}/x.bin"
    reader = Fetcher(
        remote_options={
            "http": {"headers": {"Authorization": "Bearer t0k", "Accept-Encoding": "gzip"}}
        },
        policy=FetchPolicy(timeout=3.0, retries=0),
    )
    assert trio.run(reader.fetch, url, 10, 20) == DATA[10:20]
    lines = server.requests[0].lower().split(b"\r\n")
    assert b"authorization: bearer t0k" in lines
    assert b"accept-encoding: identity" in lines
    assert b"accept-encoding: gzip" not in lines
    assert b"range: bytes=10-19" in lines
    reader.close()


@pytest.mark.parametrize(
    ("header", "why"),
    [({"X-Token": "a\r\nHost: elsewhere"}, "not a header line"), ({"X-Name": "\u2603"}, "Latin-1")],
)
def test_a_header_that_cannot_be_sent_as_given_is_refused(header: dict[str, str], why: str) -> None:
    reader = Fetcher(
        remote_options={"http": {"headers": header}},
        policy=FetchPolicy(timeout=3.0, retries=0),
    )
    with pytest.raises(FetchError, match=why):
        trio.run(reader.fetch, f"http://{HOST}:9/x.bin", 0, 10)
    reader.close()


def test_urls_the_client_leaves_to_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    target = http_backend._target
    target.cache_clear()
    assert target("http://h:8080/a/b.nc", "http")[:3] == ("h", 8080, b"/a/b.nc")
    assert target("https://h/a/b.nc", "https") == ("h", 443, b"/a/b.nc", "h")
    # a pre-signed URL's query is sent as written; a fragment never is
    assert target("http://h/a?sig=1&x=%2F", "http")[2] == b"/a?sig=1&x=%2F"
    assert target("http://h/a#f", "http")[2] == b"/a"
    for url in (
        "http://u:p@h/a",
        "https://h/a",
        "http://h/a b",
    ):
        assert target(url, "http") is None, url
    monkeypatch.setenv("http_proxy", "http://proxy.example:3128")
    monkeypatch.setenv("no_proxy", "near.example")
    target.cache_clear()
    assert target("http://far.example/a", "http") is None
    assert target("http://near.example/a", "http") is not None
    target.cache_clear()

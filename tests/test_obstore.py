"""Remote byte ranges through obstore: options translation, bytes, faults, bounds, a mount.

Reads go through refmount's Fetcher (deadlines, retries, length checks) against real
servers on 127.0.0.1: the range server with its fault modes, moto's S3, and for answers
no well-behaved server gives (a 206 whose body runs on past the range) a raw socket
server in this file.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from refmount.errors import FetchError
from refmount.fetch import Fetcher, FetchPolicy
from refmount.fetch.fsspec_backend import FsspecBackend
from refmount.fetch.http import HttpBackend
from refmount.fetch.http.aws_credentials import CredentialChain
from refmount.fetch.obstore_backend import ObstoreBackend, make_backend
from refmount.fetch.obstore_options import Untranslatable, translate
from tests.conftest import Mounted
from tests.support.servers import HOST, MotoServer, RangeServer

MiB = 1 << 20


def payload(size: int, seed: int) -> bytes:
    """Deterministic bytes that differ from offset to offset."""
    return bytes((i * 131 + seed * 7 + (i >> 8) * 17) % 251 for i in range(size))


def quick_fetcher(**options: Any) -> Fetcher:
    policy = FetchPolicy(timeout=options.pop("timeout", 3.0), retries=1, backoff=0.01)
    return Fetcher(remote_options=options.pop("remote_options", {}), policy=policy, **options)


@pytest.fixture
def served(http: RangeServer, http_root: Path, request: pytest.FixtureRequest) -> tuple[str, bytes]:
    """A file of 300,001 bytes on the range server: (its URL, its bytes)."""
    data = payload(300_001, 5)
    name = re.sub(r"\W", "_", request.node.name) + ".bin"
    (http_root / name).write_bytes(data)
    return f"{http.url}/{name}", data


# -- options ------------------------------------------------------------------------------


def test_s3_options_translate(s3_server: MotoServer) -> None:
    store = translate(
        "s3", {**s3_server.storage_options, "config_kwargs": {"max_pool_connections": 32}}
    )
    assert store.kind == "s3"
    assert store.config == {
        "access_key_id": "testing",
        "secret_access_key": "testing",
        "endpoint": s3_server.endpoint,
        "region": "us-east-1",
    }
    assert store.client_options["allow_http"] is True  # moto's endpoint is plain http
    anon = translate("s3", {"anon": True, "region": "eu-west-1", "token": "t", "use_ssl": False})
    assert anon.config == {"skip_signature": True, "region": "eu-west-1", "session_token": "t"}
    assert anon.client_options["allow_http"] is True


def test_other_stores_options_translate(tmp_path: Path) -> None:
    http = translate("https", {"headers": {"Authorization": "Bearer x"}, "block_size": 0})
    identity = {"Accept-Encoding": "identity"}
    assert http.client_options["default_headers"] == {"Authorization": "Bearer x", **identity}
    kw = translate(
        "http",
        {
            "client_kwargs": {"headers": {"A": "1"}},
            "headers": {"B": "2", "accept-encoding": "gzip"},
        },
    )
    assert kw.client_options["default_headers"] == {"A": "1", "B": "2", **identity}
    key_file = tmp_path / "sa.json"
    key_file.write_text("{}")
    assert translate("gs", {"token": str(key_file)}).config == {"service_account": str(key_file)}
    assert translate("gcs", {"token": "anon"}).config == {"skip_signature": True}
    assert translate("gs", {"token": {"type": "service_account"}}).config == {
        "service_account_key": '{"type": "service_account"}'
    }
    azure = translate(
        "abfs",
        {"connection_string": "DefaultEndpointsProtocol=http;AccountName=acc;AccountKey=k1;"
         f"BlobEndpoint=http://{HOST}:10000/acc"},
    )  # fmt: skip
    assert azure.config == {
        "account_name": "acc",
        "account_key": "k1",
        "endpoint": f"http://{HOST}:10000/acc",
    }
    assert azure.client_options["allow_http"] is True
    sas = translate("az", {"account_name": "acc", "sas_token": "sv=1&sig=2"})
    assert sas.config == {"account_name": "acc", "sas_key": "sv=1&sig=2"}
    bearer = translate("gs", {"token": "ya29.access", "endpoint_url": f"http://{HOST}:1"})
    assert (bearer.bearer_token, bearer.config) == ("ya29.access", {"base_url": f"http://{HOST}:1"})
    hosted = translate("az", {"account_name": "acc", "account_host": "acc.blob.example.org"})
    assert hosted.config == {"account_name": "acc", "endpoint": "https://acc.blob.example.org"}


@pytest.mark.parametrize(
    ("protocol", "options", "named"),
    [
        ("s3", {"client_kwargs": {"verify": False}, "region": "us-east-1"}, "client_kwargs.verify"),
        ("s3", {"anon": True}, "no region"),  # AWS itself: s3fs finds a bucket's region
        ("https", {"client_kwargs": {"auth": "x"}}, "client_kwargs.auth"),
        ("gs", {"token": "cloud"}, "token='cloud'"),
        ("az", {"account_name": "a", "credential": object()}, "credential"),
    ],
)
def test_untranslatable_options_keep_the_protocol_on_fsspec(
    protocol: str,
    options: dict[str, Any],
    named: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(Untranslatable, match=re.escape(named)):
        translate(protocol, options)
    with caplog.at_level(logging.INFO, logger="refmount.fetch.obstore_backend"):
        backend = make_backend(protocol, options)
    assert isinstance(backend, FsspecBackend)
    assert f"{protocol}: byte ranges through fsspec: obstore has no equivalent for" in caplog.text
    assert named in caplog.text


def test_an_aws_profile_is_signed_by_refmounts_client_with_fsspec_for_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    options = {"profile": "work", "region": "us-east-1"}
    config = translate("s3", options)
    assert config.aws_profile == "work"
    assert config.obstore_gap == "credentials from the AWS profile 'work'"
    with caplog.at_level(logging.INFO, logger="refmount.fetch.obstore_backend"):
        backend = make_backend("s3", options)
        assert isinstance(make_backend("s3", options, "obstore"), FsspecBackend)
    assert isinstance(backend, HttpBackend) and backend.s3 is not None
    assert isinstance(backend.s3.credentials, CredentialChain)
    assert backend.s3.credentials.profile == "work"
    assert isinstance(backend.fallback, FsspecBackend)
    assert backend.fallback.options["profile"] == "work"  # s3fs finds the same credentials
    assert "s3: obstore has no equivalent for credentials from the AWS profile 'work'" in (
        caplog.text
    )


def test_backend_choice(s3_server: MotoServer) -> None:
    assert isinstance(make_backend("http", {}), HttpBackend)
    assert isinstance(make_backend("http", {}, "obstore"), ObstoreBackend)
    assert isinstance(make_backend("https", {}), HttpBackend)
    assert isinstance(make_backend("https", {}, "obstore"), ObstoreBackend)
    s3 = make_backend("s3", s3_server.storage_options)
    assert isinstance(s3, HttpBackend) and s3.s3 is not None
    assert isinstance(make_backend("s3", s3_server.storage_options, "obstore"), ObstoreBackend)
    # No key given: refmount's client signs with what botocore's chain finds, obstore
    # (which looks for its own) does the rest.
    chained = make_backend("s3", {"endpoint_url": s3_server.endpoint})
    assert isinstance(chained, HttpBackend) and isinstance(chained.fallback, ObstoreBackend)
    assert chained.s3 is not None and isinstance(chained.s3.credentials, CredentialChain)
    assert isinstance(make_backend("https", {}, "fsspec"), FsspecBackend)
    assert isinstance(make_backend("ftp", {}), FsspecBackend)


# -- HTTP through the fetcher -------------------------------------------------------------


def test_http_ranges_and_size(
    served: tuple[str, bytes], http: RangeServer, caplog: pytest.LogCaptureFixture
) -> None:
    url, data = served
    fetcher = quick_fetcher()

    async def main() -> None:
        for start, end in [(0, 10), (10, 70_000), (123_456, 123_457), (299_990, 300_001)]:
            assert await fetcher.fetch(url, start, end) == data[start:end]
        # Read-ahead past the end: the rest of the file, only when short answers are allowed.
        assert await fetcher.fetch(url, 299_000, 400_000, allow_short=True) == data[299_000:]
        with pytest.raises(FetchError):
            await fetcher.fetch(url, 299_000, 400_000)
        assert await fetcher.size(url) == len(data)

    with caplog.at_level(logging.INFO, logger="refmount.fetch.obstore_backend"):
        trio.run(main)
    assert f"{http.url}: byte ranges through obstore" in caplog.text
    ranges = http.stats()["ranges"]
    assert [r[1:] for r in ranges[:4]] == [
        [0, 10],
        [10, 70_000],
        [123_456, 123_457],
        [299_990, 300_001],
    ]
    fetcher.close()


def test_an_url_with_a_query_goes_through_fsspec(served: tuple[str, bytes]) -> None:
    url, data = served
    fetcher = quick_fetcher()
    assert trio.run(fetcher.fetch, url + "?token=abc", 5, 50) == data[5:50]


@pytest.mark.parametrize(
    "mode", ["ignore-range", "truncate", "short", "500", "503", "reset", "stall"]
)
def test_a_transient_fault_is_retried_into_the_right_bytes(
    served: tuple[str, bytes], http: RangeServer, mode: str
) -> None:
    url, data = served
    fetcher = quick_fetcher(timeout=1.0)
    http.fault("*", mode, count=1)
    assert trio.run(fetcher.fetch, url, 1000, 200_000) == data[1000:200_000]
    assert fetcher.stats.retries == 1
    assert http.stats()["faults_left"] == []


@pytest.mark.parametrize(
    ("mode", "err", "attempts"),
    [
        ("404", errno.EIO, 1),  # a missing target is EIO: ENOENT would mean "no such key"
        ("403", errno.EACCES, 1),
        ("500", errno.EIO, 2),
        ("ignore-range", errno.EIO, 2),
        ("truncate", errno.EIO, 2),
        ("short", errno.EIO, 2),
        ("reset", errno.EIO, 2),
    ],
)
def test_a_lasting_fault_ends_in_its_errno(
    served: tuple[str, bytes], http: RangeServer, mode: str, err: int, attempts: int
) -> None:
    url, _ = served
    fetcher = quick_fetcher()
    http.fault("*", mode, count=-1)
    with pytest.raises(FetchError) as failed:
        trio.run(fetcher.fetch, url, 1000, 200_000)
    assert failed.value.errno == err
    assert http.stats()["requests"] == attempts
    assert "Debug source" not in str(failed.value)  # one line, not obstore's dump


def test_missing_target_size_is_eio(http: RangeServer) -> None:
    fetcher = quick_fetcher()
    with pytest.raises(FetchError) as failed:
        trio.run(fetcher.size, f"{http.url}/no/such/file.bin")
    assert failed.value.errno == errno.EIO


def test_the_deadline_stops_the_request(served: tuple[str, bytes], http: RangeServer) -> None:
    """A stalled request cancelled by the fetcher's deadline is gone from the server too:
    the connection is closed, not left waiting in a thread."""
    url, _ = served
    fetcher = Fetcher(policy=FetchPolicy(timeout=0.5, retries=0))
    http.fault("*", "stall", count=-1)
    with pytest.raises(FetchError, match=re.escape("no answer within 0.5 s")):
        trio.run(fetcher.fetch, url, 0, 100)
    deadline = time.monotonic() + 10
    while True:
        http.reset_stats()  # max_inflight restarts from what is in flight now
        if http.stats()["max_inflight"] == 0:
            break
        assert time.monotonic() < deadline, "the stalled request is still open"
        time.sleep(0.1)


# -- S3 through the fetcher ---------------------------------------------------------------


def test_s3_ranges_size_and_missing(
    s3_server: MotoServer, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = f"obstore-{os.getpid()}"
    s3_server.make_bucket(bucket)
    data = payload(250_000, 7)
    s3_server.put(bucket, "dir/data.bin", data)
    fetcher = quick_fetcher(remote_options={"s3": s3_server.storage_options})

    async def main() -> None:
        url = f"s3://{bucket}/dir/data.bin"
        for start, end in [(0, 1000), (100_000, 165_536), (249_999, 250_000)]:
            assert await fetcher.fetch(url, start, end) == data[start:end]
        assert await fetcher.size(url) == len(data)
        for missing in (f"s3://{bucket}/nope.bin", f"s3://no-such-bucket-{os.getpid()}/x"):
            with pytest.raises(FetchError) as failed:
                await fetcher.fetch(missing, 0, 10)
            assert failed.value.errno == errno.EIO

    with caplog.at_level(logging.INFO, logger="refmount.fetch.obstore_backend"):
        trio.run(main)
    assert f"s3://{bucket}: byte ranges through obstore" in caplog.text


# -- bounds -------------------------------------------------------------------------------


OK_SIZE = 1234


class HostileServer:
    """Answers a ranged GET in the way ``mode`` names, up to ``cap`` body bytes per
    connection (every body byte is 0xAB):

    ``endless``      a 206 with the asked Content-Range, then a chunked body without end
    ``too-long``     a 206 with the asked Content-Range and a Content-Length of ``cap``
    ``gzip``         a 206 with the asked Content-Range and length, ``Content-Encoding: gzip``
    ``whole-200``    a 200 (Range ignored) with a Content-Length of ``cap``
    ``long-at-end``  a 206 saying the object ends 10 bytes after the asked start, with a
                     body one byte longer than that

    Paths under ``/ok/`` get exactly their range, a GET without a range ``OK_SIZE``
    bytes, a HEAD a 405.  Keeps the request heads it received."""

    def __init__(self, mode: str, cap: int = 1 << 30) -> None:
        self.mode = mode
        self.cap = cap
        self.heads: list[str] = []
        self.sent: list[int] = []
        self._sock = socket.socket()
        self._sock.bind((HOST, 0))
        self._sock.listen(16)
        self.url = f"http://{HOST}:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                piece = conn.recv(65536)
                if not piece:
                    return
                head += piece
            text = head.decode(errors="replace")
            self.heads.append(text)
            status, fields, length = self._plan(text)
            sent = 0
            try:
                conn.sendall((f"HTTP/1.1 {status}\r\n" + "".join(f"{f}\r\n" for f in fields)
                              + "\r\n").encode())  # fmt: skip
                while sent < length:
                    block = b"\xab" * min(MiB, length - sent)
                    if "Transfer-Encoding: chunked" in fields:
                        block = b"%x\r\n%s\r\n" % (len(block), block)
                    conn.sendall(block)
                    sent += min(MiB, length - sent)
            except OSError:
                pass
            self.sent.append(sent)

    def _plan(self, text: str) -> tuple[str, list[str], int]:
        """(status line, header fields, body bytes to send) for one request."""
        if text.startswith("HEAD "):
            return "405 Method Not Allowed", ["Content-Length: 0"], 0
        if self.mode == "whole-200" and not text.startswith("GET /ok/"):
            return "200 OK", [f"Content-Length: {self.cap}"], self.cap
        match = re.search(r"(?im)^range: bytes=(\d+)-(\d+)", text)
        if match is None:  # the whole object
            return "200 OK", [f"Content-Length: {OK_SIZE}"], OK_SIZE
        start, last = int(match.group(1)), int(match.group(2))
        asked = f"Content-Range: bytes {start}-{last}/{1 << 40}"
        if text.startswith("GET /ok/"):  # an object of OK_SIZE bytes
            last = min(last, OK_SIZE - 1)
            length = last - start + 1
            fields = [f"Content-Range: bytes {start}-{last}/{OK_SIZE}", f"Content-Length: {length}"]
            return "206 Partial Content", fields, length
        if self.mode == "endless":
            return "206 Partial Content", [asked, "Transfer-Encoding: chunked"], self.cap
        if self.mode == "gzip":
            length = last - start + 1
            return "206 Partial Content", [
                asked, f"Content-Length: {length}", "Content-Encoding: gzip"
            ], length  # fmt: skip
        if self.mode == "long-at-end":
            at_end = f"Content-Range: bytes {start}-{start + 9}/{start + 10}"
            return "206 Partial Content", [at_end, "Content-Length: 11"], 11
        return "206 Partial Content", [asked, f"Content-Length: {self.cap}"], self.cap


@pytest.fixture(params=["endless", "too-long"])
def hostile(request: pytest.FixtureRequest) -> Iterator[HostileServer]:
    server = HostileServer(request.param)
    yield server
    server.close()


PEAK_CHILD = """
import sys, trio
from refmount.errors import FetchError
from refmount.fetch import Fetcher, FetchPolicy

def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

warm_url, url, start, end = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
fetcher = Fetcher(policy=FetchPolicy(timeout=20, retries=1, backoff=0.01))
async def main():
    # Warm up on a good answer: obstore imported, its runtime and connections started.
    assert await fetcher.fetch(warm_url, 0, 1)
    before = peak()
    try:
        await fetcher.fetch(url, start, end)
        result = "data"
    except FetchError as exc:
        result = "EIO" if exc.errno == 5 else str(exc.errno)
    print(result, before, peak(), fetcher.stats.requests)
trio.run(main)
fetcher.close()  # as the daemon does: lets obstore's threads settle before exiting
"""


def peak_growth(warm_url: str, url: str, start: int, end: int) -> tuple[str, int, int]:
    """(outcome, growth of the peak RSS in bytes, requests) of one fetch in a child, after
    a warm-up fetch of ``warm_url``."""
    child = subprocess.run(
        [sys.executable, "-c", PEAK_CHILD, warm_url, url, str(start), str(end)],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    outcome, before, after, requests = child.stdout.split()
    return outcome, int(after) - int(before), int(requests)


def test_a_body_past_the_range_costs_at_most_the_asked_length(hostile: HostileServer) -> None:
    want = 8 * MiB
    outcome, growth, requests = peak_growth(
        f"{hostile.url}/ok/warm.bin", f"{hostile.url}/big.bin", 1000, 1000 + want
    )
    assert outcome == "EIO"
    assert requests == 3  # the warm-up, then two attempts at the range
    # Held: the asked length plus a network read in Rust, and once as Python bytes.
    assert growth < 2 * want + 32 * MiB, growth
    # The server was cut off long before its 1 GiB: each answer was dropped at the range.
    assert hostile.sent and max(hostile.sent) < 256 * MiB, hostile.sent
    assert all("\r\naccept-encoding: identity\r\n" in head.lower() for head in hostile.heads)


def test_compressed_wrong_length_and_whole_answers() -> None:
    """A compressed range is no range; a body longer than its Content-Range says is no
    short file; a 200 (the whole object) gives the first bytes of a range from byte 0,
    reading no more of its 1 GiB than that, and nothing for a range further on."""
    servers = {mode: HostileServer(mode) for mode in ("gzip", "long-at-end", "whole-200")}
    fetcher = quick_fetcher()

    async def main() -> None:
        for mode, start, end, short in [
            ("gzip", 1000, 2000, False),
            ("long-at-end", 1000, 100_000, True),
            ("whole-200", 1000, 5000, False),
        ]:
            with pytest.raises(FetchError) as failed:
                await fetcher.fetch(f"{servers[mode].url}/x.bin", start, end, allow_short=short)
            assert failed.value.errno == errno.EIO, mode
        whole = f"{servers['whole-200'].url}/x.bin"
        assert await fetcher.fetch(whole, 0, 5000) == b"\xab" * 5000

    try:
        trio.run(main)
    finally:
        for server in servers.values():
            server.close()
    assert max(servers["whole-200"].sent) < 256 * MiB


def test_a_size_head_cannot_give_is_asked_through_fsspec() -> None:
    """object_store takes a size only from a HEAD with a Content-Length; fsspec also
    tries a GET, so a server refusing HEAD still gets its files' sizes asked."""
    server = HostileServer("too-long")
    try:
        assert trio.run(quick_fetcher().size, f"{server.url}/ok/a.bin") == OK_SIZE
    finally:
        server.close()
    methods = [head.split(" ", 1)[0] for head in server.heads]
    assert methods == ["HEAD", "HEAD", "GET"]  # obstore's HEAD, fsspec's HEAD, its GET


def test_ignore_range_on_a_big_file_costs_nothing(http: RangeServer, http_root: Path) -> None:
    big = http_root / "obstore-big.bin"
    with big.open("wb") as f:
        f.truncate(512 * MiB)  # sparse: the server sends 512 MiB of zeros if it can
    (http_root / "obstore-warm.bin").write_bytes(b"w")
    http.fault("/obstore-big.bin", "ignore-range", count=-1)
    want = 8 * MiB
    outcome, growth, _ = peak_growth(
        f"{http.url}/obstore-warm.bin", f"{http.url}/obstore-big.bin", MiB, MiB + want
    )
    assert outcome == "EIO"
    assert growth < 2 * want + 32 * MiB, growth


def test_without_obstore_fsspec_reads(served: tuple[str, bytes]) -> None:
    url, data = served
    child = """
import sys
sys.modules["obstore"] = None  # as if not installed
import logging, trio
logging.basicConfig(level=logging.INFO)
from refmount.fetch import Fetcher
fetcher = Fetcher()
sys.stdout.buffer.write(trio.run(fetcher.fetch, sys.argv[1], 10, 20))
"""
    result = subprocess.run(
        [sys.executable, "-c", child, url],
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == data[10:20]
    assert b"http: byte ranges through fsspec: obstore is not installed" in result.stderr
    assert b"through obstore" not in result.stderr


# -- a real mount -------------------------------------------------------------------------


def mount_http_and_s3(
    mount: Callable[..., Mounted],
    http: RangeServer,
    http_root: Path,
    s3_server: MotoServer,
    tmp_path: Path,
    *args: str,
) -> tuple[Mounted, dict[str, bytes], str]:
    data = payload(400_000, 9)
    (http_root / "obstore-mount.bin").write_bytes(data)
    bucket = f"obstore-mount-{os.getpid()}-{len(args)}"
    s3_server.make_bucket(bucket)
    s3_server.put(bucket, "k/data.bin", data)
    refs = {
        "version": 1,
        "refs": {
            "h/range": [f"{http.url}/obstore-mount.bin", 1234, 300_000],
            "h/whole": [f"{http.url}/obstore-mount.bin"],
            "h/gone": [f"{http.url}/obstore-gone.bin", 0, 100],
            "s/range": [f"s3://{bucket}/k/data.bin", 77, 200_000],
            "s/whole": [f"s3://{bucket}/k/data.bin"],
        },
    }
    path = tmp_path / "refs.json"
    path.write_text(json.dumps(refs))
    options = json.dumps({"s3": s3_server.storage_options})
    m = mount(path, "--remote-options", options, "--retries", "1", *args)
    expected = {
        "h/range": data[1234:301_234],
        "h/whole": data,
        "s/range": data[77:200_077],
        "s/whole": data,
    }
    return m, expected, bucket


def cat(path: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["cat", str(path)], capture_output=True, timeout=60)


@pytest.mark.parametrize("backend", ["auto", "obstore", "fsspec"])
def test_cat_through_a_mount(
    mount: Callable[..., Mounted],
    http: RangeServer,
    http_root: Path,
    s3_server: MotoServer,
    tmp_path: Path,
    backend: str,
) -> None:
    m, expected, bucket = mount_http_and_s3(
        mount, http, http_root, s3_server, tmp_path, "--fetch-backend", backend
    )
    for key, data in expected.items():
        result = cat(m.mountpoint / key)
        assert result.returncode == 0, (key, result.stderr)
        assert result.stdout == data, key
    gone = cat(m.mountpoint / "h" / "gone")
    assert gone.returncode != 0
    if backend != "fsspec":  # the fsspec path's errno for a 404 is the fetcher's to decide
        assert b"Input/output error" in gone.stderr
    assert cat(m.mountpoint / "s" / "range").stdout == expected["s/range"]  # still serving
    log = m.log()
    s3_line = f"s3://{bucket}: byte ranges through obstore"
    assert (s3_line in log) == (backend != "fsspec")
    own_line = f"{http.url}: byte ranges through refmount's HTTP client"
    assert (own_line in log) == (backend == "auto")
    if backend == "obstore":
        assert f"{http.url}: byte ranges through obstore" in log

"""The test servers themselves: a wrong test server would make every other test lie."""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.support.servers import MotoServer, RangeServer, free_port

BIG = 3 * (1 << 20) + 123  # more than one 1 MiB streaming piece
TIMEOUT = 10.0


@dataclass
class Served:
    server: RangeServer
    root: Path
    data: bytes
    small: bytes

    @property
    def size(self) -> int:
        return len(self.data)

    def url(self, path: str = "/data.bin") -> str:
        return self.server.url + path


@pytest.fixture(scope="module")
def _module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("rangeserver")
    root = base / "root"
    (root / "sub").mkdir(parents=True)
    data = os.urandom(BIG)
    small = b"hello, ranges\n"
    (root / "data.bin").write_bytes(data)
    (root / "small.txt").write_bytes(small)
    (root / "empty.bin").write_bytes(b"")
    (root / "sub" / "nested.bin").write_bytes(b"nested")
    (base / "secret.txt").write_bytes(b"outside the root")
    (root / "escape.txt").symlink_to(base / "secret.txt")
    with RangeServer(root) as server:
        yield Served(server, root, data, small)
        assert "Traceback" not in server.log_text(), server.log_text()


@pytest.fixture
def served(_module_server: Served) -> Served:
    """The shared server with no faults and fresh statistics."""
    _module_server.server.clear_faults()
    _module_server.server.reset_stats()
    return _module_server


def get(url: str, range_: str | None = None, timeout: float = TIMEOUT) -> requests.Response:
    headers = {} if range_ is None else {"Range": range_}
    return requests.get(url, headers=headers, timeout=timeout)


def raw_request(
    served: Served, method: str, path: str, headers: dict[str, str] | None = None
) -> http.client.HTTPResponse:
    """A request whose path is sent byte for byte (requests would normalise "..")."""
    port = served.server.port
    assert port is not None
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    conn.request(method, path, headers=headers or {})
    return conn.getresponse()


# ---- ranges ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "start", "end"),
    [
        ("bytes=0-9", 0, 10),
        ("bytes=10-10", 10, 11),
        ("bytes=1000-", 1000, BIG),
        ("bytes=-50", BIG - 50, BIG),
        ("bytes=5-999999999", 5, BIG),  # last byte past the end is clamped
        ("bytes=-999999999", 0, BIG),  # suffix longer than the file is the whole file
        ("bytes=1000-2621439", 1000, 2621440),  # several streamed pieces
    ],
)
def test_range_forms(served: Served, header: str, start: int, end: int) -> None:
    resp = get(served.url(), header)
    assert resp.status_code == 206
    assert resp.headers["Content-Range"] == f"bytes {start}-{end - 1}/{served.size}"
    assert int(resp.headers["Content-Length"]) == end - start
    assert resp.content == served.data[start:end]


def test_no_range_is_whole_file(served: Served) -> None:
    resp = get(served.url())
    assert resp.status_code == 200
    assert resp.headers["Accept-Ranges"] == "bytes"
    assert int(resp.headers["Content-Length"]) == served.size
    assert "Content-Range" not in resp.headers
    assert resp.content == served.data


@pytest.mark.parametrize("header", ["bytes=9-3", "items=0-5", "bytes=0-1,5-6", "bytes=-"])
def test_malformed_or_multi_range_is_ignored(served: Served, header: str) -> None:
    resp = get(served.url("/small.txt"), header)
    assert resp.status_code == 200
    assert resp.content == served.small


@pytest.mark.parametrize(
    ("path", "header"),
    [
        ("/data.bin", f"bytes={BIG}-"),
        ("/data.bin", f"bytes={BIG + 5}-{BIG + 10}"),
        ("/data.bin", "bytes=-0"),
        ("/empty.bin", "bytes=0-0"),
        ("/empty.bin", "bytes=-5"),
    ],
)
def test_unsatisfiable_range_is_416(served: Served, path: str, header: str) -> None:
    resp = get(served.url(path), header)
    size = (served.root / path.lstrip("/")).stat().st_size
    assert resp.status_code == 416
    assert resp.headers["Content-Range"] == f"bytes */{size}"


def test_head(served: Served) -> None:
    resp = requests.head(served.url(), timeout=TIMEOUT)
    assert resp.status_code == 200
    assert int(resp.headers["Content-Length"]) == served.size
    assert resp.headers["Accept-Ranges"] == "bytes"
    assert resp.content == b""


@pytest.mark.parametrize("path", ["/missing.bin", "/sub", "/sub/", "/", "/sub/missing"])
def test_missing_is_404(served: Served, path: str) -> None:
    assert get(served.url(path)).status_code == 404
    assert requests.head(served.url(path), timeout=TIMEOUT).status_code == 404


def test_nested_file(served: Served) -> None:
    resp = get(served.url("/sub/nested.bin"), "bytes=1-3")
    assert (resp.status_code, resp.content) == (206, b"est")


@pytest.mark.parametrize(
    "path",
    [
        "/../secret.txt",
        "/sub/../../secret.txt",
        "/%2e%2e/secret.txt",
        "/..%2fsecret.txt",
        "/escape.txt",  # a symlink pointing out of the root
    ],
)
def test_path_traversal_is_refused(served: Served, path: str) -> None:
    resp = raw_request(served, "GET", path)
    assert resp.status == 404
    assert b"outside" not in resp.read()


def test_fsspec_http_reads_ranges(served: Served) -> None:
    """The client refmount uses agrees with the server."""
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    assert fs.cat_file(served.url(), start=7, end=70_000) == served.data[7:70_000]
    assert fs.size(served.url()) == served.size


# ---- faults ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["503", "500", "429", "403", "404"])
def test_status_faults_hit_count_requests(served: Served, mode: str) -> None:
    served.server.fault("/data.bin", mode, count=2)
    assert get(served.url("/small.txt")).status_code == 200  # other paths unaffected
    assert get(served.url(), "bytes=0-9").status_code == int(mode)
    assert requests.head(served.url(), timeout=TIMEOUT).status_code == int(mode)
    resp = get(served.url(), "bytes=0-9")
    assert (resp.status_code, resp.content) == (206, served.data[:10])
    assert served.server.stats()["faults_left"] == []


def test_fault_forever_until_cleared(served: Served) -> None:
    served.server.fault("*", "503", count=-1)
    for path in ("/data.bin", "/small.txt", "/data.bin"):
        assert get(served.url(path)).status_code == 503
    assert served.server.stats()["faults_left"][0]["count"] == -1
    served.server.clear_faults()
    assert get(served.url("/small.txt")).status_code == 200


def test_rules_are_checked_in_order(served: Served) -> None:
    served.server.fault("/data.bin", "500")
    served.server.fault("*", "503")
    assert get(served.url("/small.txt")).status_code == 503  # first rule does not match
    assert get(served.url()).status_code == 500
    assert get(served.url()).status_code == 200


def test_fault_limited_to_a_method(served: Served) -> None:
    served.server.fault("/data.bin", "503", method="GET")
    assert requests.head(served.url(), timeout=TIMEOUT).status_code == 200
    assert get(served.url(), "bytes=0-0").status_code == 503


def test_unknown_fault_mode_is_rejected(served: Served) -> None:
    with pytest.raises(Exception, match="400"):
        served.server.fault("*", "explode")


def test_stall_holds_only_the_faulted_request(served: Served) -> None:
    served.server.fault("/data.bin", "stall")
    outcome: dict[str, object] = {}

    def stalled() -> None:
        started = time.monotonic()
        try:
            get(served.url(), "bytes=0-9", timeout=1.0)
            outcome["result"] = "answered"
        except requests.Timeout:
            outcome["result"] = "timeout"
        outcome["elapsed"] = time.monotonic() - started

    thread = threading.Thread(target=stalled)
    thread.start()
    time.sleep(0.2)  # let the stalled request reach the server first
    resp = get(served.url(), "bytes=0-9")
    assert resp.status_code == 206 and resp.content == served.data[:10]
    # Answered beside the stalled request, not after it: counted, not timed.
    assert served.server.stats()["max_inflight"] >= 2
    thread.join(5)
    assert outcome["result"] == "timeout"
    assert outcome["elapsed"] >= 0.9


@pytest.mark.parametrize(
    ("header", "start", "end"), [(None, 0, BIG), ("bytes=100-10099", 100, 10100)]
)
def test_truncate_sends_half_then_closes(
    served: Served, header: str | None, start: int, end: int
) -> None:
    served.server.fault("/data.bin", "truncate")
    resp = raw_request(served, "GET", "/data.bin", {"Range": header} if header else {})
    assert resp.status == (200 if header is None else 206)
    assert int(resp.headers["Content-Length"]) == end - start
    with pytest.raises(http.client.IncompleteRead) as excinfo:
        resp.read()
    half = (end - start) // 2
    assert excinfo.value.partial == served.data[start : start + half]


def test_short_answers_one_byte_less_consistently(served: Served) -> None:
    served.server.fault("/data.bin", "short")
    resp = get(served.url(), "bytes=100-199")
    assert resp.status_code == 206
    assert int(resp.headers["Content-Length"]) == 99
    assert resp.headers["Content-Range"] == f"bytes 100-198/{served.size}"
    assert resp.content == served.data[100:199]


def test_ignore_range_sends_whole_file(served: Served) -> None:
    served.server.fault("/data.bin", "ignore-range")
    resp = get(served.url(), "bytes=10-19")
    assert resp.status_code == 200
    assert "Content-Range" not in resp.headers
    assert resp.content == served.data


def test_reset_aborts_without_response(served: Served) -> None:
    served.server.fault("/data.bin", "reset", count=2)
    with pytest.raises(requests.ConnectionError):
        get(served.url(), "bytes=0-9")
    with pytest.raises((ConnectionResetError, http.client.RemoteDisconnected)):
        raw_request(served, "GET", "/data.bin")
    assert get(served.url(), "bytes=0-9").content == served.data[:10]


# ---- statistics -----------------------------------------------------------------------


def test_stats_record_data_requests_only(served: Served) -> None:
    get(served.url(), "bytes=0-9")
    get(served.url(), "bytes=-5")
    get(served.url("/small.txt"))
    requests.head(served.url(), timeout=TIMEOUT)
    get(served.url("/missing"))
    served.server.fault("/data.bin", "503")
    get(served.url())
    stats = served.server.stats()
    assert stats["requests"] == 6  # GET and HEAD of data paths; control calls not counted
    assert stats["ranges"] == [
        ["/data.bin", 0, 10],
        ["/data.bin", BIG - 5, BIG],
        ["/small.txt", 0, len(served.small)],
    ]
    served.server.reset_stats()
    stats = served.server.stats()
    assert (stats["requests"], stats["ranges"]) == (0, [])


# ---- delay and lifecycle --------------------------------------------------------------


def test_delay_is_applied_without_blocking(tmp_path: Path) -> None:
    delay, parallel = 0.4, 8
    (tmp_path / "f").write_bytes(b"0123456789")
    with RangeServer(tmp_path, delay=delay) as server:
        started = time.monotonic()
        assert get(f"{server.url}/f", "bytes=2-4").content == b"234"
        assert time.monotonic() - started >= delay * 0.9

        started = time.monotonic()
        with ThreadPoolExecutor(parallel) as pool:
            bodies = list(pool.map(lambda _: get(f"{server.url}/f").content, range(parallel)))
        elapsed = time.monotonic() - started
        assert bodies == [b"0123456789"] * parallel
        assert delay * 0.9 <= elapsed  # a delay is never shorter than asked
        assert server.stats()["max_inflight"] > 1  # in parallel: counted, not timed


def test_server_process_stops_on_exit(tmp_path: Path) -> None:
    with RangeServer(tmp_path) as server:
        proc = server._proc
        port = server.port
        assert proc is not None and port is not None
    assert proc.poll() is not None
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_startup_failure_reports_stderr(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="not a directory"):  # noqa: SIM117
        with RangeServer(tmp_path / "nope"):
            pass


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


# ---- moto -----------------------------------------------------------------------------


def test_moto_round_trip_through_s3fs() -> None:
    s3fs = pytest.importorskip("s3fs")
    payload = os.urandom(100_000)
    with MotoServer() as moto:
        assert moto.endpoint.startswith("http://127.0.0.1:")
        moto.make_bucket("bucket")
        moto.put("bucket", "dir/key.bin", payload)
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **moto.storage_options)
        assert fs.cat_file("bucket/dir/key.bin", start=10, end=1010) == payload[10:1010]
        assert fs.cat_file("bucket/dir/key.bin") == payload
        assert fs.size("bucket/dir/key.bin") == len(payload)


def test_nginx_wire_log_says_what_each_request_spoke(tmp_path: Path) -> None:
    """The benchmark's ``Wire:`` lines come from this log: HTTP version, TLS version and
    cipher, and the connection, for each request, over plain http and over TLS."""
    from bench.throughput import WireLog
    from tests.support.certificates import make_certificates
    from tests.support.nginx import NginxServer

    root = tmp_path / "root"
    root.mkdir()
    (root / "data.bin").write_bytes(bytes(range(256)) * 64)
    certificates = make_certificates(tmp_path / "tls")
    log_path = tmp_path / "wire.log"

    def logged(lines: int) -> None:
        """Wait until nginx has logged ``lines`` requests (it logs one when done with it,
        which may be after its client has the answer)."""
        deadline = time.monotonic() + TIMEOUT
        while len(log_path.read_text().splitlines()) < lines and time.monotonic() < deadline:
            time.sleep(0.02)

    with NginxServer(root, tls=certificates, wire_log=log_path) as server:
        wire = WireLog(log_path)
        logged(1)
        assert wire.take() == "1 requests: HTTP/1.1 plain, 1 connections"  # the start-up probe
        plain = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
        for start in (0, 100):  # two ranges on one kept-alive connection
            plain.request("GET", "/data.bin", headers={"Range": f"bytes={start}-{start + 9}"})
            answer = plain.getresponse()
            assert (answer.status, answer.read()) == (206, bytes(range(start, start + 10)))
        plain.close()
        context = ssl.create_default_context(cafile=str(certificates.ca))
        secure = http.client.HTTPSConnection(
            "127.0.0.1", server.tls_port, timeout=TIMEOUT, context=context
        )
        secure.request("GET", "/data.bin", headers={"Range": "bytes=5-6"})
        answer = secure.getresponse()
        assert (answer.status, answer.read()) == (206, bytes([5, 6]))
        cipher = secure.sock.cipher()
        secure.close()
        logged(4)
        spoken = wire.take()
    assert spoken == (
        f"3 requests: HTTP/1.1 {cipher[1]} {cipher[0]}, 1 connections; "
        "HTTP/1.1 plain, 1 connections"
    )
    assert wire.take() == "no requests"

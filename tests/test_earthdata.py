"""Earthdata Login, pre-signed redirects and ``.netrc``, mounted for real against the
emulation in tests/support/earthdata.py (login, archive and pre-signed hosts, each on
its own 127.0.0.x address with TLS and a CA made for the run): every byte read is
checked, and so is what every host received and what the log holds."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import Mounted, refmount_cli
from tests.support.earthdata import (
    PASSWORD,
    TOKEN,
    Earthdata,
    Reply,
    WebHost,
    earthdata,
    write_netrc,
)
from tests.support.remote_files import write_refs

CHUNK = 64 << 10
KEYS = 16
DATA = bytes((i * 131 + (i >> 9)) % 253 for i in range(CHUNK * KEYS))
API_KEY = "archive-api-key-never-elsewhere"


@pytest.fixture
def edl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Earthdata]:
    with earthdata(tmp_path / "certs", {"granule.nc": DATA}) as hosts:
        monkeypatch.setenv("SSL_CERT_FILE", str(hosts.certificates.ca))  # type: ignore[attr-defined]
        monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
        yield hosts


def refs_for(tmp_path: Path, edl: Earthdata) -> Path:
    url = edl.archive.url("/data/granule.nc")
    return write_refs(tmp_path, {f"k{n:02d}": [url, n * CHUNK, CHUNK] for n in range(KEYS)})


def read_all(m: Mounted, readers: int = 8) -> dict[str, subprocess.CompletedProcess[bytes]]:
    """Every key, read by ``readers`` concurrent ``cat`` processes."""
    names = [f"k{n:02d}" for n in range(KEYS)]

    def cat(name: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["cat", str(m.mountpoint / name)], capture_output=True, timeout=120)

    with ThreadPoolExecutor(readers) as pool:
        return dict(zip(names, pool.map(cat, names), strict=True))


def assert_exact(results: dict[str, subprocess.CompletedProcess[bytes]], m: Mounted) -> None:
    for name, done in results.items():
        n = int(name[1:])
        assert done.returncode == 0, (name, done.stderr, m.log()[-3000:])
        assert done.stdout == DATA[n * CHUNK : (n + 1) * CHUNK], name


def assert_no_leaks(edl: Earthdata, m: Mounted) -> None:
    """Nothing keyed to one host reached another; no secret is in the log."""
    for request in edl.presigned.requests:
        assert "authorization" not in request.headers, request
        assert "cookie" not in request.headers, request
        assert "x-api-key" not in request.headers, request
    for request in edl.login.requests:
        assert "cookie" not in request.headers and "x-api-key" not in request.headers, request
        assert "Bearer" not in request.headers.get("authorization", ""), request
    for request in edl.archive.requests:
        assert "Basic" not in request.headers.get("authorization", ""), request
    log = m.log()
    basic = base64.b64encode(f"edl-user:{PASSWORD}".encode()).decode()
    for secret in (PASSWORD, basic, TOKEN, API_KEY, *edl.signatures()):
        assert secret not in log, secret
    assert "archive_session=" not in log


def test_a_bearer_token_keyed_to_the_archive_reads_through_presigned_redirects(
    mount: Callable[..., Mounted], tmp_path: Path, edl: Earthdata
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Api-Key": API_KEY}
    options = {edl.archive.origin: {"headers": headers}}
    m = mount(refs_for(tmp_path, edl), "--remote-options", json.dumps(options), "-d")
    assert_exact(read_all(m), m)
    assert edl.presigned.requests and edl.login.requests == []
    assert all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in edl.archive.requests)
    assert_no_leaks(edl, m)


def test_netrc_logs_in_once_for_concurrent_readers(
    mount: Callable[..., Mounted], tmp_path: Path, edl: Earthdata, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NETRC", str(write_netrc(tmp_path / "netrc")))
    m = mount(refs_for(tmp_path, edl), "-d")
    assert_exact(read_all(m), m)
    assert edl.login.count("/oauth/authorize") == 1  # one login, shared by every reader
    assert edl.archive.count("/login") == 1
    assert_no_leaks(edl, m)


def test_the_reference_set_behind_the_login_opens_the_session_its_chunks_use(
    mount: Callable[..., Mounted], tmp_path: Path, edl: Earthdata, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NETRC", str(write_netrc(tmp_path / "netrc")))
    edl.files["refs.json"] = refs_for(tmp_path, edl).read_bytes()
    m = mount(edl.archive.url("/data/refs.json"), "-d")
    assert_exact(read_all(m), m)
    assert edl.login.count("/oauth/authorize") == 1  # the set's reading logged in
    assert_no_leaks(edl, m)


def test_a_bearer_token_in_refs_options_reads_the_set_behind_the_login(
    mount: Callable[..., Mounted], tmp_path: Path, edl: Earthdata
) -> None:
    edl.files["refs.json"] = refs_for(tmp_path, edl).read_bytes()
    bearer = {"headers": {"Authorization": f"Bearer {TOKEN}"}}
    m = mount(
        edl.archive.url("/data/refs.json"),
        *("--refs-options", json.dumps(bearer)),
        *("--remote-options", json.dumps({edl.archive.origin: bearer})),
    )
    assert_exact(read_all(m, readers=2), m)
    assert edl.login.requests == []
    assert_no_leaks(edl, m)


def test_an_expired_session_is_renewed(
    mount: Callable[..., Mounted], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NETRC", str(write_netrc(tmp_path / "netrc")))
    with earthdata(tmp_path / "certs", {"granule.nc": DATA}, session_seconds=2) as edl:
        monkeypatch.setenv("SSL_CERT_FILE", str(edl.certificates.ca))  # type: ignore[attr-defined]
        m = mount(refs_for(tmp_path, edl))
        first = subprocess.run(["cat", str(m.mountpoint / "k00")], capture_output=True)
        assert first.stdout == DATA[:CHUNK], m.log()[-2000:]
        subprocess.run(["sleep", "3"], check=True)  # the cookie's Max-Age has passed
        second = subprocess.run(["cat", str(m.mountpoint / "k15")], capture_output=True)
        assert second.stdout == DATA[15 * CHUNK :], m.log()[-2000:]
        assert edl.login.count("/oauth/authorize") == 2
        assert_no_leaks(edl, m)


def test_a_wrong_password_is_refused_named_without_a_storm_of_logins(
    mount: Callable[..., Mounted], tmp_path: Path, edl: Earthdata, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NETRC", str(write_netrc(tmp_path / "netrc", password="wrong")))
    m = mount(refs_for(tmp_path, edl))
    results = read_all(m)
    # EACCES from the fetcher, EIO to a reader of a key (EACCES is for open only: see
    # fuse_ops.reader_errno), the refusal named in the log.
    for name, done in results.items():
        assert done.returncode != 0 and b"Input/output error" in done.stderr, (name, done)
    assert edl.login.count("/oauth/authorize") == 1  # refused once, not asked again
    assert edl.presigned.requests == []
    assert f"the login to {edl.login.address}:{edl.login.port} was refused (HTTP 401)" in m.log()
    assert m.process.poll() is None


def test_a_login_host_that_is_down_is_eio_named_and_the_daemon_lives(
    mount: Callable[..., Mounted], tmp_path: Path, edl: Earthdata, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NETRC", str(write_netrc(tmp_path / "netrc")))
    edl.login.stop()
    m = mount(refs_for(tmp_path, edl), "--timeout", "5", "--retries", "1")
    done = subprocess.run(["cat", str(m.mountpoint / "k03")], capture_output=True, timeout=120)
    assert done.returncode != 0 and b"Input/output error" in done.stderr, done
    assert f"redirected to https://{edl.login.address}:{edl.login.port}/oauth/authorize" in m.log()
    assert m.process.poll() is None
    assert sorted(p.name for p in m.mountpoint.iterdir())[:2] == ["k00", "k01"]


def test_an_https_to_http_redirect_is_refused(
    mount: Callable[..., Mounted], tmp_path: Path, edl: Earthdata
) -> None:
    plain = WebHost("127.0.0.5", lambda request: Reply(200, body=b"in the clear"), None)
    try:
        edl.archive.handle = lambda request: Reply(302, {"Location": plain.url("/x")})
        m = mount(refs_for(tmp_path, edl), "--retries", "0")
        done = subprocess.run(["cat", str(m.mountpoint / "k00")], capture_output=True, timeout=60)
        assert done.returncode != 0 and b"Input/output error" in done.stderr, done
        assert plain.requests == []
        assert "redirected from https:// to http://127.0.0.5" in m.log()
    finally:
        plain.stop()


def test_check_probe_names_the_login_host_and_its_status(
    tmp_path: Path, edl: Earthdata, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NETRC", str(write_netrc(tmp_path / "netrc", password="wrong")))
    result = refmount_cli(
        "check", "--json", str(refs_for(tmp_path, edl)), "--probe", "4", "--retries", "0"
    )
    report = json.loads(result.stdout)
    errors = [probe["error"] for probe in report["probes"]]
    assert errors and all(
        f"the login to {edl.login.address}:{edl.login.port} was refused (HTTP 401)" in error
        for error in errors
    ), report
    assert result.returncode != 0
    assert PASSWORD not in result.stdout + result.stderr

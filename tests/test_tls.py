"""TLS and S3 signing in refmount's own HTTP client, and trust for every backend (issue 28).

Mounts read through nginx serving TLS with a certificate of a CA made for the test (the
machine does not trust it until told: ``SSL_CERT_FILE`` or a ``ca_bundle`` option), for
refmount's client, obstore and fsspec alike.  What no well-behaved TLS server does
(closing mid-body, with or without ``close_notify``; closing a kept-alive connection
unannounced; an endless head) comes from the raw server of ``tests/support/rawserver.py``
speaking TLS.  SigV4 signatures are compared with botocore's for the same requests, and
``s3://`` reads go through refmount's client to moto.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import ssl
import subprocess
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from refmount.errors import FetchError
from refmount.fetch import Fetcher, FetchPolicy
from refmount.fetch.http import HttpBackend, readahead
from refmount.fetch.http.aws_credentials import CredentialChain
from refmount.fetch.http.s3 import s3_client
from refmount.fetch.http.sigv4 import EMPTY_SHA256, Credentials, Signer, canonical_path
from refmount.fetch.obstore_options import translate
from refmount.fetch.trust import CertificateError, split_options
from tests.conftest import refmount_cli
from tests.support.certificates import Certificates, make_certificates
from tests.support.mounting import Mounted
from tests.support.nginx import NginxServer
from tests.support.rawserver import Answer, RawServer, Reply, asked_range, partial
from tests.support.servers import HOST, MotoServer
from tests.test_http_client import DATA, ranged_answer

BACKENDS = ("auto", "obstore", "fsspec")
UNTRUSTED = "TLS: certificate verify failed: unable to get local issuer certificate"


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_nginx(
    tmp_path_factory: pytest.TempPathFactory, certificates: Certificates
) -> Iterator[NginxServer]:
    root = tmp_path_factory.mktemp("tls-root")
    (root / "bucket").mkdir()
    (root / "bucket" / "data.bin").write_bytes(DATA)
    with NginxServer(root, tls=certificates) as server:
        yield server


@pytest.fixture
def no_trust_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SSL_CERT_FILE", "AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)


def write_refs(tmp_path: Path, url: str) -> Path:
    refs = {
        "a": [url, 0, 100_000],
        "b": [url, 250_000, 50_001],
        "local": "base64:" + "aGVsbG8=",  # "hello", served without any request
    }
    path = tmp_path / "refs.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path


def cat(path: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["cat", str(path)], capture_output=True, timeout=120)


def assert_reads(mounted: Mounted) -> None:
    assert (mounted.mountpoint / "a").read_bytes() == DATA[:100_000]
    assert (mounted.mountpoint / "b").read_bytes() == DATA[250_000:300_001]


def s3_options(server: NginxServer, **more: str) -> dict[str, object]:
    """nginx as an S3 endpoint (path-style GETs; it ignores the signature)."""
    return {
        "endpoint_url": server.https_url,
        "key": "k",
        "secret": "s",
        "client_kwargs": {"region_name": "us-east-1"},
        **more,
    }


# -- mounts over TLS ---------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_https_trusted_through_ssl_cert_file_reads(
    backend: str,
    tmp_path: Path,
    tls_nginx: NginxServer,
    certificates: Certificates,
    mount: Callable[..., Mounted],
    monkeypatch: pytest.MonkeyPatch,
    no_trust_env: None,
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(certificates.ca))
    refs = write_refs(tmp_path, f"{tls_nginx.https_url}/bucket/data.bin")
    mounted = mount(refs, "--fetch-backend", backend)
    assert_reads(mounted)
    if backend == "auto":
        assert "byte ranges through refmount's HTTP client" in mounted.log_path.read_text()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("over", ["https", "s3"])
def test_a_ca_bundle_option_is_trusted_where_it_is_given(
    over: str,
    backend: str,
    tmp_path: Path,
    tls_nginx: NginxServer,
    certificates: Certificates,
    mount: Callable[..., Mounted],
    no_trust_env: None,
) -> None:
    ca = str(certificates.ca)
    options: dict[str, dict[str, object]]
    if over == "https":  # keyed by host
        url = f"{tls_nginx.https_url}/bucket/data.bin"
        options = {tls_nginx.https_url: {"ca_bundle": ca}}
    else:  # keyed by protocol, with the endpoint's other settings
        url, options = "s3://bucket/data.bin", {"s3": s3_options(tls_nginx, ca_bundle=ca)}
    refs = write_refs(tmp_path, url)
    mounted = mount(refs, "--fetch-backend", backend, "--remote-options", json.dumps(options))
    assert_reads(mounted)
    if backend == "auto":
        said = "(S3, SigV4)" if over == "s3" else "byte ranges through refmount's HTTP client"
        assert said in mounted.log_path.read_text()


@pytest.mark.parametrize("backend", [*BACKENDS, "auto --fetch-workers 1"])
def test_an_untrusted_certificate_fails_naming_host_and_reason(
    backend: str,
    tmp_path: Path,
    tls_nginx: NginxServer,
    mount: Callable[..., Mounted],
    no_trust_env: None,
) -> None:
    refs = write_refs(tmp_path, f"{tls_nginx.https_url}/bucket/data.bin")
    mounted = mount(refs, "--fetch-backend", *backend.split())
    done = cat(mounted.mountpoint / "a")
    assert done.returncode != 0 and done.stdout == b""
    assert b"Input/output error" in done.stderr
    log = mounted.log_path.read_text()
    assert f"{HOST}:{tls_nginx.tls_port}: {UNTRUSTED}" in log
    assert "error sending request" not in log
    assert f"read of 'a' failed: {tls_nginx.https_url}/bucket/data.bin: " in log
    assert "attempts" not in log  # final at once: a retry meets the same certificate
    # The daemon is alive and serves what needs no certificate.
    assert (mounted.mountpoint / "local").read_bytes() == b"hello"
    assert mounted.process.poll() is None


def test_check_names_an_untrusted_certificate(
    tmp_path: Path, tls_nginx: NginxServer, certificates: Certificates, no_trust_env: None
) -> None:
    refs = write_refs(tmp_path, f"{tls_nginx.https_url}/bucket/data.bin")
    done = refmount_cli("check", str(refs), "--probe", "2")
    assert done.returncode != 0
    assert f"{HOST}:{tls_nginx.tls_port}: {UNTRUSTED}" in done.stdout
    options = json.dumps({"https": {"ca_bundle": str(certificates.ca)}})
    done = refmount_cli("check", str(refs), "--probe", "2", "--remote-options", options)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_ca_bundle_that_is_no_file_is_refused(no_trust_env: None) -> None:
    with pytest.raises(ValueError, match=r"ca_bundle '/nonexistent\.pem': not a file"):
        split_options({"ca_bundle": "/nonexistent.pem"})
    trust, rest = split_options({"ca_bundle": __file__, "headers": {}})
    assert trust.bundles == (__file__,) and rest == {"headers": {}}


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "no such file"),
        (b"not a certificate\n", "no PEM certificate in it"),
        (b"-----BEGIN CERTIFICATE-----\nbm90IGRlcg==\n-----END CERTIFICATE-----\n",
         "not a CA bundle OpenSSL reads"),
    ],
)  # fmt: skip
def test_a_ca_bundle_that_names_no_ca_bundle_fails_the_start_and_the_check(
    tmp_path: Path, content: bytes | None, problem: str
) -> None:
    """The mount command and ``refmount check`` refuse it before anything is read or
    mounted, naming the scope, the option and the path; never at the first read."""
    bundle = tmp_path / "lab-ca.pem"
    if content is not None:
        bundle.write_bytes(content)
    refs = write_refs(tmp_path, "https://127.0.0.1:9/data.bin")
    options = json.dumps({"https": {"ca_bundle": str(bundle)}})
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    said = f"--remote-options https: ca_bundle '{bundle}': {problem}"
    for argv in (
        (str(refs), str(mountpoint), "--remote-options", options),
        ("check", str(refs), "--remote-options", options),
    ):
        done = refmount_cli(*argv)
        assert done.returncode == 2, done.stdout + done.stderr
        assert said in done.stderr, done.stderr
        assert not os.path.ismount(mountpoint)


# -- hostile TLS servers -----------------------------------------------------------------


class _NotifyingSocket(ssl.SSLSocket):
    """A server socket that ends its TLS session with ``close_notify`` when closed
    (Python's own closes the TCP connection only)."""

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.unwrap()
        super().close()


class TlsRawServer(RawServer):
    """The raw server of tests/support/rawserver.py, speaking TLS with the test CA's
    certificate; ``close_notify``: each connection's end is announced."""

    def __init__(
        self,
        answer: Answer,
        certs: Certificates,
        close_notify: bool = False,
        as_ca: bool = False,
        old_tls: bool = False,
    ) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        if old_tls:  # a server that offers TLS 1.0 and 1.1 only
            self.context.set_ciphers("DEFAULT:@SECLEVEL=0")
            with warnings.catch_warnings(category=DeprecationWarning, action="ignore"):
                self.context.minimum_version = ssl.TLSVersion.TLSv1
                self.context.maximum_version = ssl.TLSVersion.TLSv1_1
        if as_ca:  # the CA's own certificate: trusted, but only for signing certificates
            self.context.load_cert_chain(certs.ca, certs.ca.with_name("ca.key"))
        else:
            self.context.load_cert_chain(certs.cert, certs.key)
        if close_notify:
            self.context.sslsocket_class = _NotifyingSocket
        super().__init__(answer)

    def _one(self, conn: socket.socket) -> None:
        try:
            tls = self.context.wrap_socket(conn, server_side=True)
        except OSError:
            conn.close()
            return
        super()._one(tls)


@pytest.fixture
def tls_raw_server(
    certificates: Certificates, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[Answer], TlsRawServer]]:
    monkeypatch.setenv("SSL_CERT_FILE", str(certificates.ca))
    servers: list[TlsRawServer] = []

    def start(answer: Answer, **kw: bool) -> TlsRawServer:
        servers.append(TlsRawServer(answer, certificates, **kw))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def fetcher(**policy: float) -> Fetcher:
    settings = {"timeout": 3.0, "retries": 1, "backoff": 0.01, **policy}
    return Fetcher(policy=FetchPolicy(**settings))  # type: ignore[arg-type]


def cut_short(head: bytes) -> bytes:
    """A whole head, then half the body."""
    answer = ranged_answer(head)
    return answer[: answer.index(b"\r\n\r\n") + 4 + 1000]


@pytest.mark.parametrize("keep_open", [True, False], ids=["kept-alive", "closed-each-time"])
def test_tls_ranges_on_kept_alive_and_closed_connections(
    keep_open: bool, tls_raw_server: Callable[..., TlsRawServer]
) -> None:
    # Closed after each answer without saying so, as a server does when an idle
    # connection's time is up: the next request goes again on a new one, no retry.
    server = tls_raw_server(lambda head: (ranged_answer(head), keep_open))
    url = f"https://{HOST}:{server.port}/x.bin"
    reader = fetcher(retries=0)

    async def main() -> None:
        for start, end in [(0, 10), (10, 200_000), (299_000, 300_001)]:
            assert await reader.fetch(url, start, end) == DATA[start:end]

    trio.run(main)
    assert len(server.requests) == 3 and server.connections == (1 if keep_open else 3)
    assert reader.stats.retries == 0
    assert isinstance(reader._backend(url), HttpBackend)
    reader.close()


@pytest.mark.parametrize("notify", [False, True], ids=["no-close-notify", "close-notify"])
def test_a_tls_body_cut_short_is_an_error_never_short_bytes(
    notify: bool, tls_raw_server: Callable[..., TlsRawServer]
) -> None:
    server = tls_raw_server(lambda head: (cut_short(head), False), close_notify=notify)
    url = f"https://{HOST}:{server.port}/x.bin"
    reader = fetcher(retries=1)
    with pytest.raises(FetchError, match="closed the connection after 1000 of 50000"):
        trio.run(reader.fetch, url, 0, 50_000)
    assert server.connections == 2  # retried once, never served short
    reader.close()


def test_a_wrong_tls_range_is_refused(tls_raw_server: Callable[..., TlsRawServer]) -> None:
    def answer(head: bytes) -> tuple[bytes, bool]:
        body = DATA[5:15]
        return (
            b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 5-14/300001\r\n"
            b"Content-Length: 10\r\n\r\n" + body,
            True,
        )

    server = tls_raw_server(answer)
    reader = fetcher(retries=0)
    with pytest.raises(FetchError, match="Content-Range 5-14 for the asked 0-9"):
        trio.run(reader.fetch, f"https://{HOST}:{server.port}/x.bin", 0, 10)
    reader.close()


def test_read_ahead_is_turned_on_where_the_interpreter_is_cpython() -> None:
    """The pointers :mod:`refmount.fetch.http.readahead` reads out of CPython's ``_ssl``
    objects are checked against OpenSSL before use: on this interpreter they pass, so the
    daemon's TLS connections read ahead (were the layout to change, enable() says None
    and this fails, rather than read-ahead going quietly off)."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        context = ssl.create_default_context()
        tls = context.wrap_socket(ours, server_hostname=HOST, do_handshake_on_connect=False)
        pointer = readahead.enable(tls)
        assert pointer is not None
        assert not readahead.has_pending(pointer)


def test_a_tls_answer_nobody_asked_for_never_answers_the_next_request(
    tls_raw_server: Callable[..., TlsRawServer],
) -> None:
    """OpenSSL reads ahead on refmount's connections (:mod:`refmount.fetch.http.readahead`):
    an answer the server sends right behind the asked one is read with the asked one's
    TLS record into OpenSSL's buffer, where no poll of the socket sees it, and must keep
    the connection from being used again all the same (without the check, the next
    request gets this answer's bytes)."""
    # The answer fills one TLS record (16 KiB, the largest) to the byte: OpenSSL reads
    # that record's header with as much as its buffer holds, the next record too.
    length = next(n for n in range(16_000, 16_384) if len(partial(0, n - 1, DATA)) == 16_384)
    other = bytes(255 - b for b in DATA)

    def answer(head: bytes) -> tuple[Reply, bool]:
        first, last = asked_range(head)
        right = partial(first, last, DATA)
        if not head.startswith(b"GET /first.bin "):
            return right, True
        # What the next request will ask, with other bytes, in a record of its own
        # sent with the answer's.
        return right + partial(0, 9, other), True

    server = tls_raw_server(answer)
    reader = fetcher(retries=0)

    async def main() -> None:
        assert (
            await reader.fetch(f"https://{HOST}:{server.port}/first.bin", 0, length)
            == DATA[:length]
        )
        await trio.sleep(0.5)
        assert await reader.fetch(f"https://{HOST}:{server.port}/second.bin", 0, 10) == DATA[:10]

    trio.run(main)
    assert server.connections == 2  # the first connection was closed, not used again
    reader.close()


def test_a_tls_body_cut_short_through_a_mount_is_eio(
    tmp_path: Path,
    tls_raw_server: Callable[..., TlsRawServer],
    mount: Callable[..., Mounted],
) -> None:
    server = tls_raw_server(lambda head: (cut_short(head), False))
    refs = write_refs(tmp_path, f"https://{HOST}:{server.port}/x.bin")
    mounted = mount(refs, "--retries", "1")
    done = cat(mounted.mountpoint / "a")
    assert done.returncode != 0 and b"Input/output error" in done.stderr
    assert done.stdout == b""  # nothing of the short body reached the reader
    assert (mounted.mountpoint / "local").read_bytes() == b"hello"


def test_a_certificate_not_made_for_a_server_is_refused_at_once(
    tls_raw_server: Callable[..., TlsRawServer],
) -> None:
    server = tls_raw_server(lambda head: (ranged_answer(head), True), as_ca=True)
    reader = fetcher(retries=2)
    with pytest.raises(FetchError, match=r"verify failed: unsuitable certificate purpose"):
        trio.run(reader.fetch, f"https://{HOST}:{server.port}/x.bin", 0, 10)
    assert reader.stats.retries == 0
    reader.close()


# -- SigV4 and S3 through refmount's client ---------------------------------------------


SIGNED_CASES = [
    ("bucket", "plain/key.bin", {}, None),
    ("bucket", "a key/with spaces+plus&amp=.bin", {"If-Match": '"abc"'}, None),
    ("my-bucket", "ünïcødé/ключ.nc", {"x-amz-request-payer": "requester"}, "session-token"),
    ("b", "a//double/./dot/../seg", {"If-Unmodified-Since": "Tue, 01 Jan 2030 00:00:00 GMT"}, None),
]


@pytest.mark.parametrize(("bucket", "key", "extra", "token"), SIGNED_CASES)
def test_sigv4_signature_is_botocore_s(
    bucket: str, key: str, extra: dict[str, str], token: str | None
) -> None:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as BotoCredentials

    now = 1_800_000_000.0
    host = "s3.example.test:9000"
    path = f"/{canonical_path(bucket)}/{canonical_path(key)}"
    headers = [
        ("Host", host),
        ("Range", "bytes=0-99"),
        ("Accept-Encoding", "identity"),
        ("User-Agent", "refmount"),
        *extra.items(),
    ]
    secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
    signer = Signer(Credentials("AKIDEXAMPLE", secret, token), "eu-west-3")
    added = dict(signer.headers("GET", path, headers, now=now))

    request = AWSRequest(method="GET", url=f"https://{host}{path}", headers=dict(headers))
    for name in ("x-amz-date", "x-amz-content-sha256", "x-amz-security-token"):
        if name in added:
            request.headers[name] = added[name]
    request.context["timestamp"] = added["x-amz-date"]
    auth = S3SigV4Auth(
        BotoCredentials("AKIDEXAMPLE", secret, token),
        "s3",
        "eu-west-3",
    )
    canonical = auth.canonical_request(request)
    signature = auth.signature(auth.string_to_sign(request, canonical), request)
    signed = auth.signed_headers(auth.headers_to_sign(request))
    assert added["Authorization"] == (
        f"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20270115/eu-west-3/s3/aws4_request, "
        f"SignedHeaders={signed}, Signature={signature}"
    )
    assert added["x-amz-content-sha256"] == EMPTY_SHA256
    assert ("x-amz-security-token" in added) == (token is not None)


def test_the_signing_key_is_made_once_a_day() -> None:
    signer = Signer(Credentials("a", "b"), "us-east-1")
    first = signer.headers("GET", "/b/k", [("Host", "h")], now=1_800_000_000.0)
    key = signer._keys["20270115"]
    signer.headers("GET", "/b/k2", [("Host", "h")], now=1_800_000_100.0)
    assert signer._keys == {"20270115": key}
    later = signer.headers("GET", "/b/k", [("Host", "h")], now=1_800_086_400.0)
    assert list(signer._keys) == ["20270116"]
    assert first[-1][1] != later[-1][1]


def test_s3_addressing() -> None:
    aws = s3_client(translate("s3", {"key": "a", "secret": "b", "region": "eu-west-1"}))
    assert aws is not None and aws.scheme == "https"
    assert aws.locate("s3://my-bucket/a b.nc") == (
        "my-bucket.s3.eu-west-1.amazonaws.com",
        443,
        "/a%20b.nc",
    )
    assert aws.locate("s3://Not_DNS/x") is None  # left to obstore
    assert aws.locate("s3://my-bucket/x?versionId=1") is None
    lab = s3_client(translate("s3", {"anon": True, "endpoint_url": "http://h:9000/base/"}))
    assert lab is not None and lab.credentials is None and lab.scheme == "http"
    assert lab.locate("s3://b/k/ü") == ("h", 9000, "/base/b/k/%C3%BC")
    # No key given: botocore's chain finds the credentials (a profile, SSO, a role).
    chained = s3_client(translate("s3", {"endpoint_url": "https://h"}))
    assert chained is not None and isinstance(chained.credentials, CredentialChain)


def test_s3_reads_through_refmounts_client_against_moto(
    s3_server: MotoServer, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = "tls-sigv4"
    s3_server.make_bucket(bucket)
    keys = {"plain.bin": DATA, "a dir/spaced key+plus.bin": DATA[:5000], "ünï/ключ.nc": b"xyz" * 9}
    for key, data in keys.items():
        s3_server.put(bucket, key, data)
    reader = Fetcher(remote_options={"s3": s3_server.storage_options},
                     policy=FetchPolicy(timeout=10.0, retries=0))  # fmt: skip

    async def main() -> None:
        assert await reader.fetch(f"s3://{bucket}/plain.bin", 7, 200_007) == DATA[7:200_007]
        for key, data in keys.items():
            assert await reader.fetch(f"s3://{bucket}/{key}", 1, len(data)) == data[1:]
        with pytest.raises(FetchError, match="HTTP 404") as missing:
            await reader.fetch(f"s3://{bucket}/missing.bin", 0, 10)
        assert missing.value.errno == errno.EIO

    with caplog.at_level("INFO", logger="refmount.fetch.http.backend"):
        trio.run(main)
    assert "byte ranges through refmount's HTTP client (S3, SigV4)" in caplog.text
    assert isinstance(reader._backend(f"s3://{bucket}/plain.bin"), HttpBackend)
    reader.close()


def test_certificate_error_names_host_and_reason() -> None:
    error = CertificateError("h:443", "self-signed certificate")
    assert str(error) == "h:443: TLS: certificate verify failed: self-signed certificate"


def test_a_server_offering_only_old_tls_is_refused(
    tls_raw_server: Callable[..., TlsRawServer],
) -> None:
    server = tls_raw_server(lambda head: (ranged_answer(head), True), old_tls=True)
    reader = fetcher(retries=1)
    with pytest.raises(FetchError, match=r"(?i)protocol") as refused:
        trio.run(reader.fetch, f"https://{HOST}:{server.port}/x.bin", 0, 10)
    assert refused.value.errno == errno.EIO
    assert server.requests == []  # no request was ever sent over it
    reader.close()


def test_turning_verification_off_is_said_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    from refmount.fetch.fsspec_backend import FsspecBackend
    from refmount.fetch.obstore_backend import make_backend

    with caplog.at_level("WARNING", logger="refmount.fetch.trust"):
        https = make_backend("https", {"ssl": False})
        s3 = make_backend("s3", {"anon": True, "client_kwargs": {"verify": False}})
    assert isinstance(https, FsspecBackend) and https.options["ssl"] is False
    assert isinstance(s3, FsspecBackend)
    assert "https: the remote options turn certificate verification OFF (ssl: false)" in caplog.text
    assert "s3: the remote options turn certificate verification OFF (client_kwargs" in caplog.text


def test_https_through_fetch_workers_trusts_the_ca_bundle(
    tmp_path: Path,
    tls_nginx: NginxServer,
    certificates: Certificates,
    mount: Callable[..., Mounted],
    no_trust_env: None,
) -> None:
    refs = write_refs(tmp_path, f"{tls_nginx.https_url}/bucket/data.bin")
    options = json.dumps({"https": {"ca_bundle": str(certificates.ca)}})
    mounted = mount(refs, "--fetch-workers", "1", "--remote-options", options)
    assert_reads(mounted)


@pytest.mark.parametrize("anon", [False, True], ids=["signed", "anonymous"])
def test_s3_requests_as_sent(anon: bool, raw_server: Callable[[Answer], RawServer]) -> None:
    server = raw_server(lambda head: (ranged_answer(head), True))
    options: dict[str, object] = {
        "endpoint_url": f"http://{HOST}:{server.port}",
        "region": "eu-north-1",
    }
    options.update({"anon": True} if anon else {"key": "AKID", "secret": "s", "token": "t"})
    reader = Fetcher(remote_options={"s3": options}, policy=FetchPolicy(retries=0))
    assert trio.run(reader.fetch, "s3://bkt/dir/a b.nc", 5, 105) == DATA[5:105]
    reader.close()
    lines = server.requests[0].decode().split("\r\n")
    headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:])}
    assert lines[0] == "GET /bkt/dir/a%20b.nc HTTP/1.1"  # path-style, key encoded
    assert headers["host"] == f"{HOST}:{server.port}" and headers["range"] == "bytes=5-104"
    if anon:
        assert not any(name.startswith("x-amz") or name == "authorization" for name in headers)
        return
    assert headers["x-amz-content-sha256"] == EMPTY_SHA256
    assert headers["x-amz-security-token"] == "t"
    credential = f"Credential=AKID/{headers['x-amz-date'][:8]}/eu-north-1/s3/aws4_request"
    assert headers["authorization"].startswith(f"AWS4-HMAC-SHA256 {credential}, ")


@pytest.mark.parametrize("protocol", ["gs", "az"])
def test_fsspec_for_gcs_and_azure_says_the_ca_bundle_does_not_reach_it(
    protocol: str, certificates: Certificates, no_trust_env: None, caplog: pytest.LogCaptureFixture
) -> None:
    """gcsfs and adlfs take no CA bundle (docs/stores.md, TLS and certificates): where fsspec
    serves them, the log says the bundle is not trusted for their hosts; where obstore
    serves them it is (its root certificates), and nothing is said."""
    from refmount.fetch.obstore_backend import make_backend

    options = {"ca_bundle": str(certificates.ca)}
    with caplog.at_level("WARNING", logger="refmount.fetch.obstore_backend"):
        make_backend(protocol, options, "fsspec").close()
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        f"{protocol}: fsspec's filesystem for it takes no CA bundle: {certificates.ca} not "
        "trusted for its hosts (only the system store, or SSL_CERT_FILE instead of it); "
        f"obstore trusts them where it serves {protocol}"
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="refmount.fetch.obstore_backend"):
        make_backend(protocol, options, "obstore").close()
        make_backend("https", options, "fsspec").close()  # aiohttp takes the context
    assert caplog.records == []

"""An emulation of NASA Earthdata's HTTPS flow, each host on its own loopback address with
TLS (a CA made for the run), as refmount meets it:

* the **login host** (``127.0.0.2``): ``/oauth/authorize`` takes HTTP Basic credentials
  (a 401 with ``WWW-Authenticate: Basic`` without them or with wrong ones) and redirects
  to the ``redirect_uri`` with a one-time code;
* the **archive host** (``127.0.0.3``): a read without a session (no cookie, no bearer
  token) is redirected to the login host's ``authorize``; ``/login?code=`` sets a
  session cookie (``Secure``, ``HttpOnly``, ``Max-Age`` ``session_seconds``) and
  redirects to the first URL; with a session, each read is redirected to a pre-signed URL
  on the pre-signed host;
* the **pre-signed host** (``127.0.0.4``): serves ranges of a URL whose signature (an
  HMAC in the query) is right and unexpired, and refuses a request that also carries an
  ``Authorization`` header (400, as S3 does: "Only one auth mechanism allowed").

Every request each host receives is kept (:attr:`WebHost.requests`), for the leak
checks: which host saw which header.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import http.server
import secrets
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

from tests.support.certificates import Certificates, make_certificates

LOGIN, ARCHIVE, PRESIGNED, OTHER = "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"
USER, PASSWORD = "edl-user", "edl-password-4711"
TOKEN = "edl-token-eyJhbGciOi.fake.jwt"
SIGNING_KEY = b"presigned-host-key"


@dataclass(frozen=True)
class Seen:
    """One request a host received."""

    method: str
    target: str  # path and query
    headers: dict[str, str]  # lower-cased names

    @property
    def path(self) -> str:
        return urlsplit(self.target).path


@dataclass
class Reply:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    cookies: list[str] = field(default_factory=list)


Handle = Callable[[Seen], Reply]


class WebHost:
    """An HTTP/1.1 server (keep-alive) on ``address``, over TLS when given
    certificates, answering each request with ``handle(request)``."""

    def __init__(self, address: str, handle: Handle, certificates: Certificates | None) -> None:
        self.address = address
        self.handle = handle
        self.requests: list[Seen] = []
        self.scheme = "https" if certificates is not None else "http"
        context = None
        if certificates is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certificates.cert, certificates.key)
        host = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                if context is not None:
                    self.request = context.wrap_socket(self.request, server_side=True)
                super().setup()

            def do_GET(self) -> None:
                self._answer()

            def do_HEAD(self) -> None:
                self._answer()

            def _answer(self) -> None:
                seen = Seen(
                    self.command, self.path, {k.lower(): v for k, v in self.headers.items()}
                )
                host.requests.append(seen)
                reply = host.handle(seen)
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                for cookie in reply.cookies:
                    self.send_header("Set-Cookie", cookie)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(reply.body)

            def log_message(self, *args: object) -> None:
                pass

            def handle_one_request(self) -> None:
                with contextlib.suppress(OSError, ssl.SSLError):
                    super().handle_one_request()

        self.server = http.server.ThreadingHTTPServer((address, 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def origin(self) -> str:
        return f"{self.scheme}://{self.address}:{self.port}"

    def url(self, path: str) -> str:
        return self.origin + path

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def count(self, path: str) -> int:
        return sum(1 for r in self.requests if r.path == path)


def ranged(data: bytes, request: Seen) -> Reply:
    """A 206 for the request's ``Range``, or the whole ``data`` without one."""
    spec = request.headers.get("range")
    if spec is None:
        return Reply(200, body=data)
    first, last = (int(x) for x in spec.split("=")[1].split("-"))
    last = min(last, len(data) - 1)
    headers = {"Content-Range": f"bytes {first}-{last}/{len(data)}"}
    return Reply(206, headers, data[first : last + 1])


class Earthdata:
    """The three hosts, serving ``files`` (name -> bytes) behind the login."""

    def __init__(
        self, certificates: Certificates, files: dict[str, bytes], session_seconds: int = 3600
    ) -> None:
        self.files = files
        self.session_seconds = session_seconds
        self._codes: dict[str, str] = {}
        self._sessions: dict[str, float] = {}
        self.presigned = WebHost(PRESIGNED, self._presigned, certificates)
        self.archive = WebHost(ARCHIVE, self._archive, certificates)
        self.login = WebHost(LOGIN, self._login, certificates)

    @property
    def hosts(self) -> list[WebHost]:
        return [self.login, self.archive, self.presigned]

    def stop(self) -> None:
        for host in self.hosts:
            host.stop()

    # -- the login host -----------------------------------------------------------------

    def _login(self, request: Seen) -> Reply:
        if request.path != "/oauth/authorize":
            return Reply(404)
        expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        if request.headers.get("authorization") != expected:
            return Reply(401, {"WWW-Authenticate": 'Basic realm="Earthdata Login"'}, b"denied")
        query = parse_qs(urlsplit(request.target).query)
        code = secrets.token_hex(8)
        self._codes[code] = query["state"][0]
        location = f"{query['redirect_uri'][0]}?code={code}&state={quote(query['state'][0])}"
        return Reply(302, {"Location": location})

    # -- the archive host ---------------------------------------------------------------

    def _has_session(self, request: Seen) -> bool:
        if request.headers.get("authorization") == f"Bearer {TOKEN}":
            return True
        for part in request.headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == "archive_session" and self._sessions.get(value, 0) > time.time():
                return True
        return False

    def _archive(self, request: Seen) -> Reply:
        if request.path == "/login":
            query = parse_qs(urlsplit(request.target).query)
            state = self._codes.pop(query.get("code", [""])[0], None)
            if state is None:
                return Reply(401, body=b"no such code")
            session = secrets.token_hex(16)
            self._sessions[session] = time.time() + self.session_seconds
            cookie = (
                f"archive_session={session}; Path=/; Secure; HttpOnly; "
                f"Max-Age={self.session_seconds}"
            )
            return Reply(302, {"Location": state}, cookies=[cookie])
        name = request.path.removeprefix("/data/")
        if name not in self.files:
            return Reply(404)
        if not self._has_session(request):
            authorize = self.login.url(
                f"/oauth/authorize?client_id=archive&response_type=code"
                f"&redirect_uri={quote(self.archive.url('/login'), safe='')}"
                f"&state={quote(request.path, safe='')}"
            )
            return Reply(302, {"Location": authorize})
        return Reply(307, {"Location": self.presign(name)})

    # -- the pre-signed host ------------------------------------------------------------

    def presign(self, name: str, seconds: int = 3600) -> str:
        expires = int(time.time()) + seconds
        signature = _signature(name, expires)
        return self.presigned.url(
            f"/bucket/{name}?X-Amz-Expires={expires}&X-Amz-Signature={signature}"
        )

    def _presigned(self, request: Seen) -> Reply:
        if "authorization" in request.headers:
            return Reply(400, body=b"InvalidArgument: Only one auth mechanism allowed")
        name = request.path.removeprefix("/bucket/")
        query = parse_qs(urlsplit(request.target).query)
        try:
            expires = int(query["X-Amz-Expires"][0])
            signature = query["X-Amz-Signature"][0]
        except (KeyError, ValueError):
            return Reply(403, body=b"no signature")
        if expires < time.time() or not hmac.compare_digest(signature, _signature(name, expires)):
            return Reply(403, body=b"SignatureDoesNotMatch")
        if name not in self.files:
            return Reply(404)
        return ranged(self.files[name], request)

    def signatures(self) -> set[str]:
        """Every signature the archive handed out (for the log's leak check)."""
        found = set()
        for request in self.presigned.requests:
            found.update(parse_qs(urlsplit(request.target).query).get("X-Amz-Signature", []))
        return found


def _signature(name: str, expires: int) -> str:
    return hmac.new(SIGNING_KEY, f"{name}:{expires}".encode(), hashlib.sha256).hexdigest()


def write_netrc(path: Path, password: str = PASSWORD) -> Path:
    path.write_text(f"machine {LOGIN}\n  login {USER}\n  password {password}\n")
    path.chmod(0o600)
    return path


@contextlib.contextmanager
def earthdata(directory: Path, files: dict[str, bytes], **kw: int) -> Iterator[Earthdata]:
    """The emulation, with certificates for its addresses made in ``directory``."""
    certificates = make_certificates(directory, addresses=(LOGIN, ARCHIVE, PRESIGNED, OTHER))
    hosts = Earthdata(certificates, files, **kw)
    hosts.certificates = certificates  # type: ignore[attr-defined]
    try:
        yield hosts
    finally:
        hosts.stop()

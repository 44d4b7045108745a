"""Byte ranges of ``http://``, ``https://`` and ``s3://`` URLs, read on the serving loop
itself.

A ranged GET over a keep-alive connection is a few system calls; what costs is how the
body reaches a buffer.  obstore (``obstore_backend``) does the request in its Rust
runtime and hands the body over through a worker thread: per cold 256 KiB chunk against
nginx that is 0.26-0.31 ms of CPU in-process, and in the daemon 0.6 ms, most of it the
serving thread and the worker threads passing the GIL back and forth (36 futex calls
per chunk under ``strace -c``).  Here the request is written and the body received
(``recv_into`` the part's own buffer) by trio on the serving thread: no thread, no
hand-over, 0.09 ms per chunk for the same requests in-process
(``bench/http_client.py``).  A trio cancel scope (the fetcher's deadline) ends a request
at once and closes its connection; nothing is left running.

What this client does not do itself goes to the backend that did it before (obstore,
or fsspec where obstore cannot serve or the scope has headers of the user's): versions
and sizes (HEAD, rare; sizes here when a login is in play), paths that are not plain
ASCII, hosts reached through a proxy
(``http_proxy``), and an S3 endpoint's redirects (each redirected URL is remembered and
asked there directly).  An ``http://`` or ``https://`` redirect is the fetcher's to
follow (:class:`~refmount.fetch.redirects.Redirected`): the new URL is asked through the
backend of its own origin, with nothing keyed to this one.  Each request to a host that
``.netrc`` names carries its Basic credentials, and each carries the cookies the
process's jar holds for its URL; cookies an answer sets are kept there
(:mod:`refmount.fetch.logins`).  TLS
(``https://``, and ``s3://`` endpoints over https) is a non-blocking ``ssl.SSLSocket``
(:mod:`refmount.fetch.http.tls`) that decrypts into the same buffers; ``s3://`` requests
are addressed and signed by :mod:`refmount.fetch.http.s3` and
:mod:`refmount.fetch.http.sigv4`.  In the daemon a cold 256 KiB chunk over https cost
0.80 ms of CPU this way against 1.60 ms through obstore's threads at load 2, 1.0-1.15
against 1.4-1.85 ms at load 8-13 (issue 28, ``bench/README.md``).

An answer is data only when it is exactly what was asked (the same checks as
``obstore_backend``): a 206 whose ``Content-Range`` starts at the asked byte and ends at
the asked end or at the object's end, with a ``Content-Length`` to match, no
``Transfer-Encoding`` (:meth:`Head.framing`) and no ``Content-Encoding``; or, for a
range from byte 0 only, a 200 whose body is read as far as the range (the server
ignored ``Range``).  Anything else is :class:`WrongAnswer` or
an HTTP status the fetcher maps and retries; no more of a body than the range is ever
read.
"""

from __future__ import annotations

import email.utils
import errno
import functools
import ipaddress
import logging
import re
import ssl
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import lru_cache
from typing import NamedTuple, TypeVar
from urllib.parse import urlsplit

import trio

from refmount import header_text
from refmount.errors import FetchError
from refmount.fetch import checksums
from refmount.fetch.backend import Backend, Version, WrongAnswer
from refmount.fetch.buffers import BufferPool
from refmount.fetch.http.connection import Connection, ConnectionLost
from refmount.fetch.http.pool import ConnectionPool
from refmount.fetch.http.response import Head
from refmount.fetch.http.s3 import S3Client
from refmount.fetch.http.sigv4 import Signer
from refmount.fetch.logins import Logins, for_process
from refmount.fetch.redirects import Redirected
from refmount.redaction import redact
from refmount.refs.model import Checksum

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Redirected URLs remembered (asked through the fallback directly).
REDIRECTS_KEPT = 4096
#: A redirect's or refusal's body read (and its connection kept) up to this size;
#: a longer one closes the connection.
SMALL_BODY = 64 << 10
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_USER_AGENT = "refmount"
_DEFAULT_PORTS = {"http": 80, "https": 443}
#: A host as this client writes it into ``Host``: a name or an IPv4 or IPv6 address.
_HOST = re.compile(r"[A-Za-z0-9._~-]+|[0-9A-Fa-f:.]+")


class HttpStatus(Exception):
    """An answer with a status other than a range's: ``status`` decides the errno and
    whether the fetcher retries (see :func:`refmount.fetch.fetcher.classify`)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class _Target(NamedTuple):
    host: str
    port: int
    path: bytes  # the request target, as the URL spells it
    host_header: str  # the Host header: the port only where it is not the scheme's


def target_of(scheme: str, host: str, port: int, path: str) -> _Target | None:
    """A request's target, or None for one this client leaves to the fallback (a path
    that is not plain ASCII, a host reached through a proxy)."""
    if not host or _HOST.fullmatch(host) is None or not _resolvable(host):
        return None
    if not path.isascii() or any(c <= " " or c == "\x7f" for c in path):
        return None
    if _proxied(scheme, host):
        return None
    shown = host if ":" not in host else f"[{host}]"
    if port != _DEFAULT_PORTS[scheme]:
        shown = f"{shown}:{port}"
    return _Target(host, port, path.encode("ascii"), shown)


def _resolvable(host: str) -> bool:
    """Whether ``host`` is a name (or address) as ``ssl`` and the resolver take it: no
    leading dot, no empty label but a final one, none longer than 63 characters.  Python's
    ``ssl`` refuses any other ``server_hostname``, and trio hands an ASCII name to the
    resolver without that check."""
    try:
        if ":" in host:
            ipaddress.IPv6Address(host)
        elif host.startswith("."):
            return False
        else:
            host.encode("idna")
    except ValueError:  # UnicodeError is one
        return False
    return True


@lru_cache(maxsize=REDIRECTS_KEPT)
def _target(url: str, scheme: str) -> _Target | None:
    """Where an ``http://`` or ``https://`` URL's request goes (``scheme`` being the
    backend's), or None for one this client leaves to the fallback."""
    parts = urlsplit(url)
    if parts.scheme != scheme or "@" in parts.netloc:
        return None
    try:
        host, port = parts.hostname, parts.port or _DEFAULT_PORTS[scheme]
    except ValueError:
        return None
    path = parts.path or "/"
    if parts.query:  # a pre-signed URL's signature, an OAuth step's parameters
        path = f"{path}?{parts.query}"
    return target_of(scheme, host or "", port, path)


def _proxied(scheme: str, host: str) -> bool:
    """Whether the environment sends requests to ``host`` through a proxy."""
    proxy = urllib.request.getproxies_environment().get(scheme)
    return bool(proxy) and not urllib.request.proxy_bypass_environment(host)


def request_head(
    target: _Target,
    start: int,
    end: int,
    headers: Mapping[str, str],
    checksum: Checksum | None,
    s3: S3Client | None = None,
    signer: Signer | None = None,
) -> bytes:
    """The request for bytes ``[start, end)``: refmount's fixed headers, the checksum's
    condition, then the user's own (``Accept-Encoding`` is always identity); for S3
    its own headers and ``signer``'s signature over all of them.  Every header is checked once
    more as it is written (see :mod:`refmount.header_text`): one that would end its
    line is FetchError, never sent."""
    fields = [
        ("Host", target.host_header),
        ("Range", f"bytes={start}-{end - 1}"),
        ("Accept-Encoding", "identity"),
        ("User-Agent", _USER_AGENT),
        *{**checksums.http_conditions(checksum), **headers}.items(),
    ]
    if s3 is not None:
        fields += s3.extra_headers()
        if signer is not None:
            fields += signer.headers("GET", target.path.decode("ascii"), fields)
            _check_signable(fields)
    lines = [b"GET " + target.path + b" HTTP/1.1"]
    for name, value in fields:
        problem = header_text.name_problem(name) or header_text.value_problem(value)
        if problem is not None:
            shown = header_text.escaped(name, 40)
            raise FetchError(f"HTTP header {shown!r}: {problem}: not sent", errno.EIO)
        lines.append(f"{name}: {value}".encode("latin-1"))
    return b"\r\n".join(lines) + b"\r\n\r\n"


class HttpBackend:
    """Ranged GETs of one scope's ``http://`` URLs, or with ``tls`` its ``https://``
    ones, or with ``s3`` its ``s3://`` ones; everything else through ``fallback``."""

    def __init__(
        self,
        headers: Mapping[str, str],
        fallback: Backend,
        *,
        tls: ssl.SSLContext | None = None,
        s3: S3Client | None = None,
        buffers: BufferPool | None = None,
        logins: Logins | None = None,
    ) -> None:
        self.headers = _checked_headers(headers)
        #: .netrc credentials and cookies, for http:// and https:// (not S3's signed
        #: requests)
        self.logins = (logins or for_process()) if s3 is None else None
        self._authorized = any(name.lower() == "authorization" for name in self.headers)
        #: where bodies' buffers come from (the block cache's evicted parts')
        self.buffers = buffers if buffers is not None else BufferPool()
        self.fallback = fallback
        self.s3 = s3
        self.scheme = s3.scheme if s3 is not None else "https" if tls is not None else "http"
        opener = Connection.open
        if self.scheme == "https":
            if tls is None:
                raise ValueError("an https:// endpoint needs a TLS context")
            opener = functools.partial(Connection.open_tls, context=tls)
        self.pool = ConnectionPool(opener=opener)
        self._redirected: dict[str, None] = {}
        self._hosts_seen: set[tuple[str, int]] = set()

    async def read(self, url: str, start: int, end: int, checksum: Checksum | None = None) -> bytes:
        target = self._locate(url)
        if target is None or url in self._redirected:
            return await self.fallback.read(url, start, end, checksum)

        async def body(connection: Connection, head: Head) -> bytes:
            return await _body(url, connection, head, start, end, checksum, self.buffers)

        async def elsewhere() -> bytes:
            return await self.fallback.read(url, start, end, checksum)

        return await self._ask(url, target, start, end, checksum, body, elsewhere)

    async def size(self, url: str) -> int:
        """The size of an ``http://`` or ``https://`` file.  With a login in play
        (``.netrc`` credentials, cookies in the jar): the total of the ``Content-Range``
        of a one-byte GET, asked like a read (its redirects, cookies and credentials
        too; pre-signed URLs refuse HEAD).  Otherwise the fallback's HEAD."""
        target = self._locate(url)
        logins = self.logins
        in_play = logins is not None and (bool(logins.credentials) or bool(len(logins.jar)))
        if target is None or not in_play or url in self._redirected:
            return await self.fallback.size(url)

        async def total(connection: Connection, head: Head) -> int:
            return await _size_of(url, connection, head)

        async def elsewhere() -> int:
            return await self.fallback.size(url)

        return await self._ask(url, target, 0, 1, None, total, elsewhere)

    async def _ask(
        self,
        url: str,
        target: _Target,
        start: int,
        end: int,
        checksum: Checksum | None,
        answer: Callable[[Connection, Head], Awaitable[T]],
        elsewhere: Callable[[], Awaitable[T]],
    ) -> T:
        """Send the request for bytes ``[start, end)`` of ``url`` and make ``answer``
        of a data answer's head and body; a redirect is :class:`Redirected`, a 401 a
        refusal (EACCES), an S3 endpoint's redirect ``elsewhere()``."""
        if self.logins is not None and (why := self.logins.refusal(target.host)) is not None:
            raise FetchError(f"{why}; not asked again for a while", errno.EACCES)
        signer = None
        if self.s3 is not None and self.s3.credentials is not None:
            signer = await self.s3.credentials.signer()
            if signer is None:  # botocore's chain found none: as before, obstore looks
                return await elsewhere()
        headers = self._headers(url, target)
        request = request_head(target, start, end, headers, checksum, self.s3, signer)
        if (target.host, target.port) not in self._hosts_seen:
            self._hosts_seen.add((target.host, target.port))
            log.info(
                "%s://%s:%d: byte ranges through refmount's HTTP client%s",
                self.scheme, target.host, target.port, " (S3, SigV4)" if self.s3 else "",
            )  # fmt: skip
        connection = await self.pool.take(target.host, target.port)
        failure: Exception | None = None
        try:
            try:
                await connection.send(request)
                head = await connection.read_head()
            except (ConnectionLost, OSError, trio.BrokenResourceError) as exc:
                # A server may close an idle connection just as it is used again: then
                # nothing was answered, and the request goes once more on a new one.
                if not connection.reused or getattr(exc, "answered", False):
                    raise
                connection.close()
                connection = await self.pool.take_new(target.host, target.port)
                await connection.send(request)
                head = await connection.read_head()
            if self.logins is not None and head.cookies:
                self.logins.keep(url, list(head.cookies))
            if head.status in _REDIRECTS and self.s3 is not None:
                self._remember_redirect(url, head)
                connection.close()
                return await elsewhere()
            if head.status in _REDIRECTS:
                reusable = await _drained(connection, head)
                failure = Redirected(url, head.status, head.get("location"))
            elif head.status == 401 and self.logins is not None:
                reusable = await _drained(connection, head)
                failure = self._refused(target)
            else:
                value = await answer(connection, head)
                reusable = not connection.closed
        except BaseException:
            connection.close()
            raise
        if reusable and head.keeps_alive:
            self.pool.give_back(target.host, target.port, connection)
        else:
            connection.close()
        if failure is not None:
            raise failure
        return value

    def start(self, nursery: trio.Nursery) -> None:
        """Run the connection pool's expiry in ``nursery`` (see :mod:`.pool`)."""
        self.pool.start(nursery)

    def _headers(self, url: str, target: _Target) -> Mapping[str, str]:
        """The user's headers, with the host's ``.netrc`` credentials (unless the user
        gave an ``Authorization`` of their own) and the jar's cookies for ``url``."""
        logins = self.logins
        if logins is None:
            return self.headers
        extra = {}
        if not self._authorized and (basic := logins.basic(target.host)) is not None:
            extra["Authorization"] = basic
        if (cookie := logins.cookie(url)) is not None:
            extra["Cookie"] = cookie
        return {**self.headers, **extra} if extra else self.headers

    def _refused(self, target: _Target) -> FetchError:
        """A 401, final (a retry is refused the same: no storm of logins), saying what
        was sent.  A host that refused its .netrc credentials is not asked again for a
        while (``Logins.refusal``)."""
        host = target.host_header
        if self.logins is not None and self.logins.has_credentials(target.host):
            why = f"the login to {host} was refused (HTTP 401) with its .netrc credentials"
            if not self._authorized:
                self.logins.refused(target.host, why)
            return FetchError(why, errno.EACCES)
        if self._authorized:
            return FetchError(f"{host} refused the Authorization given for it (HTTP 401)",
                              errno.EACCES)  # fmt: skip
        return FetchError(f"{host} asks for a login (HTTP 401), and .netrc has no entry for it",
                          errno.EACCES)  # fmt: skip

    def _locate(self, url: str) -> _Target | None:
        if self.s3 is None:
            return _target(url, self.scheme)
        return _s3_target(self.s3, url)

    async def version(self, url: str) -> Version:
        return await self.fallback.version(url)

    async def prepare(self) -> None:
        if self.s3 is not None and self.s3.credentials is not None:
            await self.s3.credentials.signer()  # looked up ahead of the first read
        await self.fallback.prepare()

    async def signing(self) -> str | None:
        """Where this scope's S3 requests are signed from, looked up if not yet: the
        source, or why none could be had; None where nothing is signed (not S3,
        anonymous)."""
        if self.s3 is None or self.s3.credentials is None:
            return None
        try:
            found = await self.s3.credentials.signer()
        except FetchError as exc:
            return str(exc)
        if found is None:
            return "none found by botocore's chain (obstore looks for its own)"
        return self.s3.credentials.source

    def close(self) -> None:
        self.pool.close()
        self.fallback.close()

    def _remember_redirect(self, url: str, head: Head) -> None:
        if len(self._redirected) >= REDIRECTS_KEPT:
            self._redirected.pop(next(iter(self._redirected)))
        self._redirected[url] = None
        log.info(
            "%s: redirected (HTTP %d); its ranges are asked through %s",
            redact(url), head.status, type(self.fallback).__name__,
        )  # fmt: skip


async def _body(
    url: str,
    connection: Connection,
    head: Head,
    start: int,
    end: int,
    checksum: Checksum | None,
    buffers: BufferPool,
) -> bytearray:
    """The answer's body if it is the asked range (see the module's docstring), in a
    buffer from ``buffers`` that it fills to the last byte (or raises)."""
    status = head.status
    if status == 412 and checksum is not None:
        raise checksums.ChangedObject(url, "HTTP 412: precondition failed")
    if status == 404:
        raise FetchError(f"{redact(url)}: HTTP 404: not found", errno.EIO)
    if status not in (200, 206):
        raise HttpStatus(status)
    encoding = head.get("content-encoding")
    if encoding is not None and encoding.strip().lower() != "identity":
        raise WrongAnswer(f"the server answered with Content-Encoding {encoding[:40]!r}")
    length = head.framing()
    want = end - start
    if status == 200:
        if start != 0:
            raise WrongAnswer(f"a 200 (the whole object) for a range from byte {start}")
        size = min(length, want)
    else:
        size = _range_length(head, start, end, length)
    checksums.verify(url, checksum, etag=head.get("etag"), modified=_modified(head))
    data = buffers.take(size)
    with memoryview(data) as into:
        await connection.read_body(into)
    if status == 200 and size < length:
        connection.close()  # the rest of the object is not read
    return data


async def _drained(connection: Connection, head: Head) -> bool:
    """Read a small body (a redirect's, a refusal's) to its end, so that the connection
    can serve the next request; whether it can (a long or unframed body is left
    unread, and the connection must then be closed)."""
    try:
        length = head.framing()
    except Exception:
        return False
    if length > SMALL_BODY:
        return False
    with memoryview(bytearray(length)) as into:
        await connection.read_body(into)
    return True


async def _size_of(url: str, connection: Connection, head: Head) -> int:
    """The object's size from the answer to a one-byte GET: a 206's ``Content-Range``
    total, or a 200's length (the server ignored ``Range``; its body is left unread)."""
    if head.status == 404:
        raise FetchError(f"{redact(url)}: HTTP 404: not found", errno.EIO)
    if head.status not in (200, 206):
        raise HttpStatus(head.status)
    length = head.framing()
    if head.status == 200:
        connection.close()
        return length
    content_range = head.content_range()
    if content_range is None or content_range[2] is None:
        raise WrongAnswer("a 206 that tells no size (Content-Range total)")
    if not await _drained(connection, head):
        connection.close()
    return content_range[2]


@lru_cache(maxsize=REDIRECTS_KEPT)
def _s3_target(s3: S3Client, url: str) -> _Target | None:
    located = s3.locate(url)
    return None if located is None else target_of(s3.scheme, *located)


def _range_length(head: Head, start: int, end: int, length: int) -> int:
    """The body length of a 206 that answers ``[start, end)``: the whole range, or less
    only where the object ends first."""
    content_range = head.content_range()
    if content_range is None:
        raise WrongAnswer("a 206 without a Content-Range")
    first, last, total = content_range
    short_at_end = total is not None and last == total - 1 and last < end - 1
    if first != start or last < first or (last != end - 1 and not short_at_end):
        raise WrongAnswer(f"Content-Range {first}-{last} for the asked {start}-{end - 1}")
    if length != last - first + 1:
        raise WrongAnswer(f"a Content-Length of {length} for a range of {last - first + 1}")
    return length


def _modified(head: Head) -> object:
    value = head.get("last-modified")
    if value is None or not value.isascii():  # a date of ASCII digits only
        return None
    try:
        return email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None


def _check_signable(fields: Sequence[tuple[str, str]]) -> None:
    """FetchError for a header that a signed (SigV4) request cannot carry: one whose value
    is not ASCII.  SigV4 signs the UTF-8 of a value while HTTP sends its Latin-1 bytes,
    so the store would answer 403 to a signature over other bytes, naming no header.
    Options are refused at start (:func:`refmount.options.check_signed`); this is for
    what comes from the environment (``AWS_SESSION_TOKEN``)."""
    for name, value in fields:
        if not value.isascii():
            shown = header_text.escaped(name, 40)
            raise FetchError(f"HTTP header {shown!r}: not ASCII, cannot be signed (SigV4): "
                             "not sent", errno.EIO)  # fmt: skip


def _checked_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The user's headers (``--remote-options``), refused where a name or value could
    end the header line (a request of the caller's making, not the user's)."""
    checked: dict[str, str] = {}
    for name, value in headers.items():
        problem = header_text.name_problem(name) or header_text.value_problem(value)
        if problem is not None:
            shown = header_text.escaped(name, 40)
            raise ValueError(f"HTTP header {shown!r}: not a header line: {problem}")
        if name.lower() in ("accept-encoding", "range", "host", "content-length"):
            continue  # refmount's own
        checked[name] = value
    return checked

"""Byte ranges of HTTP(S), S3, GCS and Azure objects through obstore.

obstore (Rust's ``object_store`` behind Python bindings) does the requests, and receives
and assembles the bodies, in its own threads without the GIL: the Python left per read
is a handful of calls, where aiohttp handles every 64 KiB piece of a body in Python.

Ranged reads use obstore's synchronous calls in trio worker threads (at most
``threads`` at once): each call releases the GIL while Rust waits and reads, so a read
costs one hop to a worker and back.  The asynchronous calls would run on fsspec's
asyncio loop thread, and each of their steps (the request, each piece of the body, its
end) passes from obstore's runtime through that thread to trio: per 256 KiB read, 0.72
to 0.85 ms of the daemon's CPU against 0.57 to 0.62 in worker threads (W3 of
``bench/request_cost.py``, issue 15).  A worker thread cannot be cancelled: when the
fetcher's deadline passes, the read is abandoned to its thread, and obstore's own total
timeout (``request_timeout``: the fetcher's deadline plus a second, see ``make_backend``)
ends the request and closes its connection soon after.  Sizes (HEAD) are rare and stay
on the asyncio loop.

Bounds: a ranged GET is read as a stream whose pieces are gathered up to one byte more
than asked for, and dropped there, so a body that is too long (or endless) costs at most
the asked length plus one network read (and, for a moment, a second copy of that: the
pieces become one Python bytes object).  object_store refuses, before any body is read,
an answer that is not a 206 (a server ignoring Range), a 206 whose Content-Range is not
the range asked for, and one without a Content-Length (a chunked, possibly endless
body); it never asks for a compressed transfer encoding.

One store per protocol and bucket (S3, GCS), container (Azure) or scheme and host
(HTTP), made in a worker thread on first use: importing obstore and building a client
must not stall the serving loop.  URLs a store cannot address as a path (an HTTP URL
with a query string or user information) go to the fsspec backend.
"""

from __future__ import annotations

import errno
import importlib.util
import logging
import os
import re
import time
from collections.abc import Mapping
from types import ModuleType
from typing import Any
from urllib.parse import unquote, urlsplit

import trio

from refmount.errors import FetchError
from refmount.fetch import checksums
from refmount.fetch.backend import Backend, Version, sized, version_of
from refmount.fetch.buffers import BufferPool
from refmount.fetch.fsspec_backend import FsspecBackend, on_fsspec_loop
from refmount.fetch.http import HttpBackend
from refmount.fetch.http.s3 import s3_client
from refmount.fetch.obstore_options import (
    AZURE_PROTOCOLS,
    HTTP_PROTOCOLS,
    IDENTITY,
    OBSTORE_PROTOCOLS,
    RETRY_CONFIG,
    S3_PROTOCOLS,
    StoreConfig,
    Untranslatable,
    translate,
)
from refmount.fetch.trust import (
    TRUSTING_FSSPEC,
    Trust,
    certificate_failure,
    fsspec_options,
    split_options,
)
from refmount.redaction import redact
from refmount.refs.model import Checksum

log = logging.getLogger(__name__)

#: obstore's runtime threads let go of a request's Python objects just after it ends; an
#: interpreter that finalizes in that instant aborts (seen with obstore 0.12, with plain
#: asyncio too; 50 ms after the last request it never did in 30 tries).
SETTLE_SECONDS = 0.2
_STATUS = re.compile(r"status code: (\d{3})")


class ObstoreError(Exception):
    """A failed obstore request, in one line; ``status`` is the HTTP status when the
    store answered with one (the fetcher decides from it whether to retry)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


#: Seconds obstore's own timeout allows beyond the fetcher's deadline: the deadline
#: answers the reader first, the timeout then ends the abandoned request.
TIMEOUT_MARGIN = 1.0
#: Worker threads reading at once, when the fetcher does not say (its request limit,
#: twice: abandoned reads hold a thread until obstore's timeout ends them).
READ_THREADS = 128


def make_backend(
    protocol: str,
    options: Mapping[str, Any],
    choice: str = "auto",
    *,
    deadline: float | None = None,
    threads: int = READ_THREADS,
    buffers: BufferPool | None = None,
) -> Backend:
    """The backend for a remote protocol.

    ``auto``: ``http://``, ``https://`` and ``s3://`` ranges through refmount's own
    client (:mod:`refmount.fetch.http`; for S3 where it can sign and address the
    requests itself), which hands what it does not do itself to the backend ``obstore``
    would choose; ``obstore``: obstore where the protocol is one it serves,
    it is installed and every option translates, fsspec otherwise (with one log line
    saying why, when obstore was possible), and fsspec for HTTP(S) with headers of the
    user's (see :mod:`refmount.fetch.redirects`); ``fsspec``: fsspec always.
    ``deadline`` is the fetcher's deadline per attempt (None: none, obstore's default
    timeout stays), ``threads`` the worker threads obstore may read in at once.  Every
    backend verifies TLS against the same trust (:mod:`refmount.fetch.trust`)."""
    trust, options = split_options(options)
    fsspec_backend = FsspecBackend(protocol, fsspec_options(protocol, options, trust))
    if choice == "fsspec" or protocol not in OBSTORE_PROTOCOLS:
        return untrusting(fsspec_backend, trust)
    try:
        config = translate(protocol, options)
    except Untranslatable as exc:
        log.info("%s: byte ranges through fsspec: obstore has no equivalent for %s", protocol, exc)
        return untrusting(fsspec_backend, trust)
    config.client_options["root_certificate"] = trust.pem()
    backend: Backend = fsspec_backend
    if importlib.util.find_spec("obstore") is None:
        log.info("%s: byte ranges through fsspec: obstore is not installed", protocol)
    elif config.kind == "http" and set(config.client_options["default_headers"]) - {*IDENTITY}:
        # obstore follows redirects by itself, and sends such headers to any host.
        log.info("%s: byte ranges through fsspec: obstore would send headers across "
                 "redirects to other hosts", protocol)  # fmt: skip
    elif config.obstore_gap is not None:
        log.info("%s: obstore has no equivalent for %s: what refmount's client does not "
                 "do goes through fsspec", protocol, config.obstore_gap)  # fmt: skip
    else:
        timeout = None if deadline is None else deadline + TIMEOUT_MARGIN
        backend = ObstoreBackend(protocol, config, fsspec_backend, timeout, threads)
    if backend is fsspec_backend:
        untrusting(fsspec_backend, trust)
    if choice != "auto":
        return backend
    headers = config.client_options["default_headers"]
    if protocol == "http":
        return HttpBackend(headers, backend, buffers=buffers)
    if protocol == "https":
        return HttpBackend(headers, backend, tls=trust.context(), buffers=buffers)
    s3 = s3_client(config, deadline or 30.0) if protocol in S3_PROTOCOLS else None
    if s3 is not None:
        tls = trust.context() if s3.scheme == "https" else None
        return HttpBackend(headers, backend, tls=tls, s3=s3, buffers=buffers)
    return backend


def untrusting(backend: FsspecBackend, trust: Trust) -> FsspecBackend:
    """``backend``, saying in the log when the CA bundles of ``trust`` cannot reach it.

    fsspec's HTTP and S3 filesystems take a context or a CA file (see
    :func:`~refmount.fetch.trust.fsspec_options`); gcsfs and adlfs take none: gcsfs
    makes its aiohttp session from ``session_kwargs``, where only a connector (made on
    its own event loop, so not from options) could carry an SSL context, and adlfs makes
    its Azure client from the account URL and credential alone.  Both verify with
    aiohttp's default context: the system store, or the file ``SSL_CERT_FILE`` names in
    its place."""
    left_out = [b for b in trust.bundles if b != os.environ.get("SSL_CERT_FILE")]
    if left_out and backend.protocol not in TRUSTING_FSSPEC:
        log.warning(
            "%s: fsspec's filesystem for it takes no CA bundle: %s not trusted for its "
            "hosts (only the system store, or SSL_CERT_FILE instead of it); obstore "
            "trusts them where it serves %s",
            backend.protocol, ", ".join(left_out), backend.protocol,
        )  # fmt: skip
    return backend


class ObstoreBackend:
    """One protocol's obstore stores, one per bucket, container or host."""

    def __init__(
        self,
        protocol: str,
        config: StoreConfig,
        fallback: FsspecBackend,
        request_timeout: float | None = None,
        threads: int = READ_THREADS,
    ) -> None:
        self.protocol = protocol
        self.config = config
        self.fallback = fallback
        self.request_timeout = request_timeout
        self._threads = trio.CapacityLimiter(threads)
        self._obstore: ModuleType | None = None
        self._stores: dict[str, Any] = {}
        self._making: dict[str, trio.Event] = {}
        self._last_request = -SETTLE_SECONDS

    async def read(self, url: str, start: int, end: int, checksum: Checksum | None = None) -> bytes:
        target = self._target(url)
        if target is None:
            return await self.fallback.read(url, start, end, checksum)
        store, path = await self._store(target[0]), target[1]
        assert self._obstore is not None
        try:
            data: bytes = await trio.to_thread.run_sync(
                _ranged_get, self._obstore, store, path, start, end, (url, checksum),
                limiter=self._threads, abandon_on_cancel=True,
            )  # fmt: skip
        except Exception as exc:
            raise _translated(exc, url, self._host(url)) from None
        finally:
            self._last_request = time.monotonic()
        return data

    async def size(self, url: str) -> int:
        meta = await self._metadata(url)
        if meta is None:
            return await self.fallback.size(url)
        size = meta.get("size")
        if not isinstance(size, int) or size < 0:
            raise FetchError(f"{redact(url)}: the store gives no size")
        return size

    async def version(self, url: str) -> Version:
        meta = await self._metadata(url)
        if meta is None:
            return await self.fallback.version(url)
        modified = _modified(meta)
        validator = version_of(
            etag=meta.get("e_tag"),
            generation=meta.get("version"),
            size=meta.get("size"),
            modified=None if modified is None else modified.isoformat(),
        )
        return Version(validator, sized(meta.get("size")), meta.get("e_tag"), modified)

    async def _metadata(self, url: str) -> dict[str, Any] | None:
        """The object's metadata from a HEAD, or None where fsspec must be asked instead
        (a protocol obstore does not serve; a server refusing HEAD or sending no length,
        which fsspec asks with a GET too)."""
        target = self._target(url)
        if target is None:
            return None
        store, path = await self._store(target[0]), target[1]
        assert self._obstore is not None
        try:
            return await on_fsspec_loop(_head(self._obstore, store, path))
        except Exception as exc:
            if not _head_unusable(exc):
                raise _translated(exc, url, self._host(url)) from None
            log.debug("%s: no answer from HEAD (%s); asking fsspec", redact(url), _first_line(exc))
            return None
        finally:
            self._last_request = time.monotonic()

    async def prepare(self) -> None:
        await self._import()

    def close(self) -> None:
        """Drop the stores; first give obstore's threads the moment they need after the
        last request, so that a process exiting right after this does not abort."""
        settle = self._last_request + SETTLE_SECONDS - time.monotonic()
        if settle > 0:
            time.sleep(settle)
        self._stores.clear()
        self.fallback.close()

    def _host(self, url: str) -> str:
        """The host a request for ``url`` goes to, as errors name it."""
        endpoint = self.config.config.get("endpoint") or self.config.config.get("base_url")
        return urlsplit(str(endpoint) if endpoint else url).netloc

    # -- stores ---------------------------------------------------------------------------

    def _target(self, url: str) -> tuple[str, str] | None:
        """(store key, path in that store) for ``url``, or None for the fsspec backend."""
        parts = urlsplit(url)
        if self.protocol in HTTP_PROTOCOLS:
            if parts.query or parts.fragment or "@" in parts.netloc or not parts.hostname:
                return None
            path = unquote(parts.path).lstrip("/")
            return (f"{parts.scheme}://{parts.netloc}", path) if path else None
        path = parts.path.lstrip("/")
        if not parts.netloc or not path or parts.query or parts.fragment:
            return None
        return parts.netloc, path

    async def _import(self) -> ModuleType:
        if self._obstore is None:
            self._obstore = await trio.to_thread.run_sync(importlib.import_module, "obstore")
        return self._obstore

    async def _store(self, key: str) -> Any:
        while (store := self._stores.get(key)) is None:
            making = self._making.get(key)
            if making is not None:
                await making.wait()
                continue
            self._making[key] = making = trio.Event()
            try:
                await self._import()
                self._stores[key] = await trio.to_thread.run_sync(self._make_store, key)
            except Exception as exc:
                raise FetchError(f"{self.protocol}://{key}: no obstore store: {exc}") from exc
            finally:
                del self._making[key]
                making.set()
        return store

    def _make_store(self, key: str) -> Any:
        """A store for one bucket, container or host.  Runs in a worker thread."""
        from obstore.store import AzureStore, GCSStore, HTTPStore, S3Store

        config = self.config
        client_options = dict(config.client_options)
        if self.request_timeout is not None:
            # Reads run in threads a deadline abandons: the request must end by itself.
            client_options["timeout"] = f"{round(self.request_timeout * 1000)}ms"
        common: dict[str, Any] = {
            "client_options": client_options,
            "retry_config": dict(RETRY_CONFIG),
        }
        if config.kind == "http":
            store = HTTPStore.from_url(key, **common)
        elif config.kind == "s3":
            store = S3Store(key, config=dict(config.config), **common)
        elif config.kind == "gcs":
            token = config.bearer_token
            provider = None if token is None else lambda: {"token": token, "expires_at": None}
            settings = dict(config.config)
            store = GCSStore(key, config=settings, credential_provider=provider, **common)
        else:
            container, _, host = key.partition("@")
            settings = dict(config.config)
            if host and self.protocol in AZURE_PROTOCOLS:
                settings.setdefault("account_name", host.split(".", 1)[0])
            store = AzureStore(container, config=settings, **common)
        shown = key if config.kind == "http" else f"{self.protocol}://{key}"
        log.info("%s: byte ranges through obstore", shown)
        return store


def _ranged_get(
    obstore: ModuleType,
    store: Any,
    path: str,
    start: int,
    end: int,
    checked: tuple[str, Checksum | None],
) -> bytes:
    """Bytes ``[start, end)`` (fewer where the object ends), holding at most one network
    read more than ``end - start + 1`` bytes.  Runs in a worker thread (obstore's calls
    release the GIL while they wait).

    ``checked`` is the object's URL and the checksum its version must match, if any: the
    request is conditional on it, and the answer's metadata must name the same version
    (a server may ignore the condition).

    The body must be exactly the range the store's Content-Range names (object_store has
    checked that it is the asked one, cut at the object's end), uncompressed.  A 200 (the
    whole object: the server ignores Range) is refused by object_store; for a range from
    byte 0 its first bytes are the right ones, so the object is asked again without a
    range and read only as far as needed."""
    want = end - start
    url, checksum = checked
    conditions = _conditions(checksum)
    try:
        result = obstore.get(store, path, options={"range": (start, end), **conditions})
        exact = True
    except obstore.exceptions.NotSupportedError:
        if start != 0:
            raise
        result = obstore.get(store, path, options=conditions)
        exact = False
    meta = result.meta
    checksums.verify(url, checksum, etag=meta.get("e_tag"), modified=_modified(meta))
    return _gathered(result, want, exact=exact)


def _conditions(checksum: Checksum | None) -> dict[str, Any]:
    """obstore's get options asking for the version ``checksum`` names only."""
    if checksum is None:
        return {}
    if checksum.etag is not None:
        return {"if_match": checksum.etag}
    since = checksums.unmodified_since(checksum)
    return {} if since is None else {"if_unmodified_since": since}


def _modified(meta: Mapping[str, Any]) -> Any:
    """The object's modification time, None where object_store stands in for a missing
    Last-Modified with the epoch."""
    modified = meta.get("last_modified")
    return None if modified is None or modified.timestamp() == 0 else modified


def _gathered(result: Any, want: int, *, exact: bool) -> bytes:
    """The body of ``result``: exactly its range (``exact``), or its first ``want`` bytes."""
    encoding = result.attributes.get("Content-Encoding", "identity")
    if encoding.strip().lower() != "identity":
        raise ObstoreError(f"the store answered with Content-Encoding {encoding[:40]!r}")
    first, stop = result.range
    expected = min(stop - first, want)
    pieces: list[bytes] = []
    held = 0
    for piece in result.stream(min_chunk_size=expected + 1):
        pieces.append(piece)
        held += len(piece)
        if held > expected:
            break  # too long: dropping the stream closes the connection
    if exact and held != expected:
        raise ObstoreError(f"the store's body has {held} bytes for a range of {expected}")
    data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    return data if exact or held <= want else data[:want]


async def _head(obstore: ModuleType, store: Any, path: str) -> Any:
    return await obstore.head_async(store, path)


def _translated(exc: Exception, url: str, host: str) -> Exception:
    """obstore's exception as one the fetcher maps to the right errno: a missing object
    is EIO (a key of the reference set is never "no such file"), refused access EACCES,
    an HTTP status keeps its number (retried where the fetcher retries it), a refused
    certificate names ``host`` and why (not "error sending request")."""
    failure = certificate_failure(exc, host)
    if failure is not None:
        return failure
    from obstore.exceptions import (
        BaseError,
        PermissionDeniedError,
        PreconditionError,
        UnauthenticatedError,
    )

    if isinstance(exc, PreconditionError):
        return checksums.ChangedObject(url, "HTTP 412: precondition failed")
    if isinstance(exc, FileNotFoundError):  # object_store says so for a 404 and a 405
        status = _STATUS.search(str(exc))
        code = status.group(1) if status else "404"
        what = "HTTP 404: not found" if code == "404" else f"HTTP {code}"
        return FetchError(f"{redact(url)}: {what}", errno.EIO)
    if isinstance(exc, PermissionDeniedError | UnauthenticatedError):
        status = _STATUS.search(str(exc))
        what = f"HTTP {status.group(1)}" if status else "access denied"
        return FetchError(f"{redact(url)}: {what}", errno.EACCES)
    if isinstance(exc, BaseError):
        status = _STATUS.search(str(exc))
        if status:
            return ObstoreError(f"HTTP {status.group(1)}", int(status.group(1)))
        return ObstoreError(f"{type(exc).__name__}: {_first_line(exc)}")
    return exc


def _head_unusable(exc: Exception) -> bool:
    """Whether a failed HEAD says nothing about the object: refused (405, which
    object_store reports as "not found") or answered without a usable Content-Length."""
    text = str(exc)
    status = _STATUS.search(text)
    if status is not None:
        return status.group(1) == "405"
    return "Content-Length" in _first_line(exc)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""

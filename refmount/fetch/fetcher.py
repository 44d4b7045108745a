"""Remote byte ranges from trio: deadlines, retries and length checks for every backend.

Each protocol is served by one backend (:mod:`refmount.fetch.backend`): local files by
:class:`LocalBackend`, everything else by :class:`FsspecBackend`.  The fetcher wraps every
request the same way, whichever backend moves the bytes: a deadline per attempt, bounded
requests in flight (all hosts, and per host), transient failures retried with jittered
exponential backoff, and every answer's length checked: a store that returns more or
fewer bytes than asked is an error, never data.
"""

from __future__ import annotations

import errno
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import fsspec
import trio

from refmount.errors import FetchError
from refmount.fetch.backend import Backend
from refmount.fetch.local import LOCAL_PROTOCOLS, LocalBackend
from refmount.fetch.obstore_backend import make_backend

log = logging.getLogger(__name__)

_RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
T = TypeVar("T")


@dataclass
class FetchPolicy:
    """How patient refmount is with remote stores."""

    timeout: float = 30.0  # seconds for one attempt
    retries: int = 3  # further attempts after the first
    backoff: float = 0.2  # first backoff, seconds; doubles each retry, jittered
    max_requests: int = 64  # requests in flight, all hosts together
    max_requests_per_host: int = 32


@dataclass
class FetchStats:
    """Live counters, shown on the mount's root as extended attributes."""

    requests: int = 0
    bytes_fetched: int = 0
    retries: int = 0
    errors: int = 0
    local_nowait_reads: int = 0  # requests answered from memory on the serving thread

    def as_dict(self) -> dict[str, int]:
        return {
            "requests": self.requests,
            "bytes_fetched": self.bytes_fetched,
            "retries": self.retries,
            "errors": self.errors,
            "local_nowait_reads": self.local_nowait_reads,
        }


class _Retry(Exception):
    """An attempt failed in a way that may succeed if tried again."""


def redact(url: str) -> str:
    """The URL without user information or query string, for logs and xattrs."""
    parts = urlsplit(url)
    if not parts.scheme or parts.scheme in LOCAL_PROTOCOLS:
        return url
    netloc = parts.hostname or ""
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def protocol_of(url: str) -> str:
    protocol, _ = fsspec.core.split_protocol(url)
    return protocol or "file"


@dataclass
class Fetcher:
    """Fetches byte ranges and sizes of remote files named by full URLs.

    ``remote_options`` maps a protocol to the fsspec storage options of its filesystem.
    """

    remote_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    policy: FetchPolicy = field(default_factory=FetchPolicy)
    stats: FetchStats = field(default_factory=FetchStats)
    backend: str = "auto"  # "auto": obstore where it serves the protocol; "fsspec": never

    def __post_init__(self) -> None:
        self._local = LocalBackend()
        self._backends: dict[str, Backend] = {}
        self._hosts: dict[str, trio.CapacityLimiter] = {}
        self._all = trio.CapacityLimiter(self.policy.max_requests)
        self._sizes: dict[str, int] = {}
        self._logged: set[tuple[str, str]] = set()

    # -- public ---------------------------------------------------------------------------

    async def fetch(self, url: str, start: int, end: int, *, allow_short: bool = False) -> bytes:
        """Bytes ``[start, end)`` of ``url``.

        Exactly ``end - start`` bytes, or with ``allow_short`` fewer when the file ends
        before ``end`` (read-ahead past a file's end); never more.
        """
        if end <= start:
            return b""
        want = end - start

        async def attempt(backend: Backend) -> bytes:
            data = await backend.read(url, start, end)
            if len(data) > want or (len(data) < want and not allow_short):
                raise _Retry(f"asked for {want} bytes at offset {start}, got {len(data)}")
            return data

        data = await self._with_retries(url, attempt)
        self.stats.bytes_fetched += len(data)
        return data

    def try_now(self, url: str, start: int, end: int) -> bytes | None:
        """Bytes ``[start, end)`` if they can be had without waiting (a local file read
        before, its pages in memory), else None: then :meth:`fetch`."""
        if protocol_of(url) not in LOCAL_PROTOCOLS:
            return None
        data = self._local.try_now(url, start, end)
        if data is not None:
            self.stats.requests += 1
            self.stats.local_nowait_reads += 1
            self.stats.bytes_fetched += len(data)
        return data

    def close(self) -> None:
        """Release what the backends hold open."""
        for backend in {id(b): b for b in (self._local, *self._backends.values())}.values():
            backend.close()

    def known_size(self, url: str) -> int | None:
        """The size of a whole remote file if it has been asked already."""
        return self._sizes.get(url)

    async def size(self, url: str) -> int:
        """The size of a whole remote file, asked once and remembered."""
        known = self._sizes.get(url)
        if known is not None:
            return known
        size = await self._with_retries(url, lambda backend: backend.size(url))
        self._sizes[url] = size
        return size

    async def prepare(self, protocols: Iterable[str]) -> None:
        """Make the backends of these protocols, and their sessions, ahead of the first
        read: importing aiohttp or s3fs and opening a session takes from a few tenths of
        a second to seconds, which the first read would otherwise wait for.  Failures
        are left for that read to report."""
        for protocol in protocols:
            try:
                with trio.fail_after(self.policy.timeout):
                    await self._backend(protocol).prepare()
            except Exception as exc:  # the first read reports it
                log.debug("could not prepare %s ahead of reads: %s", protocol, exc)

    # -- machinery ------------------------------------------------------------------------

    def _backend(self, protocol: str) -> Backend:
        if protocol in LOCAL_PROTOCOLS:
            return self._local
        backend = self._backends.get(protocol)
        if backend is None:
            backend = self._backends[protocol] = make_backend(
                protocol, self._options_for(protocol), self.backend
            )
        return backend

    def _options_for(self, protocol: str) -> dict[str, Any]:
        """The fsspec storage options of a protocol: those given for it by name, else
        those given for every remote protocol (``"*"``)."""
        options = dict(self.remote_options.get(protocol, self.remote_options.get("*", {})))
        if protocol == "s3":
            # botocore keeps 10 connections unless told otherwise; match our concurrency.
            config = dict(options.get("config_kwargs", {}))
            config.setdefault("max_pool_connections", self.policy.max_requests_per_host)
            options["config_kwargs"] = config
        return options

    def _host_limiter(self, url: str, protocol: str) -> trio.CapacityLimiter:
        host = f"{protocol}://{urlsplit(url).netloc}"
        limiter = self._hosts.get(host)
        if limiter is None:
            limiter = self._hosts[host] = trio.CapacityLimiter(self.policy.max_requests_per_host)
        return limiter

    async def _with_retries(self, url: str, attempt: Callable[[Backend], Awaitable[T]]) -> T:
        protocol = protocol_of(url)
        backend = self._backend(protocol)
        host_limiter = self._host_limiter(url, protocol)
        policy = self.policy
        for n in range(policy.retries + 1):
            if n:
                self.stats.retries += 1
                delay = policy.backoff * 2 ** (n - 1)
                await trio.sleep(delay * random.uniform(0.5, 1.5))
            try:
                async with self._all, host_limiter:
                    self.stats.requests += 1
                    with trio.fail_after(policy.timeout):
                        return await attempt(backend)
            except trio.TooSlowError:
                reason = f"no answer within {policy.timeout:g} s"
            except _Retry as exc:
                reason = str(exc)
            except FetchError as exc:
                self._fail(url, str(exc))
                raise
            except Exception as exc:
                err, retry, reason = classify(exc)
                if not retry:
                    self._fail(url, reason)
                    raise FetchError(f"{redact(url)}: {reason}", err) from exc
            log.debug("attempt %d on %s failed: %s", n + 1, redact(url), reason)
        self._fail(url, reason)
        raise FetchError(f"{redact(url)}: {reason} (after {policy.retries + 1} attempts)")

    def _fail(self, url: str, reason: str) -> None:
        self.stats.errors += 1
        # Log each distinct failure once, not once per READ; bound what we remember.
        key = (url, reason.split(",")[0][:80])
        if key not in self._logged:
            if len(self._logged) > 10_000:
                self._logged.clear()
            self._logged.add(key)
            log.warning("remote read failed: %s: %s", redact(url), reason)


def classify(exc: BaseException) -> tuple[int, bool, str]:
    """(errno for the reader, whether to retry, a short reason) for a failed attempt."""
    if isinstance(exc, FileNotFoundError):
        return errno.ENOENT, False, "not found"
    if isinstance(exc, PermissionError):
        return errno.EACCES, False, "access denied"
    if "credential" in type(exc).__name__.lower():
        return errno.EACCES, False, f"no usable credentials ({type(exc).__name__})"
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    if isinstance(status, int) and 400 <= status < 600:
        if status in (401, 403):
            return errno.EACCES, False, f"HTTP {status}"
        if status == 404:
            return errno.ENOENT, False, "HTTP 404"
        if status == 416:
            return errno.EIO, False, "HTTP 416: range not satisfiable"
        return errno.EIO, status in _RETRYABLE_STATUS or status >= 500, f"HTTP {status}"
    return errno.EIO, True, f"{type(exc).__name__}: {exc}"[:300]

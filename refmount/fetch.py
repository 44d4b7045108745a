"""Remote byte ranges through fsspec, from trio: deadlines, retries, length checks.

fsspec's asynchronous filesystems (HTTP, S3, GCS ...) run on fsspec's own asyncio loop
thread.  A request is submitted to that loop and its completion is handed back to trio
through the trio token, so no thread is spent per request and a trio cancel scope (the
deadline) cancels the asyncio task.  Synchronous filesystems (local files, memory) run in
trio's worker threads.

Every request has a deadline, transient failures are retried with jittered exponential
backoff, and every answer's length is checked: a store that returns more or fewer bytes
than asked is an error, never data.

Local files have a fast path: a small read whose pages are already in memory is one
``preadv(RWF_NOWAIT)`` on the serving thread, on a descriptor kept open from an earlier
read, instead of a worker thread that opens, reads and closes (about half a millisecond
on a small machine, most of a random chunk read).  Anything the kernel cannot answer at
once (pages not cached, a short read) takes the ordinary path, with its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import random
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import fsspec
import fsspec.asyn
import trio

from refmount.errors import FetchError

log = logging.getLogger(__name__)

LOCAL_PROTOCOLS = frozenset({"file", "local"})
NOWAIT_MAX = 1 << 20  # the largest local read tried on the serving thread
OPEN_LOCAL_FILES = 256  # descriptors kept open for the fast path
_RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


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


class _OpenLocalFiles:
    """Descriptors of local files read before, by URL, least recently used first.

    Used, added and closed only on the serving thread, so no descriptor is ever closed
    (and its number reused) while a read uses it.
    """

    def __init__(self, limit: int = OPEN_LOCAL_FILES) -> None:
        self.limit = limit
        self._fds: OrderedDict[str, int] = OrderedDict()

    def read_now(self, url: str, start: int, end: int) -> bytes | None:
        """Bytes ``[start, end)`` if the kernel has them all in memory, else None."""
        fd = self._fds.get(url)
        if fd is None:
            return None
        self._fds.move_to_end(url)
        buffer = bytearray(end - start)
        try:
            got = os.preadv(fd, [buffer], start, os.RWF_NOWAIT)
        except OSError:  # EAGAIN: not all in memory; EOPNOTSUPP: a filesystem without it
            return None
        return bytes(buffer) if got == len(buffer) else None

    def add(self, url: str, fd: int) -> None:
        if url in self._fds:
            os.close(fd)
            return
        self._fds[url] = fd
        while len(self._fds) > self.limit:
            os.close(self._fds.popitem(last=False)[1])

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])


@dataclass
class _Target:
    fs: Any
    limiter: trio.CapacityLimiter


@dataclass
class Fetcher:
    """Fetches byte ranges and sizes of remote files named by full URLs.

    ``remote_options`` maps a protocol to the fsspec storage options of its filesystem.
    """

    remote_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    policy: FetchPolicy = field(default_factory=FetchPolicy)
    stats: FetchStats = field(default_factory=FetchStats)

    def __post_init__(self) -> None:
        self._filesystems: dict[str, Any] = {}
        self._making: dict[str, trio.Event] = {}  # filesystems being made, by protocol
        self._hosts: dict[str, trio.CapacityLimiter] = {}
        self._all = trio.CapacityLimiter(self.policy.max_requests)
        self._sizes: dict[str, int] = {}
        self._logged: set[tuple[str, str]] = set()
        self._local = _OpenLocalFiles()

    # -- public ---------------------------------------------------------------------------

    async def fetch(
        self,
        url: str,
        start: int,
        end: int,
        *,
        allow_short: bool = False,
        from_memory: bool = True,
    ) -> bytes:
        """Bytes ``[start, end)`` of ``url``.

        Exactly ``end - start`` bytes, or with ``allow_short`` fewer when the file ends
        before ``end`` (read-ahead past a file's end); never more.  ``from_memory=False``
        skips the local fast path, for a caller whose ``fetch_now`` just said no.
        """
        if end <= start:
            return b""
        want = end - start
        if from_memory and want <= NOWAIT_MAX:
            data = self._read_now(url, start, end)
            if data is not None:
                return data

        async def attempt(fs: Any, path: str) -> bytes:
            if fs.async_impl:
                data = await self._on_fsspec_loop(fs._cat_file(path, start=start, end=end))
            elif protocol_of(url) in LOCAL_PROTOCOLS:
                data, fd = await trio.to_thread.run_sync(
                    _read_local, path, start, end, abandon_on_cancel=True
                )
                self._local.add(url, fd)
            else:
                data = await trio.to_thread.run_sync(
                    fs.cat_file, path, start, end, abandon_on_cancel=True
                )
            if len(data) > want or (len(data) < want and not allow_short):
                raise _Retry(f"asked for {want} bytes at offset {start}, got {len(data)}")
            return data

        data = await self._with_retries(url, attempt)
        self.stats.bytes_fetched += len(data)
        return data

    def fetch_now(self, url: str, start: int, end: int) -> bytes | None:
        """Bytes ``[start, end)`` of a local file read before, if they are in memory now:
        an answer without waiting, or None (then ``fetch``)."""
        return self._read_now(url, start, end)

    def _read_now(self, url: str, start: int, end: int) -> bytes | None:
        data = self._local.read_now(url, start, end)
        if data is not None:
            self.stats.requests += 1
            self.stats.local_nowait_reads += 1
            self.stats.bytes_fetched += len(data)
        return data

    def close(self) -> None:
        """Close the local files held open for the fast path."""
        self._local.close()

    def known_size(self, url: str) -> int | None:
        """The size of a whole remote file if it has been asked already."""
        return self._sizes.get(url)

    async def size(self, url: str) -> int:
        """The size of a whole remote file, asked once and remembered."""
        known = self._sizes.get(url)
        if known is not None:
            return known

        async def attempt(fs: Any, path: str) -> int:
            if fs.async_impl:
                info = await self._on_fsspec_loop(fs._info(path))
            else:
                info = await trio.to_thread.run_sync(fs.info, path, abandon_on_cancel=True)
            if info.get("type") == "directory":
                raise FileNotFoundError(f"{path} is a directory")
            size = info.get("size")
            if not isinstance(size, int) or size < 0:
                raise FetchError(f"the store gives no size for {redact(url)}")
            return size

        size = await self._with_retries(url, attempt)
        self._sizes[url] = size
        return size

    async def prepare(self, protocols: Iterable[str]) -> None:
        """Make the filesystems of these protocols, and their sessions, ahead of the
        first read: importing aiohttp or s3fs and opening a session takes from a few
        tenths of a second to seconds, which the first read would otherwise wait for.
        Failures are left for that read to report."""
        for protocol in protocols:
            try:
                fs = await self._filesystem(protocol)
                if fs.async_impl and hasattr(fs, "set_session"):
                    with trio.fail_after(self.policy.timeout):
                        await self._on_fsspec_loop(fs.set_session())
            except Exception as exc:  # the first read reports it
                log.debug("could not prepare %s ahead of reads: %s", protocol, exc)

    # -- machinery ------------------------------------------------------------------------

    async def _filesystem(self, protocol: str) -> Any:
        """The protocol's filesystem, made once, in a worker thread: the imports behind
        it must not stall the requests this loop is serving meanwhile."""
        while (fs := self._filesystems.get(protocol)) is None:
            making = self._making.get(protocol)
            if making is not None:
                await making.wait()
                continue
            making = self._making[protocol] = trio.Event()
            try:
                fs = await trio.to_thread.run_sync(self._make_filesystem, protocol)
                self._filesystems[protocol] = fs
            finally:
                del self._making[protocol]
                making.set()
        return fs

    async def _target(self, url: str) -> tuple[Any, str, trio.CapacityLimiter]:
        protocol = protocol_of(url)
        fs = self._filesystems.get(protocol) or await self._filesystem(protocol)
        host = f"{protocol}://{urlsplit(url).netloc}"
        limiter = self._hosts.get(host)
        if limiter is None:
            limiter = self._hosts[host] = trio.CapacityLimiter(self.policy.max_requests_per_host)
        return fs, fs._strip_protocol(url), limiter

    def _make_filesystem(self, protocol: str) -> Any:
        """The filesystem for a protocol, with its options: those given for it by name,
        else those given for every remote protocol (``"*"``)."""
        fallback = {} if protocol in LOCAL_PROTOCOLS else self.remote_options.get("*", {})
        options = dict(self.remote_options.get(protocol, fallback))
        if protocol == "s3":
            # botocore keeps 10 connections unless told otherwise; match our concurrency.
            config = dict(options.get("config_kwargs", {}))
            config.setdefault("max_pool_connections", self.policy.max_requests_per_host)
            options["config_kwargs"] = config
        try:
            return fsspec.filesystem(protocol, **options)
        except (ImportError, ValueError) as exc:
            raise FetchError(f"no filesystem for protocol {protocol!r}: {exc}") from exc

    async def _with_retries(self, url: str, attempt: Callable[[Any, str], Awaitable[Any]]) -> Any:
        fs, path, host_limiter = await self._target(url)
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
                        return await attempt(fs, path)
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

    @staticmethod
    async def _on_fsspec_loop(coro: Any) -> Any:
        """Await a coroutine on fsspec's asyncio loop; cancelling this cancels it there."""
        future = asyncio.run_coroutine_threadsafe(coro, fsspec.asyn.get_loop())
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()

        def wake(_: object) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(done.set)

        future.add_done_callback(wake)
        try:
            await done.wait()
        except BaseException:
            future.cancel()
            raise
        return future.result()


def _read_local(path: str, start: int, end: int) -> tuple[bytes, int]:
    """Bytes ``[start, end)`` of a local file (fewer at its end), and the descriptor it
    was read through, for the fast path to keep.  Runs in a worker thread."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        pieces = []
        while start < end and (piece := os.pread(fd, end - start, start)):
            pieces.append(piece)
            start += len(piece)
        return b"".join(pieces), fd
    except BaseException:
        os.close(fd)
        raise


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

"""Remote byte ranges from trio: deadlines, retries and length checks for every backend.

Each protocol (or host with options of its own) is served by one backend
(:mod:`refmount.fetch.backend`): local files by :class:`LocalBackend`; http, https and
s3 by refmount's own client (:mod:`refmount.fetch.http`); gs and az by obstore where
it can serve them (:mod:`refmount.fetch.obstore_backend`), everything else by
:class:`FsspecBackend`; with ``--fetch-workers`` the remote ones run in worker processes
(:mod:`refmount.workers.fetching`).  The fetcher wraps every
request the same way, whichever backend moves the bytes: a deadline per attempt, bounded
requests in flight (all hosts, and per host), transient failures retried with jittered
exponential backoff, and every answer's length checked: a store that returns more or
fewer bytes than asked is an error, never data.  A read of a reference with a checksum
serves only bytes of the version it names (:mod:`refmount.fetch.checksums`); any other
answer fails at once, without retries.
"""

from __future__ import annotations

import errno
import functools
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

import fsspec
import trio

from refmount.authority import authority_problem, place_of
from refmount.errors import FetchError
from refmount.fetch import redirects
from refmount.fetch.backend import MAX_FILE_SIZE, Backend, Version, WrongAnswer
from refmount.fetch.buffers import BufferPool
from refmount.fetch.checksums import ChangedObject
from refmount.fetch.http import HttpBackend
from refmount.fetch.local import LocalBackend
from refmount.fetch.logins import Logins, for_process
from refmount.fetch.obstore_backend import make_backend
from refmount.fetch.trust import certificate_failure
from refmount.protocols import LOCAL_PROTOCOLS
from refmount.redaction import redact
from refmount.refs.model import Checksum

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
    #: the counters of the processes remote requests run in (``--fetch-workers``)
    workers: Callable[[], dict[str, Any]] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "bytes_fetched": self.bytes_fetched,
            "retries": self.retries,
            "errors": self.errors,
            "local_nowait_reads": self.local_nowait_reads,
            **(self.workers() if self.workers is not None else {}),
        }


#: URLs whose protocol and scope are remembered: a request asks for them several times,
#: and most reference sets point into few remote files.
URL_MEMO = 4096


@functools.lru_cache(maxsize=URL_MEMO)
def protocol_of(url: str) -> str:
    protocol, _ = fsspec.core.split_protocol(url)
    return protocol or "file"


FLAT = "*"  # remote options given flat, for the one remote host of the set (see confine)


@dataclass
class Fetcher:
    """Fetches byte ranges and sizes of remote files named by full URLs.

    ``remote_options`` holds fsspec storage options by *scope*: a protocol (``"s3"``,
    applies to every host of it), a protocol and host (``"https://data.example.org"``,
    ``"s3://bucket"``; applies only there, and wins over the protocol's entry key by key)
    or a URL prefix (``"s3://bucket/data/"``, an Icechunk virtual chunk container; applies
    only to URLs under it, over its host's entry).
    Options given flat (``FLAT``) apply to no host until :meth:`confine_flat_options`
    has bound them to the one remote host of the reference set.  A host never receives
    options given for another, so a bearer token for one server is never sent to the
    other servers a reference set names.
    """

    remote_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    policy: FetchPolicy = field(default_factory=FetchPolicy)
    stats: FetchStats = field(default_factory=FetchStats)
    #: "auto": refmount's own client for http://, https:// and s3://, obstore where it
    #: serves the protocol; "obstore": obstore for those too; "fsspec": fsspec always
    #: (see make_backend)
    backend: str = "auto"
    #: What makes a remote scope's backend: :func:`make_backend` in this process, or
    #: the same call in the fetch worker processes (``FetchWorkers.backend``).
    make_remote: Callable[..., Backend] = make_backend
    #: Where backends that receive bodies into buffers of their own take them: the
    #: block cache gives its evicted parts' buffers back to it (it sets the limit).
    #: None where no backend of this process receives bodies (fetch worker processes).
    buffers: BufferPool | None = field(default_factory=BufferPool)
    #: the process's .netrc credentials, cookies and login lock
    logins: Logins = field(default_factory=for_process)

    def __post_init__(self) -> None:
        self._local = LocalBackend()
        self._backends: dict[str, Backend] = {}
        self._hosts: dict[str, trio.CapacityLimiter] = {}
        self._all = trio.CapacityLimiter(self.policy.max_requests)
        self._sizes: dict[str, int] = {}
        self._logged: set[tuple[str, str]] = set()
        #: where reads were redirected to, asked there directly for a while
        self._moved = redirects.Remembered()
        self._nursery: trio.Nursery | None = None
        self.remote_options = {
            key if key == FLAT or "://" not in key or is_prefix(key) else scope_of(key): dict(value)
            for key, value in self.remote_options.items()
        }
        #: the URL prefixes given options of their own, longest first
        self._prefixes = sorted(filter(is_prefix, self.remote_options), key=len, reverse=True)

    # -- public ---------------------------------------------------------------------------

    def start(self, nursery: trio.Nursery) -> None:
        """Run the backends' background work (refmount's HTTP client expires idle
        connections) in ``nursery``, the backends made so far and those made later;
        cancelling it stops that work.  A fetcher never started runs none."""
        self._nursery = nursery
        for backend in self._backends.values():
            _start(backend, nursery)

    def confine_flat_options(self, urls: Iterable[str] | None) -> None:
        """Bind flat remote options to the one remote host among ``urls`` (the URLs the
        reference set points at; ``None`` when the set cannot tell them up front).

        Raises ValueError, naming the hosts, when there is not exactly one: flat options
        (a bearer token, a password) must never be sent to a host they were not meant
        for, so they need a key saying where they go.
        """
        flat = self.remote_options.get(FLAT)
        if flat is None:
            return
        if urls is None:
            raise ValueError(
                "--remote-options are flat, but this reference set does not list the hosts "
                "it points at before it is read: key them by protocol or host, e.g. "
                '{"https://data.example.org": {...}} or {"s3": {...}}, or give '
                "--remote-protocol"
            )
        scopes = sorted({scope_of(u) for u in urls if protocol_of(u) not in LOCAL_PROTOCOLS})
        if len(scopes) > 1:
            shown = ", ".join(scopes[:5]) + (", ..." if len(scopes) > 5 else "")
            raise ValueError(
                f"--remote-options are flat, but the reference set points at {len(scopes)} "
                f"remote hosts ({shown}): key the options by protocol or host, e.g. "
                f'{{"{scopes[0]}": {{...}}}}, so that each host gets only its own'
            )
        options = {k: v for k, v in self.remote_options.items() if k != FLAT}
        if scopes:
            options[scopes[0]] = {**flat, **options.get(scopes[0], {})}
        self.remote_options = options

    async def fetch(
        self,
        url: str,
        start: int,
        end: int,
        *,
        allow_short: bool = False,
        checksum: Checksum | None = None,
    ) -> bytes:
        """Bytes ``[start, end)`` of ``url``.

        Exactly ``end - start`` bytes, or with ``allow_short`` fewer when the file ends
        before ``end`` (read-ahead past a file's end); never more.  With a ``checksum``,
        bytes of the object's version it names, else :class:`ChangedObject`.
        """
        if end <= start:
            return b""
        want = end - start

        async def attempt(backend: Backend, where: str) -> bytes:
            data = await backend.read(where, start, end, checksum)
            if len(data) > want or (len(data) < want and not allow_short):
                raise WrongAnswer(f"asked for {want} bytes at offset {start}, got {len(data)}")
            return data

        data = await self._with_retries(url, attempt)
        self.stats.bytes_fetched += len(data)
        return data

    def try_now(
        self, url: str, start: int, end: int, checksum: Checksum | None = None
    ) -> bytes | None:
        """Bytes ``[start, end)`` if they can be had without waiting (a local file read
        before, its pages in memory, of the version ``checksum`` names), else None: then
        :meth:`fetch`."""
        if protocol_of(url) not in LOCAL_PROTOCOLS:
            return None
        data = self._local.try_now(url, start, end, checksum)
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

        async def attempt(backend: Backend, where: str) -> int:
            size = await backend.size(where)
            if not isinstance(size, int) or not 0 <= size <= MAX_FILE_SIZE:
                raise FetchError(f"{redact(url)}: the store reports a size of {size!r} bytes")
            return size

        size = await self._with_retries(url, attempt)
        self._sizes[url] = size
        return size

    async def version(self, url: str) -> Version:
        """What names the current version of a file, and its size: one HEAD or stat,
        with the same deadlines and retries as a read (see
        :func:`~refmount.fetch.backend.version_of`)."""

        async def attempt(backend: Backend, where: str) -> Version:
            return await backend.version(where)

        return await self._with_retries(url, attempt)

    async def prepare(self, protocols: Iterable[str]) -> None:
        """Make the backends of these protocols (each host given options of its own, and
        one for the protocol's other hosts), and their sessions, ahead of the first
        read: importing aiohttp or s3fs and opening a session takes from a few tenths of
        a second to seconds, which the first read would otherwise wait for.  Failures
        are left for that read to report."""
        wanted = set(protocols) - LOCAL_PROTOCOLS
        scopes = [f"{p}://" for p in sorted(wanted)]
        scopes += [k for k in self.remote_options if "://" in k and protocol_of(k) in wanted]
        for scope in scopes:
            try:
                with trio.fail_after(self.policy.timeout):
                    await self._backend(scope).prepare()
            except Exception as exc:  # the first read reports it
                log.debug("could not prepare %s ahead of reads: %s", scope, exc)

    async def signing(self) -> dict[str, str]:
        """Where the S3 scopes made so far sign their requests from (see
        :meth:`HttpBackend.signing`), by scope."""
        found = {}
        for scope, backend in self._backends.items():
            if isinstance(backend, HttpBackend) and (source := await backend.signing()):
                found[scope] = source
        return found

    # -- machinery ------------------------------------------------------------------------

    def _backend(self, url: str) -> Backend:
        """The backend of a URL, made on first use: one per host given options of its
        own, one shared by the other hosts of a protocol (a set may name thousands of
        buckets; each need not have a client of its own)."""
        protocol = protocol_of(url)
        if protocol in LOCAL_PROTOCOLS:
            return self._local
        scope = next((p for p in self._prefixes if url.startswith(p)), None) or scope_of(url)
        if scope not in self.remote_options:
            scope = f"{protocol}://"
        backend = self._backends.get(scope)
        if backend is None:
            backend = self._backends[scope] = self._new_backend(
                protocol, self._options_for(protocol, scope)
            )
            if self._nursery is not None:
                _start(backend, self._nursery)
        return backend

    def _new_backend(self, protocol: str, options: dict[str, Any]) -> Backend:
        """A backend for one scope of a remote protocol.  With ``.netrc`` credentials,
        ``http://`` and ``https://`` are read in this process even with fetch workers:
        the steps of one login (the login host, the archive that sets the cookie, the
        read that sends it) must share one cookie jar, and each worker has its own."""
        policy = self.policy
        make = self.make_remote
        if protocol in ("http", "https") and self.logins.credentials:
            make = make_backend
        return make(
            protocol,
            options,
            self.backend,
            deadline=policy.timeout,
            threads=2 * policy.max_requests,  # abandoned reads hold theirs a while
            buffers=self.buffers,
        )

    def _options_for(self, protocol: str, scope: str) -> dict[str, Any]:
        """The fsspec storage options of one scope: those given for its protocol, then
        those given for its host on top (key by key), then for a URL prefix's own."""
        options: dict[str, Any] = {}
        for key in dict.fromkeys((protocol, scope_of(scope), scope)):
            options.update(self.remote_options.get(key, {}))
        if protocol == "s3":
            # botocore keeps 10 connections unless told otherwise; match our concurrency.
            config = dict(options.get("config_kwargs", {}))
            config.setdefault("max_pool_connections", self.policy.max_requests_per_host)
            options["config_kwargs"] = config
        return options

    def _host_limiter(self, url: str) -> trio.CapacityLimiter:
        scope = scope_of(url)
        limiter = self._hosts.get(scope)
        if limiter is None:
            limiter = self._hosts[scope] = trio.CapacityLimiter(self.policy.max_requests_per_host)
        return limiter

    async def _with_retries(self, url: str, attempt: Callable[[Backend, str], Awaitable[T]]) -> T:
        """Run ``attempt`` until it succeeds, fails for good, or has had its tries.

        Each try has one deadline, ``timeout``, which covers the wait for a request slot
        as well as the request: readers queued behind a stalled host get their answer
        within ``(retries + 1) * timeout`` plus the backoffs, like the reader in front.
        """
        try:
            problem = authority_problem(url, userinfo=True)  # checked strictly at load
            if problem is not None:
                raise FetchError(f"{redact(url)}: the URL {problem}: refused", errno.EIO)
            backend = self._backend(url)
        except FetchError as exc:
            self._fail(url, str(exc))
            raise
        except Exception as exc:  # options no filesystem could take, an unusable URL
            self._fail(url, f"{type(exc).__name__}: {exc}")
            raise FetchError(f"{redact(url)}: {type(exc).__name__}: {exc}") from exc
        host_limiter = self._host_limiter(url)
        policy = self.policy
        trail = [url]
        for n in range(policy.retries + 1):
            del trail[1:]
            if n:
                self.stats.retries += 1
                delay = policy.backoff * 2 ** (n - 1)
                await trio.sleep(delay * random.uniform(0.5, 1.5))
            sent = False
            try:
                with trio.fail_after(policy.timeout):
                    # The host's slot first: a reader queued for a stalled host must not
                    # hold one of the slots every host shares.
                    await _take(host_limiter)
                    try:
                        await _take(self._all)
                        try:
                            sent = True
                            self.stats.requests += 1
                            return await self._follow(url, backend, attempt, trail)
                        finally:
                            self._all.release()
                    finally:
                        host_limiter.release()
            except trio.TooSlowError:
                reason = f"no answer within {policy.timeout:g} s"
                if not sent:
                    reason += " (every request slot for this host stayed busy)"
            except WrongAnswer as exc:
                reason = str(exc)
            except ChangedObject:
                # Final, and logged once by the reader's error boundary, with the key.
                self.stats.errors += 1
                raise
            except FetchError as exc:
                self._fail(url, str(exc))
                raise
            except Exception as exc:
                err, retry, reason = classify(exc, urlsplit(trail[-1]).netloc)
                if trail[-1] != url:  # a redirect's target failed: say which
                    reason = f"{reason} (redirected to {redact(trail[-1])})"
                if not retry:
                    self._fail(url, reason)
                    raise FetchError(f"{redact(url)}: {reason}", err) from exc
            log.debug("attempt %d on %s failed: %s", n + 1, redact(url), reason)
        self._fail(url, reason)
        raise FetchError(f"{redact(url)}: {reason} (after {policy.retries + 1} attempts)")

    async def _follow(
        self,
        url: str,
        backend: Backend,
        attempt: Callable[[Backend, str], Awaitable[T]],
        trail: list[str],
    ) -> T:
        """``attempt`` on ``url``, and on where its redirects lead (at most
        ``MAX_REDIRECTS`` hops; see :mod:`refmount.fetch.redirects`), each URL through
        the backend of its own scope, so that it gets only what is keyed to it; each
        URL asked is appended to ``trail`` (a failure names the last).

        A hop to a host that ``.netrc`` names (a login) is taken under the login lock,
        and the rest of the read with it: readers without a session wait for the one
        logging in, then read again from their first URL, with its cookies.  Where a
        read without a login ended is remembered (:class:`redirects.Remembered`): the
        next reads of ``url`` ask there directly while it is valid."""
        remembered = self._moved.get(url)
        if remembered is not None:
            trail.append(remembered)
            try:
                return await attempt(self._backend(remembered), remembered)
            except Exception as exc:  # an expired signature, a moved object: ask again
                log.debug("%s: its remembered target failed (%s)", redact(url), exc)
                self._moved.forget(url)
                del trail[1:]
        logins = self.logins
        seen = logins.completed
        where, retried, hops, holding = url, False, 0, False
        try:
            while True:
                try:
                    answer = await attempt(backend, where)
                except redirects.Redirected as moved:
                    hops += 1
                    if hops > redirects.MAX_REDIRECTS:
                        raise redirects.too_many(url) from None
                    where = redirects.follow(where, moved.location)
                    log.debug("%s: HTTP %d to %s", redact(moved.url), moved.status, redact(where))
                    if not holding and logins.has_credentials(place_of(where).host):
                        await logins.login_lock.acquire()
                        holding = True
                        if logins.completed != seen and not retried:
                            # Another reader logged in meanwhile: its session serves.
                            logins.login_lock.release()
                            holding = False
                            where, retried, hops = url, True, 0
                    trail.append(where)
                    backend = self._backend(where)
                    continue
                if holding:
                    logins.completed += 1
                elif where != url and not retried:
                    self._moved.keep(url, where)
                return answer
        finally:
            if holding:
                logins.login_lock.release()

    def _fail(self, url: str, reason: str) -> None:
        self.stats.errors += 1
        # Log each distinct failure once, not once per READ; bound what we remember.
        key = (url, reason.split(",")[0][:80])
        if key not in self._logged:
            if len(self._logged) > 10_000:
                self._logged.clear()
            self._logged.add(key)
            log.warning("remote read failed: %s: %s", redact(url), reason)


def _start(backend: Backend, nursery: trio.Nursery) -> None:
    if isinstance(backend, HttpBackend):
        backend.start(nursery)


async def _take(limiter: trio.CapacityLimiter) -> None:
    """A slot of ``limiter``: a free one without the scheduling round trip that
    ``async with`` costs (the request that follows waits anyway), else wait for one."""
    try:
        limiter.acquire_nowait()
    except trio.WouldBlock:
        await limiter.acquire()


@functools.lru_cache(maxsize=URL_MEMO)
def is_prefix(key: str) -> bool:
    """Whether an options key is a URL prefix (``s3://bucket/data/``), not a protocol or
    a host."""
    _, separator, rest = key.partition("://")
    return bool(separator) and bool(rest.partition("/")[2])


def scope_of(url: str) -> str:
    """``protocol://host[:port]`` of a URL (the bucket for object stores), by the parse
    the connection uses (:func:`refmount.authority.place_of`): what options and request
    limits are kept per.  ValueError for a URL whose host parsers read differently."""
    if url.endswith("://"):  # a protocol's own scope
        return url.lower()
    return place_of(url).scope


def classify(exc: BaseException, host: str = "") -> tuple[int, bool, str]:
    """(errno for the reader, whether to retry, a short reason) for a failed attempt on
    ``host``.

    A certificate that fails verification is final: a retry meets the same certificate.

    A missing target is EIO, never ENOENT: ENOENT means "no such key" to zarr, which then
    reads the chunk as never written and returns fill values instead of an error.  Only a
    refusal (401, 403, a permission or credential error) is EACCES.
    """
    if (failure := certificate_failure(exc, host)) is not None:
        return errno.EIO, False, str(failure)
    if isinstance(exc, FileNotFoundError):
        return errno.EIO, False, "not found"
    if isinstance(exc, PermissionError):
        return errno.EACCES, False, "access denied"
    if "credential" in type(exc).__name__.lower():
        return errno.EACCES, False, f"no usable credentials ({type(exc).__name__})"
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    if isinstance(status, int) and 400 <= status < 600:
        if status in (401, 403):
            return errno.EACCES, False, f"HTTP {status}"
        if status == 404:
            return errno.EIO, False, "HTTP 404: not found"
        if status == 416:
            return errno.EIO, False, "HTTP 416: range not satisfiable"
        return errno.EIO, status in _RETRYABLE_STATUS or status >= 500, f"HTTP {status}"
    return errno.EIO, True, f"{type(exc).__name__}: {exc}"[:300]

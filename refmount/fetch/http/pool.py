"""Idle keep-alive connections, by host, for the next request to that host.

A connection is given back only after an answer whose body ended exactly at its length,
and kept only while the server has sent nothing more (:attr:`Connection.quiet`, checked
when it is given back and again when it is taken): anything else it holds would be read
as the answer to the next request.

What is kept is bounded three ways, the least recently used idle connection closed
first past each: ``per_host`` idle connections a host, ``total`` for all hosts together
(a reference set may name thousands of hosts, each read once), and a quarter of the
process's descriptor limit (``RLIMIT_NOFILE``), so that idle sockets never take the
descriptors a read needs; when a new connection's descriptor shows the process near its
limit, idle ones are closed until a quarter of the limit is free again.  An idle
connection expires ``IDLE_SECONDS`` after it was given back, whether or not its host is
asked again: a trio task of the pool's closes it, in the nursery the pool's owner gives
it (:meth:`ConnectionPool.start`: the daemon's main nursery through ``Fetcher.start``,
a fetch worker's own), running only while there are idle connections and cancelled
with that nursery.  A pool given no nursery (tools, tests) starts no task: an expired
connection is closed when its host is asked again, or with the pool.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import trio

from refmount.fetch.http.connection import Connection

log = logging.getLogger(__name__)

#: Seconds an idle connection is kept: servers close theirs after 5 s (Apache) to
#: 75 s (nginx); one closed meanwhile costs a second try on a new connection.
IDLE_SECONDS = 30.0
#: Idle connections kept for one host, and for all hosts together.
PER_HOST = 32
TOTAL = 256
_NO_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})

Host = tuple[str, int]


class ConnectionPool:
    """Idle connections by ``(host, port)``, newest last; see the module's docstring."""

    def __init__(
        self,
        per_host: int = PER_HOST,
        total: int = TOTAL,
        opener: Callable[[str, int], Awaitable[Connection]] = Connection.open,
    ) -> None:
        self.per_host = per_host
        self.total = total
        self.opener = opener  # plain TCP, or TLS (Connection.open_tls with its context)
        self._by_host: dict[Host, list[Connection]] = {}
        #: every idle connection, least recently given back first
        self._lru: OrderedDict[Connection, Host] = OrderedDict()
        self._reaper: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self.opened = 0

    @property
    def idle(self) -> int:
        return len(self._lru)

    def start(self, nursery: trio.Nursery) -> None:
        """Expire idle connections from now on by a task in ``nursery``."""
        self._nursery = nursery
        self._start_reaper()

    async def take(self, host: str, port: int) -> Connection:
        key = (host, port)
        idle = self._by_host.get(key)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            del self._lru[connection]
            if not idle:
                del self._by_host[key]
            if now - connection.idle_since < IDLE_SECONDS and connection.quiet:
                connection.reused = True
                return connection
            connection.close()
        return await self.take_new(host, port)

    async def take_new(self, host: str, port: int) -> Connection:
        try:
            connection = await self.opener(host, port)
        except OSError as exc:
            if not (_out_of_descriptors(exc) and self._lru):
                raise
            log.info("out of descriptors: closing %d idle connections", len(self._lru))
            self._close_oldest(len(self._lru))
            connection = await self.opener(host, port)
        self.opened += 1
        self._leave_room(connection.fileno())
        return connection

    def give_back(self, host: str, port: int, connection: Connection) -> None:
        if not connection.quiet:
            connection.close()
            return
        key = (host, port)
        idle = self._by_host.setdefault(key, [])
        connection.idle_since = time.monotonic()
        idle.append(connection)
        self._lru[connection] = key
        if len(idle) > self.per_host:
            oldest = idle.pop(0)
            del self._lru[oldest]
            oldest.close()
        self._close_oldest(len(self._lru) - min(self.total, _soft_limit() // 4))
        self._start_reaper()

    def close(self) -> None:
        """Close every idle connection (the reaper then ends by itself)."""
        self._close_oldest(len(self._lru))

    # -- bounds ---------------------------------------------------------------------------

    def _close_oldest(self, count: int) -> None:
        """Close the ``count`` least recently used idle connections."""
        for _ in range(max(0, count)):
            connection, key = self._lru.popitem(last=False)
            idle = self._by_host[key]
            idle.remove(connection)
            if not idle:
                del self._by_host[key]
            connection.close()

    def _leave_room(self, newest: int) -> None:
        """Close idle connections, least recently used first, while fewer than a quarter
        of the descriptor limit is free.  Descriptors are numbered lowest free first, so
        only a new one numbered past three quarters of the limit makes them worth
        counting."""
        limit = _soft_limit()
        if newest < limit * 3 // 4 or not self._lru:
            return
        free = limit - len(os.listdir("/proc/self/fd"))
        if free < limit // 4:
            self._close_oldest(min(len(self._lru), limit // 4 - free))

    # -- expiry ---------------------------------------------------------------------------

    def _start_reaper(self) -> None:
        """Start the task that closes expired idle connections, unless it runs (or there
        is no nursery, or nothing idle)."""
        if self._reaper is None and self._nursery is not None and self._lru:
            scope = trio.CancelScope()
            try:
                self._nursery.start_soon(self._reap, scope, name="http idle reaper")
            except RuntimeError:  # the nursery has closed: its owner is stopping
                self._nursery = None
                return
            self._reaper = scope

    async def _reap(self, scope: trio.CancelScope) -> None:
        """Close each idle connection when its time is up; end when none is idle."""
        try:
            with scope:
                while self._lru:
                    oldest = next(iter(self._lru))
                    wait = oldest.idle_since + IDLE_SECONDS - time.monotonic()
                    if wait > 0:
                        await trio.sleep(wait)
                        continue
                    self._close_oldest(1)
        finally:
            if self._reaper is scope:
                self._reaper = None


def _soft_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def _out_of_descriptors(exc: BaseException | None) -> bool:
    """Whether a failed connect failed for want of a descriptor (trio wraps each
    attempt's error in one of its own, the attempts' errors in a group)."""
    if exc is None:
        return False
    if isinstance(exc, OSError) and exc.errno in _NO_DESCRIPTORS:
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_out_of_descriptors(inner) for inner in exc.exceptions)
    return _out_of_descriptors(exc.__cause__ or exc.__context__)

"""Idle keep-alive connections, by host, for the next request to that host.

A connection is given back only after an answer whose body ended exactly at its length,
and kept only while the server has sent nothing more (:attr:`Connection.quiet`, checked
when it is given back and again when it is taken): anything else it holds would be read
as the answer to the next request.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from refmount.fetch.http.connection import Connection

#: Seconds an idle connection is kept: servers close theirs after 5 s (Apache) to
#: 75 s (nginx); one closed meanwhile costs a second try on a new connection.
IDLE_SECONDS = 30.0


class ConnectionPool:
    """Idle connections by ``(host, port)``, at most ``max_idle`` each, newest first."""

    def __init__(
        self, max_idle: int, opener: Callable[[str, int], Awaitable[Connection]] = Connection.open
    ) -> None:
        self.max_idle = max_idle
        self.opener = opener  # plain TCP, or TLS (Connection.open_tls with its context)
        self._idle: dict[tuple[str, int], list[Connection]] = {}
        self.opened = 0

    async def take(self, host: str, port: int) -> Connection:
        idle = self._idle.get((host, port))
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if now - connection.idle_since < IDLE_SECONDS and connection.quiet:
                connection.reused = True
                return connection
            connection.close()
        return await self.take_new(host, port)

    async def take_new(self, host: str, port: int) -> Connection:
        self.opened += 1
        return await self.opener(host, port)

    def give_back(self, host: str, port: int, connection: Connection) -> None:
        idle = self._idle.setdefault((host, port), [])
        if len(idle) >= self.max_idle or not connection.quiet:
            connection.close()
            return
        connection.idle_since = time.monotonic()
        idle.append(connection)

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()

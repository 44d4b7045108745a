"""Keep-alive HTTP/1.1 connections on trio sockets, and a pool of idle ones per host.

A connection reads an answer's head into a small buffer of its own and its body straight
into the caller's buffer (``recv_into``): no piece of a body is ever a Python object of
its own, and nothing is read past the body, so the connection is ready for the next
request when the body ends.  A connection that fails, is cancelled mid-answer, or has
an answer it did not read to the end is closed, never pooled.
"""

from __future__ import annotations

import os
import time

import trio

from refmount.fetch.http.response import MAX_HEAD, MAX_INTERIM, Head, ProtocolError, parse_head

#: Seconds an idle connection is kept: servers close theirs after 5 s (Apache) to
#: 75 s (nginx); one closed meanwhile costs a second try on a new connection.
IDLE_SECONDS = 30.0
_END_OF_HEAD = b"\r\n\r\n"


class ConnectionLost(Exception):
    """The server closed the connection before (or while) answering."""

    def __init__(self, message: str, *, answered: bool) -> None:
        super().__init__(message)
        #: Whether any byte of an answer had arrived: a reused connection closed before
        #: any had was closed idle by the server, and the request may be sent again.
        self.answered = answered


class Connection:
    """One TCP connection to a server."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._socket = stream.socket
        self._head = bytearray(MAX_HEAD)
        #: Bytes of the body that came in with the head: ``_head[_spare:_spare_end]``.
        self._spare = self._spare_end = 0
        self.reused = False
        self.closed = False
        self.idle_since = 0.0

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        return cls(await trio.open_tcp_stream(host, port))

    async def send(self, request: bytes) -> None:
        await self._stream.send_all(request)

    async def read_head(self) -> Head:
        """The next final answer's head, past at most ``MAX_INTERIM`` interim (1xx)
        answers; the body's first bytes stay for :meth:`read_body`."""
        answered = False
        for _ in range(MAX_INTERIM + 1):
            head = await self._read_one_head(answered)
            if not head.interim:
                return head
            answered = True
        raise ProtocolError(f"more than {MAX_INTERIM} interim (1xx) answers")

    async def _read_one_head(self, answered: bool) -> Head:
        """One head, starting with what came in after the last one (an interim answer's
        successor may share its packet)."""
        buffer, view = self._head, memoryview(self._head)
        got = self._spare_end - self._spare
        if got:
            buffer[:got] = buffer[self._spare : self._spare_end]
        self._spare = self._spare_end = 0
        start = 0
        while (end := buffer.find(_END_OF_HEAD, start, got)) < 0:
            if got == MAX_HEAD:
                raise ProtocolError(f"a head longer than {MAX_HEAD} bytes")
            start = max(0, got - len(_END_OF_HEAD) + 1)
            n = await self._socket.recv_into(view[got:])
            if n == 0:
                raise ConnectionLost(
                    "the server closed the connection", answered=answered or got > 0
                )
            got += n
        self._spare, self._spare_end = end + len(_END_OF_HEAD), got
        return parse_head(view[:end])

    async def read_body(self, into: memoryview) -> None:
        """Exactly ``len(into)`` bytes of the body into ``into``."""
        spare = min(self._spare_end - self._spare, len(into))
        into[:spare] = self._head[self._spare : self._spare + spare]
        self._spare += spare
        got, size = spare, len(into)
        while got < size:
            n = await self._socket.recv_into(into[got:])
            if n == 0:
                raise ConnectionLost(
                    f"the server closed the connection after {got} of {size} body bytes",
                    answered=True,
                )
            got += n

    @property
    def drained(self) -> bool:
        """Whether nothing the server sent is left unread (the next answer starts clean)."""
        return self._spare == self._spare_end

    def close(self) -> None:
        """Close the socket; outside trio (the fetcher closed at exit) without telling
        trio, which then has no task waiting on it."""
        if self.closed:
            return
        self.closed = True
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            os.close(self._socket.detach())
        else:
            self._socket.close()


class ConnectionPool:
    """Idle connections by ``(host, port)``, at most ``max_idle`` each, newest first."""

    def __init__(self, max_idle: int) -> None:
        self.max_idle = max_idle
        self._idle: dict[tuple[str, int], list[Connection]] = {}
        self.opened = 0

    async def take(self, host: str, port: int) -> Connection:
        idle = self._idle.get((host, port))
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if now - connection.idle_since < IDLE_SECONDS:
                connection.reused = True
                return connection
            connection.close()
        return await self.take_new(host, port)

    async def take_new(self, host: str, port: int) -> Connection:
        self.opened += 1
        return await Connection.open(host, port)

    def give_back(self, host: str, port: int, connection: Connection) -> None:
        idle = self._idle.setdefault((host, port), [])
        if connection.closed or len(idle) >= self.max_idle or not connection.drained:
            connection.close()
            return
        connection.idle_since = time.monotonic()
        idle.append(connection)

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()

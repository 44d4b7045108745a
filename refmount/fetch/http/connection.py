"""Keep-alive HTTP/1.1 connections on trio sockets (pooled by :mod:`.pool`).

A connection reads an answer's head into a small buffer of its own and its body straight
into the caller's buffer (``recv_into``): no piece of a body is ever a Python object of
its own, and nothing is read past the body, so the connection is ready for the next
request when the body ends.  A connection that fails, is cancelled mid-answer, or has
an answer it did not read to the end is closed, never pooled.
"""

from __future__ import annotations

import os
import select
import ssl

import trio

from refmount.fetch.http.response import MAX_HEAD, MAX_INTERIM, Head, ProtocolError, parse_head
from refmount.fetch.http.tls import TlsStream

_END_OF_HEAD = b"\r\n\r\n"
#: The head buffer's first size: most heads are a few hundred bytes.
HEAD_BUFFER = 16 << 10


class ConnectionLost(Exception):
    """The server closed the connection before (or while) answering."""

    def __init__(self, message: str, *, answered: bool) -> None:
        super().__init__(message)
        #: Whether any byte of an answer had arrived: a reused connection closed before
        #: any had was closed idle by the server, and the request may be sent again.
        self.answered = answered


class Connection:
    """One TCP connection to a server."""

    def __init__(self, stream: trio.SocketStream | TlsStream) -> None:
        self._stream = stream
        #: What is read and polled: the TCP socket, or the TLS connection over it.
        self._socket = stream.socket if isinstance(stream, trio.SocketStream) else stream
        self._recv_into = self._socket.recv_into
        #: the head's buffer, grown up to MAX_HEAD for a long head
        self._head = bytearray(HEAD_BUFFER)
        #: Bytes of the body that came in with the head: ``_head[_spare:_spare_end]``.
        self._spare = self._spare_end = 0
        self.reused = False
        self.closed = False
        self.idle_since = 0.0

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        return cls(await trio.open_tcp_stream(host, port))

    @classmethod
    async def open_tls(cls, host: str, port: int, context: ssl.SSLContext) -> Connection:
        return cls(await TlsStream.open(host, port, context))

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
        buffer = self._head
        got = self._spare_end - self._spare
        if got:
            buffer[:got] = buffer[self._spare : self._spare_end]
        self._spare = self._spare_end = 0
        start = 0
        while (end := buffer.find(_END_OF_HEAD, start, got)) < 0:
            if got == len(buffer):
                if got == MAX_HEAD:
                    raise ProtocolError(f"a head longer than {MAX_HEAD} bytes")
                self._head = bigger = bytearray(min(2 * got, MAX_HEAD))
                bigger[:got] = buffer
                buffer = bigger
            start = max(0, got - len(_END_OF_HEAD) + 1)
            with memoryview(buffer) as view:
                n = await self._recv_into(view[got:])
            if n == 0:
                raise ConnectionLost(
                    "the server closed the connection", answered=answered or got > 0
                )
            got += n
        self._spare, self._spare_end = end + len(_END_OF_HEAD), got
        return parse_head(buffer[:end])

    async def read_body(self, into: memoryview) -> None:
        """Exactly ``len(into)`` bytes of the body into ``into``."""
        spare = min(self._spare_end - self._spare, len(into))
        into[:spare] = self._head[self._spare : self._spare + spare]
        self._spare += spare
        got, size = spare, len(into)
        while got < size:
            n = await self._recv_into(into[got:])
            if n == 0:
                raise ConnectionLost(
                    f"the server closed the connection after {got} of {size} body bytes",
                    answered=True,
                )
            got += n

    def fileno(self) -> int:
        return self._socket.fileno()

    @property
    def quiet(self) -> bool:
        """Whether nothing the server sent is left unread and it has sent nothing since
        (no byte, no close, no error): only then does the next answer on this connection
        answer the next request.  A server or proxy that writes more than it was asked
        (an answer nobody asked for, a body longer than its length) leaves bytes that
        would be read as the answer to the next request; a zero-timeout poll of the
        socket sees them, and the connection is closed instead of used again."""
        if self.closed or self._spare != self._spare_end:
            return False
        if isinstance(self._socket, TlsStream) and self._socket.pending():
            return False  # decrypted bytes that nobody asked for
        poll = select.poll()
        poll.register(self._socket.fileno(), select.POLLIN | select.POLLPRI)
        return not poll.poll(0)

    def close(self) -> None:
        """Close the socket; outside trio (the fetcher closed at exit) without telling
        trio, which then has no task waiting on it."""
        if self.closed:
            return
        self.closed = True
        if isinstance(self._socket, TlsStream):
            self._socket.close()
            return
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            os.close(self._socket.detach())
        else:
            self._socket.close()

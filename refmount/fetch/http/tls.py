"""TLS for refmount's HTTP client: an ``ssl.SSLObject`` over memory BIOs, driven by trio.

OpenSSL reading a socket itself reads each TLS record with two ``read()`` calls, its
5-byte header and then its body: a 256 KiB chunk is 32 system calls (140,000 ``read()``
calls a GB over https against 12,000 over http, ``bench/README.md``).  Here the socket
is read by this module, in large ``recv_into`` calls into one reused buffer (every
record the kernel holds, up to :data:`RECEIVE` bytes, in one call), handed to OpenSSL's
incoming memory BIO, and ``SSL_read`` decrypts each record straight into the caller's
buffer (the part's own bytearray).  No ctypes, no pointer into CPython's objects: what
OpenSSL holds and the caller has not read yet (decrypted, or still in the BIO) is known
exactly (:meth:`TlsStream.pending`), where the connection's ``quiet`` check looks for
bytes a server sent that nobody asked for.  trio's own ``SSLStream`` also uses memory
BIOs, but receives into a new bytes object per call and has no ``recv_into``.

A connection closed by the server mid-answer, with or without ``close_notify``, reads as
0 bytes here, and the HTTP layer, which knows the body's length, refuses it (never short
bytes).  A certificate that fails verification is :class:`~refmount.fetch.trust.CertificateError`,
naming the host and OpenSSL's reason.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable
from typing import Any

import trio

from refmount.fetch.trust import CertificateError, openssl_reason

#: Bytes read without waiting before the task yields once to the loop anyway: a body
#: already in the socket buffer is decrypted record after record without a wait.
_YIELD_EVERY = 1 << 20
#: The most ciphertext taken from the socket in one call.
RECEIVE = 256 << 10


class TlsStream:
    """One TLS connection: ``send_all`` and ``recv_into`` as the HTTP layer uses them."""

    def __init__(self, raw: socket.socket, tls: ssl.SSLObject, incoming: ssl.MemoryBIO,
                 outgoing: ssl.MemoryBIO) -> None:  # fmt: skip
        self._raw = raw
        self._tls = tls
        self._incoming = incoming
        self._outgoing = outgoing
        self._ciphertext = bytearray(RECEIVE)
        self._unyielded = 0

    @classmethod
    async def open(cls, host: str, port: int, context: ssl.SSLContext) -> TlsStream:
        """A verified TLS connection to ``host``; :class:`CertificateError` when its
        certificate is not trusted or not for ``host``."""
        stream = await trio.open_tcp_stream(host, port)  # TCP_NODELAY, happy eyeballs
        self = wrap(socket.socket(fileno=stream.socket.detach()), host, context)
        try:
            await self._retry(self._tls.do_handshake)
        except ssl.SSLCertVerificationError as exc:
            self.close()
            raise CertificateError(f"{host}:{port}", openssl_reason(exc)) from None
        except BaseException:
            self.close()
            raise
        return self

    async def send_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = self._tls.write(view)
            view = view[written:]
            await self._flush()

    async def recv_into(self, into: memoryview) -> int:
        """Up to ``len(into)`` bytes into ``into``: every TLS record that can be read
        without waiting, or, when none can, the first one to come; 0 when the server has
        closed the connection.

        ``SSL_read`` returns at most one record (16 KiB) per call: a 256 KiB body is 16
        or more of them, and the loop here keeps those calls in one Python frame instead
        of one awaited call of the HTTP layer's each."""
        if self._unyielded >= _YIELD_EVERY:
            self._unyielded = 0
            await trio.lowlevel.checkpoint()
        tls, size, got = self._tls, len(into), 0
        while got < size:
            try:
                n = tls.read(size - got, into[got:] if got else into)
            except ssl.SSLWantReadError:
                if self._outgoing.pending:
                    await self._flush()  # a key update's answer
                if self._receive():
                    continue
                if got:
                    break  # what came so far; the caller asks again for the rest
                await trio.lowlevel.wait_readable(self._raw)
                self._unyielded = 0
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                break  # closed, with close_notify or without (0 if nothing came before)
            if n == 0:
                break
            got += n
        self._unyielded += got
        return got

    def _receive(self) -> bool:
        """Ciphertext the socket holds now, into the incoming BIO (at its end, the end of
        the stream); False when there is none yet."""
        try:
            n = self._raw.recv_into(self._ciphertext)
        except (BlockingIOError, InterruptedError):
            return False
        if n == 0:
            self._incoming.write_eof()
        else:
            with memoryview(self._ciphertext) as view:
                self._incoming.write(view[:n])
        return True

    async def _flush(self) -> None:
        """Send what OpenSSL has written to the outgoing BIO."""
        view = memoryview(self._outgoing.read())
        while view:
            try:
                sent = self._raw.send(view)
            except (BlockingIOError, InterruptedError):
                await trio.lowlevel.wait_writable(self._raw)
                continue
            view = view[sent:]

    async def _retry(self, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)``, feeding OpenSSL the socket's bytes whenever it asks for more."""
        while True:
            try:
                result = call(*args)
            except ssl.SSLWantReadError:
                await self._flush()
                if not self._receive():
                    await trio.lowlevel.wait_readable(self._raw)
                continue
            await self._flush()
            return result

    def fileno(self) -> int:
        return self._raw.fileno()

    def pending(self) -> bool:
        """Whether OpenSSL holds bytes not read yet: decrypted ones, or ciphertext taken
        from the socket and not yet decrypted."""
        return bool(self._tls.pending() or self._incoming.pending)

    def close(self) -> None:
        """Close the socket; inside trio tell it first (a task may wait on it)."""
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            pass
        else:
            trio.lowlevel.notify_closing(self._raw)
        self._raw.close()


def wrap(raw: socket.socket, host: str, context: ssl.SSLContext) -> TlsStream:
    """A TLS connection to ``host`` over ``raw`` (connected), before its handshake.
    When ``wrap_bio`` raises (a name ``ssl`` refuses, no memory), ``raw`` is closed
    here, not left to the garbage collector."""
    try:
        raw.setblocking(False)
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = context.wrap_bio(incoming, outgoing, server_hostname=host)
    except BaseException:
        raw.close()
        raise
    return TlsStream(raw, tls, incoming, outgoing)

"""TLS for refmount's HTTP client: a non-blocking ``ssl.SSLSocket`` driven by trio.

trio's own ``SSLStream`` runs TLS through a memory BIO: every receive becomes a bytes
object, is copied into the BIO, and copied out again by ``SSLObject.read``; it has no
``recv_into``.  Here OpenSSL reads the socket itself and ``SSL_read`` decrypts each
record straight into the caller's buffer (the part's own bytearray): no Python object
per record, no copy.  When OpenSSL needs the socket, the task waits for it with
``trio.lowlevel.wait_readable`` / ``wait_writable`` (``SSLWantReadError`` /
``SSLWantWriteError``, which a renegotiation or a TLS 1.3 key update can raise either
way round).

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

from refmount.fetch.http import readahead
from refmount.fetch.trust import CertificateError, openssl_reason

#: Bytes read without waiting before the task yields once to the loop anyway: a body
#: already in the socket buffer is decrypted record after record without a wait.
_YIELD_EVERY = 1 << 20


class TlsStream:
    """One TLS connection: ``send_all`` and ``recv_into`` as the HTTP layer uses them."""

    def __init__(self, tls: ssl.SSLSocket) -> None:
        self._tls = tls
        self._unyielded = 0
        #: OpenSSL's read-ahead on the connection (see :mod:`.readahead`), or None.
        self._ahead: readahead.ReadAhead | None = None

    @classmethod
    async def open(cls, host: str, port: int, context: ssl.SSLContext) -> TlsStream:
        """A verified TLS connection to ``host``; :class:`CertificateError` when its
        certificate is not trusted or not for ``host``."""
        stream = await trio.open_tcp_stream(host, port)  # TCP_NODELAY, happy eyeballs
        tls = wrap(socket.socket(fileno=stream.socket.detach()), host, context)
        self = cls(tls)
        try:
            await self._retry(_handshake, tls)
        except ssl.SSLCertVerificationError as exc:
            self.close()
            raise CertificateError(f"{host}:{port}", openssl_reason(exc)) from None
        except BaseException:
            self.close()
            raise
        self._ahead = readahead.enable(tls)
        return self

    async def send_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            sent = await self._retry(self._tls.send, view)
            view = view[sent:]

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
                n = tls.recv_into(into[got:] if got else into)
            except ssl.SSLWantReadError:
                if got:
                    break  # what came so far; the caller asks again for the rest
                await trio.lowlevel.wait_readable(tls)
                self._unyielded = 0
                continue
            except ssl.SSLWantWriteError:  # a renegotiation or key update mid-read
                if got:
                    break
                await trio.lowlevel.wait_writable(tls)
                self._unyielded = 0
                continue
            except ssl.SSLZeroReturnError:
                break  # close_notify: the server is done (0 if nothing came before it)
            if n == 0:
                break  # closed without close_notify
            got += n
        self._unyielded += got
        return got

    async def _retry(self, call: Callable[..., int], *args: Any) -> int:
        """``call(*args)``, waiting for the socket whenever OpenSSL asks to."""
        while True:
            try:
                return call(*args)
            except ssl.SSLWantReadError:
                await trio.lowlevel.wait_readable(self._tls)
            except ssl.SSLWantWriteError:
                await trio.lowlevel.wait_writable(self._tls)
            self._unyielded = 0

    def fileno(self) -> int:
        return self._tls.fileno()

    def pending(self) -> bool:
        """Whether OpenSSL holds bytes that were not read yet: decrypted ones, or, when it
        reads ahead, any it has taken from the socket."""
        if self._tls.pending():
            return True
        return self._ahead is not None and self._ahead.has_pending()

    def close(self) -> None:
        """Close the socket; inside trio tell it first (a task may wait on it)."""
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            pass
        else:
            trio.lowlevel.notify_closing(self._tls)
        if self._ahead is not None:
            self._ahead.release()
        self._tls.close()


def wrap(raw: socket.socket, host: str, context: ssl.SSLContext) -> ssl.SSLSocket:
    """``raw``, connected to ``host``, as a non-blocking TLS socket before its handshake.
    When ``wrap_socket`` raises (the connection reset before it, a name ``ssl`` refuses,
    no memory), ``raw`` is closed here, not left to the garbage collector."""
    try:
        raw.setblocking(False)
        return context.wrap_socket(
            raw, server_hostname=host, do_handshake_on_connect=False, suppress_ragged_eofs=True
        )
    except BaseException:
        raw.close()
        raise


def _handshake(tls: ssl.SSLSocket) -> int:
    tls.do_handshake()
    return 0

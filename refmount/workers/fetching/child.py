"""A fetch worker: ``python -m refmount.workers.fetching.child PARENT_PID``.

It dies with the daemon (``PR_SET_PDEATHSIG``, and at the end of its stdin), imports the
fetch backends and says :data:`~refmount.workers.fetching.protocol.READY`, then serves
requests under trio, many at once: each runs as its own task, on a backend made by the
same :func:`~refmount.fetch.obstore_backend.make_backend` the daemon uses in-process, and
its reply is written when it finishes, one reply at a time.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import pickle
import sys
from typing import Any

import trio

from refmount.fetch.backend import Backend
from refmount.fetch.http import HttpBackend
from refmount.fetch.obstore_backend import make_backend
from refmount.fetch.trust import remove_private_directory
from refmount.workers.fetching.protocol import (
    CANCEL,
    CANCELLED,
    DATA,
    FAILED,
    MAX_REQUEST,
    PREPARE,
    READ,
    READY,
    REQUEST,
    REQUEST_MAGIC,
    SCOPE,
    SIZE,
    VALUE,
    VERSION,
    encode_error,
    encode_value,
    reply_head,
)
from refmount.workers.process import die_with, reply_channel, settle_signals
from refmount.workers.protocol import consume

log = logging.getLogger(__name__)


class _Server:
    """One worker's backends and requests in flight."""

    def __init__(self, replies: int) -> None:
        self.replies = replies
        self.writing = trio.Lock()
        self.backends: dict[int, Backend] = {}
        self.running: dict[int, trio.CancelScope] = {}

    def configure(self, scope: int, settings: tuple[Any, ...], nursery: trio.Nursery) -> None:
        """Make one scope's backend; its background work (idle connections' expiry)
        runs in ``nursery``."""
        protocol, options, choice, deadline, threads = settings
        backend = make_backend(protocol, options, choice, deadline=deadline, threads=threads)
        if isinstance(backend, HttpBackend):
            backend.start(nursery)
        self.backends[scope] = backend

    async def answer(self, kind: int, ident: int, args: tuple[Any, ...]) -> None:
        """Run one request and write its reply."""
        status, body = CANCELLED, b""
        with trio.CancelScope() as scope:
            self.running[ident] = scope
            try:
                status, body = await self._run(kind, args)
            except Exception as exc:
                status, body = FAILED, encode_error(exc)
            finally:
                del self.running[ident]
        if scope.cancelled_caught:
            status, body = CANCELLED, b""
        # A reply cut off halfway would garble every later one: never cancelled.
        with trio.CancelScope(shield=True):
            await self._send([reply_head(status, ident, len(body)), body])

    async def _send(self, buffers: list[bytes]) -> None:
        """Write a reply whole, one reply at a time: at once (one ``writev``, no trio
        checkpoint) when the pipe has room and no other reply is being written."""
        try:
            self.writing.acquire_nowait()
        except trio.WouldBlock:
            await self.writing.acquire()
        try:
            views = [memoryview(b) for b in buffers if b]
            while views:
                try:
                    written = os.writev(self.replies, views)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(self.replies)
                    continue
                consume(views, written)
        finally:
            self.writing.release()

    async def _run(self, kind: int, args: tuple[Any, ...]) -> tuple[int, bytes]:
        backend = self.backends[args[0]]
        if kind == READ:
            _, url, start, end, checksum = args
            return DATA, await backend.read(url, start, end, checksum)
        if kind == SIZE:
            value: object = await backend.size(args[1])
        elif kind == VERSION:
            value = await backend.version(args[1])
        elif kind == PREPARE:
            value = await backend.prepare()
        else:
            raise ValueError(f"no request kind {kind}")
        return VALUE, encode_value(value)  # type: ignore[arg-type]

    def cancel(self, ident: int) -> None:
        scope = self.running.get(ident)
        if scope is not None:
            scope.cancel()


class _Requests:
    """The daemon's request frames, read from its pipe as many at a time as it holds."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = bytearray()

    async def next(self) -> tuple[int, int, bytes] | None:
        """(kind, id, body) of the next request; None at the end of the pipe (the daemon
        is gone)."""
        if not await self._hold(REQUEST.size):
            return None
        magic, kind, ident, length = REQUEST.unpack_from(self.buffer)
        if magic != REQUEST_MAGIC or length > MAX_REQUEST:
            sys.exit("refmount fetch worker: a request it does not understand")
        if not await self._hold(REQUEST.size + length):
            return None
        body = bytes(self.buffer[REQUEST.size : REQUEST.size + length])
        del self.buffer[: REQUEST.size + length]
        return kind, ident, body

    async def _hold(self, size: int) -> bool:
        while len(self.buffer) < size:
            try:
                piece = os.read(self.fd, max(size - len(self.buffer), 1 << 16))
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.fd)
                continue
            if not piece:
                return False
            self.buffer += piece
        return True


async def serve(requests_fd: int, replies_fd: int) -> None:
    """Serve requests until the daemon closes its end of ``requests_fd``."""
    os.set_blocking(requests_fd, False)
    os.set_blocking(replies_fd, False)
    requests = _Requests(requests_fd)
    server = _Server(replies_fd)
    async with trio.open_nursery() as nursery:
        while (frame := await requests.next()) is not None:
            kind, ident, body = frame
            if kind == CANCEL:
                server.cancel(ident)
                continue
            args = pickle.loads(body)
            if kind == SCOPE:
                server.configure(ident, args, nursery)
            else:
                nursery.start_soon(server.answer, kind, ident, args)
        nursery.cancel_scope.cancel()


def _import_backends() -> None:
    """What the first request would otherwise wait for."""
    if importlib.util.find_spec("obstore") is not None:
        importlib.import_module("obstore")


def main(argv: list[str]) -> None:
    die_with(int(argv[1]))
    settle_signals()
    replies = reply_channel()
    logging.basicConfig(level=logging.WARNING, format="refmount fetch worker: %(message)s")
    _import_backends()
    os.write(replies, READY)
    trio.run(serve, 0, replies)
    # The daemon is gone: leave without finalizing obstore's runtime threads (see
    # obstore_backend.SETTLE_SECONDS), and without waiting for requests it no longer wants.
    remove_private_directory()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)

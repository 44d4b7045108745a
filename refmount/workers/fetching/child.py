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
from refmount.fetch.obstore_backend import make_backend
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
    reply_head,
)
from refmount.workers.process import die_with, reply_channel, settle_signals

log = logging.getLogger(__name__)


class _Server:
    """One worker's backends and requests in flight."""

    def __init__(self, replies: trio.lowlevel.FdStream) -> None:
        self.replies = replies
        self.writing = trio.Lock()
        self.backends: dict[int, Backend] = {}
        self.running: dict[int, trio.CancelScope] = {}

    def configure(self, scope: int, settings: tuple[Any, ...]) -> None:
        protocol, options, choice, deadline, threads = settings
        self.backends[scope] = make_backend(
            protocol, options, choice, deadline=deadline, threads=threads
        )

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
            async with self.writing:
                await self.replies.send_all(reply_head(status, ident, len(body)))
                if body:
                    await self.replies.send_all(body)

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
        return VALUE, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def cancel(self, ident: int) -> None:
        scope = self.running.get(ident)
        if scope is not None:
            scope.cancel()


async def _receive_exactly(stream: trio.lowlevel.FdStream, size: int) -> bytes | None:
    """``size`` bytes; None at the end of the stream (the daemon is gone)."""
    pieces, left = [], size
    while left:
        piece = await stream.receive_some(left)
        if not piece:
            return None
        pieces.append(piece)
        left -= len(piece)
    return b"".join(pieces)


async def serve(requests_fd: int, replies_fd: int) -> None:
    """Serve requests until the daemon closes its end of ``requests_fd``."""
    requests = trio.lowlevel.FdStream(requests_fd)
    server = _Server(trio.lowlevel.FdStream(replies_fd))
    async with trio.open_nursery() as nursery:
        while True:
            head = await _receive_exactly(requests, REQUEST.size)
            if head is None:
                break
            magic, kind, ident, length = REQUEST.unpack(head)
            if magic != REQUEST_MAGIC or length > MAX_REQUEST:
                sys.exit("refmount fetch worker: a request it does not understand")
            body = await _receive_exactly(requests, length) if length else b""
            if body is None:
                break
            if kind == CANCEL:
                server.cancel(ident)
                continue
            args = pickle.loads(body)
            if kind == SCOPE:
                server.configure(ident, args)
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
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)

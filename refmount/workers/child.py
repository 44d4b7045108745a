"""A worker process: ``python -m refmount.workers.child PARENT_PID MEMORY_LIMIT``.

It dies with the daemon (``PR_SET_PDEATHSIG``, and the end of its stdin when the
daemon's end closes), holds at most ``MEMORY_LIMIT`` bytes of address space
(``RLIMIT_AS``), imports every job's handler and says :data:`READY`, then runs one job
at a time: it reads a request from stdin, runs the
job's handler, and writes the reply to the stdout it was started with.  Its own fd 1 is
pointed at stderr, so a C library that prints cannot corrupt a reply.
"""

from __future__ import annotations

import json
import os
import resource
import sys

from refmount.workers.jobs import JOBS, handler, prepare
from refmount.workers.process import die_with, reply_channel, settle_signals
from refmount.workers.protocol import (
    FAILED,
    MAX_HEADER,
    MAX_MESSAGE,
    OK,
    READY,
    REPLY,
    REPLY_MAGIC,
    REQUEST,
    REQUEST_MAGIC,
    consume,
)


def _read_exactly(fd: int, size: int) -> bytearray | None:
    """``size`` bytes from ``fd``; None at its end (the daemon is gone)."""
    buffer = bytearray(size)
    view, done = memoryview(buffer), 0
    while done < size:
        n = os.readv(fd, [view[done:]])
        if n == 0:
            return None
        done += n
    return buffer


def _write_all(fd: int, *pieces: bytes | bytearray | memoryview) -> None:
    """Write ``pieces`` whole, gathered: the daemon wakes once for a whole reply."""
    views = [view for view in (memoryview(piece).cast("B") for piece in pieces) if view]
    while views:
        consume(views, os.writev(fd, views))


def _reply(fd: int, status: int, body: bytes | bytearray | memoryview) -> None:
    _write_all(fd, REPLY.pack(REPLY_MAGIC, status, len(body)), body)


def serve(requests: int, replies: int, max_payload: int) -> None:
    """Run jobs until the daemon closes ``requests``."""
    while True:
        head = _read_exactly(requests, REQUEST.size)
        if head is None:
            return
        magic, header_size, payload_size, size = REQUEST.unpack(head)
        if magic != REQUEST_MAGIC or header_size > MAX_HEADER or payload_size > max_payload:
            sys.exit("refmount worker: a request it does not understand")
        header = _read_exactly(requests, header_size)
        payload = _read_exactly(requests, payload_size)
        if header is None or payload is None:
            return
        try:
            job = json.loads(header)
            out = handler(job["kind"])(job["params"], memoryview(payload), size)
            if len(out) != size:
                raise ValueError(f"{job['kind']} job returned {len(out)} bytes, not {size}")
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}".encode(errors="replace")[:MAX_MESSAGE]
            _reply(replies, FAILED, message)
            continue
        del payload
        _reply(replies, OK, out)


def main(argv: list[str]) -> None:
    parent, memory_limit = int(argv[1]), int(argv[2])
    die_with(parent)
    settle_signals()
    if memory_limit > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    replies = reply_channel()
    for kind in JOBS:  # imported before the first job, whose deadline is the job's alone
        prepare(kind)
    _write_all(replies, READY)
    serve(0, replies, max_payload=memory_limit or 1 << 40)


if __name__ == "__main__":
    main(sys.argv)

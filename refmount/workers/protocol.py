"""The bytes between the daemon and a worker, over the worker's stdin and stdout.

A worker that has started says :data:`READY`.  A request is :data:`REQUEST` (magic,
header length, payload length, promised output size), a JSON header
``{"kind": ..., "params": ...}``, then the payload.  A reply is
:data:`REPLY` (magic, status, body length), then the body: the output (status
:data:`OK`), or a UTF-8 message (:data:`FAILED`).
"""

from __future__ import annotations

import struct

REQUEST = struct.Struct("<4sIQQ")
REQUEST_MAGIC = b"RMJ1"
REPLY = struct.Struct("<4sBQ")
REPLY_MAGIC = b"RMR1"
OK, FAILED = 0, 1
READY = b"RMW1"

#: The largest job header (JSON) and failure message, in bytes.
MAX_HEADER = 1 << 20
MAX_MESSAGE = 4096


def consume(views: list[memoryview], count: int) -> None:
    """Drop the first ``count`` bytes of ``views``: a ``readv``'s or ``writev``'s progress
    through the buffers of one message."""
    while count:
        if count >= len(views[0]):
            count -= len(views.pop(0))
        else:
            views[0], count = views[0][count:], 0

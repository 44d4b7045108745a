"""A raw socket HTTP server on 127.0.0.1 whose answers are the test's own bytes: for what
no well-behaved server does (framing that lies, answers nobody asked for, redirects,
interim answers), written byte for byte.

Each connection is served by a thread: it reads request heads (up to the blank line;
requests here have no body) and writes what ``answer(head)`` returns: bytes, or a list
of bytes and floats (a float is a pause, in seconds, between writes), and whether to keep
the connection open.  Every request head received is kept, in order, in ``requests``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable

from tests.support.servers import HOST

Reply = bytes | list[bytes | float]
Answer = Callable[[bytes], tuple[Reply, bool]]


class RawServer:
    """Answers each connection with ``answer(request_head) -> (reply, keep_open)``."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self.connections = 0
        self._listener = socket.create_server((HOST, 0), backlog=1024)
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def url(self, path: str, host: str = HOST) -> str:
        return f"http://{host}:{self.port}{path}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # a client that gave up resets
            buffered = b""
            while True:
                while b"\r\n\r\n" not in buffered:
                    piece = conn.recv(65536)
                    if not piece:
                        return
                    buffered += piece
                head, _, buffered = buffered.partition(b"\r\n\r\n")
                self.requests.append(head)
                reply, keep_open = self.answer(head)
                for part in [reply] if isinstance(reply, bytes) else reply:
                    if isinstance(part, float):
                        time.sleep(part)
                    else:
                        conn.sendall(part)
                if not keep_open:
                    return

    def close(self) -> None:
        self._listener.close()


def asked_range(head: bytes) -> tuple[int, int]:
    """``(first, last)`` of a request's ``Range: bytes=first-last``."""
    spec = next(line for line in head.split(b"\r\n") if line.lower().startswith(b"range:"))
    first, last = (int(x) for x in spec.split(b"=")[1].split(b"-"))
    return first, last


def header_lines(head: bytes) -> list[bytes]:
    """The header lines of a request head, lower-cased (the request line left out)."""
    return [line.lower() for line in head.split(b"\r\n")[1:]]


def partial(first: int, last: int, data: bytes, extra: str = "") -> bytes:
    """A correct 206 for bytes ``first-last`` of ``data`` (``extra``: more header lines,
    each ending in CRLF)."""
    body = data[first : last + 1]
    return (
        f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {first}-{last}/{len(data)}\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body

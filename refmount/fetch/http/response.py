"""The head of an HTTP/1.1 answer, read strictly and with bounds.

Only what a ranged GET needs is kept: the status, whether the connection may be used
again, and the headers by lower-case name (repeated headers joined with ``", "``, as
RFC 9110 allows for lists).  Anything a server should not send (an over-long head, a
status line or header that does not parse, a ``Content-Length`` that is not one
number) is a :class:`ProtocolError`: the answer is not used, its connection is closed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The largest head accepted, status line and headers together.
MAX_HEAD = 64 << 10
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-5][0-9][0-9])(?: [^\r\n]*)?")
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_CONTENT_RANGE = re.compile(r"bytes (\d{1,19})-(\d{1,19})/(\d{1,19}|\*)")


class ProtocolError(Exception):
    """An answer that is not HTTP/1.1 as a ranged GET expects it; retried like a
    transient failure (another attempt, on a new connection)."""


@dataclass(frozen=True)
class Head:
    """The status and headers of one answer."""

    status: int
    minor_version: int  # HTTP/1.<minor>
    headers: dict[str, str]

    def get(self, name: str) -> str | None:
        return self.headers.get(name)

    @property
    def keeps_alive(self) -> bool:
        """Whether the server leaves the connection open after this answer's body."""
        tokens = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        if self.minor_version == 0:
            return "keep-alive" in tokens
        return "close" not in tokens

    def content_length(self) -> int | None:
        """The body's length; None when the head gives none (a chunked or
        connection-delimited body)."""
        value = self.headers.get("content-length")
        if value is None:
            return None
        values = {v.strip() for v in value.split(",")}
        if len(values) != 1 or not (only := values.pop()).isdigit() or len(only) > 19:
            raise ProtocolError(f"Content-Length {value[:40]!r}")
        return int(only)

    def content_range(self) -> tuple[int, int, int | None] | None:
        """``(first, last, total)`` of a 206's ``Content-Range`` (``total`` None for
        ``*``), or None when it has none."""
        value = self.headers.get("content-range")
        if value is None:
            return None
        match = _CONTENT_RANGE.fullmatch(value.strip())
        if match is None:
            raise ProtocolError(f"Content-Range {value[:60]!r}")
        first, last, total = match.groups()
        return int(first), int(last), None if total == "*" else int(total)


def parse_head(data: bytes | bytearray | memoryview) -> Head:
    """The head of an answer: ``data`` is everything up to the blank line, excluded."""
    lines = bytes(data).split(b"\r\n")
    match = _STATUS_LINE.fullmatch(lines[0])
    if match is None:
        raise ProtocolError(f"status line {lines[0][:60]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None:
            raise ProtocolError(f"header line {line[:60]!r}")
        key = name.decode("ascii").lower()
        text = value.strip(b" \t").decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return Head(int(match.group(2)), int(match.group(1)), headers)

"""The head of an HTTP/1.1 answer, read strictly and with bounds.

Only what a ranged GET needs is kept: the status, whether the connection may be used
again, and the headers by lower-case name (repeated headers joined with ``", "``, as
RFC 9110 allows for lists).  Anything a server should not send (an over-long head, a
status line or header that does not parse, a bare CR or LF or a NUL in a header, a
``Content-Length`` that is not one number) is a :class:`ProtocolError`: the answer is
not used, its connection is closed.

How a body is framed is decided here too (RFC 9112 section 6.3): a range's body is
exactly ``Content-Length`` bytes, and an answer with any ``Transfer-Encoding`` is refused
whether or not it also gives a length (the encoding overrides the length, and a range
of an encoded body is not the range).  Interim answers (1xx) have no body and are
skipped by the connection, a bounded number of them (``MAX_INTERIM``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from refmount.fetch.digits import ascii_decimal

#: The largest head accepted, status line and headers together.
MAX_HEAD = 64 << 10
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-5][0-9][0-9])(?: [^\r\n]*)?")
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_CONTENT_RANGE = re.compile(r"bytes ([0-9]{1,19})-([0-9]{1,19})/([0-9]{1,19}|\*)")
#: What no header value holds: a bare CR or LF (another line hidden in this one), NUL.
_BAD_IN_VALUE = re.compile(rb"[\r\n\x00]")
#: Interim (1xx) answers skipped before the final one; more is a server that never answers.
MAX_INTERIM = 8


class ProtocolError(Exception):
    """An answer that is not HTTP/1.1 as a ranged GET expects it; retried like a
    transient failure (another attempt, on a new connection)."""


@dataclass(frozen=True)
class Head:
    """The status and headers of one answer."""

    status: int
    minor_version: int  # HTTP/1.<minor>
    headers: dict[str, str]
    #: each ``Set-Cookie`` value on its own: joined with ``", "`` they could not be told
    #: apart (an ``Expires`` date holds a comma)
    cookies: tuple[str, ...] = ()

    def get(self, name: str) -> str | None:
        return self.headers.get(name)

    @property
    def keeps_alive(self) -> bool:
        """Whether the server leaves the connection open after this answer's body."""
        tokens = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        if self.minor_version == 0:
            return "keep-alive" in tokens
        return "close" not in tokens

    @property
    def interim(self) -> bool:
        """Whether this is an interim answer (``100 Continue``, ``103 Early Hints``):
        no body, the final answer follows."""
        return 100 <= self.status < 200

    def framing(self) -> int:
        """The length of the body, when it is framed as a range's must be: by a
        ``Content-Length`` alone.  ProtocolError for any ``Transfer-Encoding`` (with or
        without a length: RFC 9112 lets the encoding win, and chunked framing is not
        read here), or no length at all."""
        encoding = self.headers.get("transfer-encoding")
        if encoding is not None:
            raise ProtocolError(f"a {self.status} with Transfer-Encoding {encoding[:40]!r}")
        length = self.content_length()
        if length is None:
            raise ProtocolError(f"a {self.status} without a Content-Length")
        return length

    def content_length(self) -> int | None:
        """The body's length; None when the head gives none (a chunked or
        connection-delimited body)."""
        value = self.headers.get("content-length")
        if value is None:
            return None
        values = {v.strip(" \t") for v in value.split(",")}
        if len(values) != 1 or (length := ascii_decimal(values.pop())) is None:
            raise ProtocolError(f"Content-Length {value[:40]!r}")
        return length

    def content_range(self) -> tuple[int, int, int | None] | None:
        """``(first, last, total)`` of a 206's ``Content-Range`` (``total`` None for
        ``*``), or None when it has none."""
        value = self.headers.get("content-range")
        if value is None:
            return None
        match = _CONTENT_RANGE.fullmatch(value.strip(" \t"))
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
    cookies: list[str] = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None or _BAD_IN_VALUE.search(value):
            raise ProtocolError(f"header line {line[:60]!r}")
        key = name.decode("ascii").lower()
        text = value.strip(b" \t").decode("latin-1")
        if key == "set-cookie":
            cookies.append(text)
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    head = Head(int(match.group(2)), int(match.group(1)), headers, tuple(cookies))
    if head.status == 101:
        raise ProtocolError("101 Switching Protocols, to a GET that asked for no switch")
    return head

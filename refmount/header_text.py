"""What may be written into an HTTP request line or header field.

Values that end up in a request come from untrusted places: a checksum ETag from an
Icechunk manifest (``If-Match``), a URL from a reference set or a manifest (the request
line, ``Host``), a user's header (``--remote-options``).  A CR or LF in one would end its
line and start another of the value's author's making (a header, or a whole second
request carrying the credentials the user keyed to that host).  Each value is checked
where it enters refmount, so that the error names the key or option it came with, and
again where a request is written.  :func:`escaped` shows such a value in a message
without its control characters (a log line never holds a raw CR or LF).
"""

from __future__ import annotations

import re

#: The longest header value sent (servers refuse heads past 8 to 64 KiB).
MAX_VALUE = 8192
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_IN_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # HTAB is allowed
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def value_problem(value: object) -> str | None:
    """Why ``value`` cannot be sent as a header field value as it is; None when it can."""
    if not isinstance(value, str):
        return f"not text ({type(value).__name__})"
    if _CONTROL_IN_VALUE.search(value):
        return "holds a control character (CR, LF, NUL ...)"
    if len(value) > MAX_VALUE:
        return f"longer than {MAX_VALUE} characters"
    if not value.isascii() and max(map(ord, value)) > 255:
        return "not Latin-1 text"
    return None


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot be sent as a header field name; None when it can."""
    if not isinstance(name, str) or _TOKEN.fullmatch(name) is None:
        return "not a header name (letters, digits and !#$%&'*+.^_`|~- only)"
    return None


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be asked for as it is written; None when it can."""
    if _CONTROL.search(url):
        return "holds a control character (CR, LF, NUL, TAB ...)"
    return None


def escaped(text: str, limit: int | None = 200) -> str:
    """``text`` (its first ``limit`` characters) with every control character written as
    an escape (``\\r``, ``\\n``, ``\\x00``): safe for one line of a log or a message."""
    cut = text if limit is None or len(text) <= limit else text[:limit] + "..."
    return _CONTROL.sub(lambda found: repr(found.group())[1:-1], cut)

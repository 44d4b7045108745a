"""Keeping credentials out of everything refmount shows: the one place every layer asks.

A URL may carry a password (``https://user:pass@host/refs.json``) or a signed query
string (``?token=...``).  refmount shows URLs in ``/proc/mounts`` (the fsname), in its
log, in its error messages and xattrs, and libraries quote URLs in their exceptions.

* :func:`redact` writes a URL without user information or query string; it raises
  ``ValueError`` for a URL it cannot split (a bad port).  :func:`redact_url` and
  :func:`shown` are the same for every URL, each with its own answer to one it cannot
  split: the protocol alone (messages about reference sets), or the URL cut before its
  query and after its user information (the REFS of a mount).
* :func:`redact_text` redacts every URL quoted in a message.
* :func:`display_url` is a target URL as people see it: a local path as a ``file://`` URL.
* A :class:`Scrubber` replaces a REFS URL and each secret part of it wherever it still
  appears (a library may quote only a part); :class:`ScrubbingFormatter` puts every log
  line through one.
"""

from __future__ import annotations

import logging
import os.path
import re
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from fsspec.core import split_protocol

from refmount.header_text import escaped
from refmount.protocols import LOCAL_PROTOCOLS

HIDDEN = "***"
#: Shorter query values ("1", "json") are not secrets, and hiding them garbles messages.
MIN_SECRET = 4
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>()\[\]{},]+")


def redact(url: str) -> str:
    """The URL without user information or query string, for logs and xattrs."""
    parts = urlsplit(url)
    if not parts.scheme or parts.scheme in LOCAL_PROTOCOLS:
        return url
    netloc = parts.hostname or ""
    port = parts.netloc.rpartition("@")[2].rpartition(":")[2]
    if port.isdigit():  # parts.port raises on a chained URL's "zip://a::file:..."
        netloc = f"{netloc}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def redact_url(url: str) -> str:
    """:func:`redact`, also for a URL it cannot parse (a bad port)."""
    try:
        return redact(url)
    except ValueError:
        return f"{url.partition('://')[0]}://<redacted>"


def redact_text(text: str) -> str:
    """``text`` with credentials (``user:pass@``, query strings) removed from every URL
    in it: for messages that quote a URL, or an error of a library that did."""
    return _URL_IN_TEXT.sub(lambda found: redact_url(found.group()), text)


def shown(url: str) -> str:
    """``url`` as refmount shows it: without user information or query string."""
    try:
        return redact(url)
    except ValueError:  # not a URL one can split: show nothing of it that may be secret
        return url.partition("?")[0].rpartition("@")[2]


def display_url(url: str) -> str:
    """``/data/x.nc`` -> ``file:///data/x.nc``; a remote URL without user information or
    query string (``https://u:p@h/x?sig=s`` -> ``https://h/x``).

    A relative local path is made absolute.  Local paths are not percent-encoded: the
    result is what fsspec itself accepts (``fsspec.open("file:///data/my file.nc")``)."""
    protocol, path = split_protocol(url)
    if protocol is None or protocol in LOCAL_PROTOCOLS:
        return f"file://{os.path.abspath(path)}"
    return redact(url)


def secrets_of(url: str) -> list[str]:
    """The parts of ``url`` that must not be shown, longest first."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = [parts.query, parts.fragment, parts.password or "", parts.username or ""]
    found += [value for _, value in parse_qsl(parts.query, keep_blank_values=True)]
    return sorted({s for s in found if len(s) >= MIN_SECRET}, key=len, reverse=True)


class Scrubber:
    """Rewrites text so that it shows ``url`` only as :func:`shown` does."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._shown = shown(url)
        self._secrets = secrets_of(url)

    def __call__(self, text: str) -> str:
        if not self._secrets:
            return text
        text = text.replace(self._url, self._shown)
        for secret in self._secrets:
            text = text.replace(secret, HIDDEN)
        return text


class ScrubbingFormatter(logging.Formatter):
    """A formatter whose every line (tracebacks included) went through a scrubber, and
    whose message is one line: a control character in it (a CR LF a reference set or a
    server put in a value quoted by the message) is written as an escape, so that no
    value can forge a line of the log."""

    def __init__(self, scrub: Scrubber, fmt: str | None = None) -> None:
        super().__init__(fmt)
        self._scrub = scrub

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escaped(record.message, limit=None)
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        return self._scrub(super().format(record))

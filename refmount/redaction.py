"""Keeping the credentials of a REFS URL out of everything refmount shows.

A REFS URL may carry a password (``https://user:pass@host/refs.json``) or a signed query
string (``?token=...``).  refmount shows REFS in ``/proc/mounts`` (the fsname), in its
log and in its error messages, and libraries quote URLs in their exceptions: every one
of those passes through a :class:`Scrubber`, which writes the URL without them and
replaces each secret part wherever it still appears.
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl, urlsplit

from refmount.fetch import redact

HIDDEN = "***"
#: Shorter query values ("1", "json") are not secrets, and hiding them garbles messages.
MIN_SECRET = 4


def shown(url: str) -> str:
    """``url`` as refmount shows it: without user information or query string."""
    try:
        return redact(url)
    except ValueError:  # not a URL one can split: show nothing of it that may be secret
        return url.partition("?")[0].rpartition("@")[2]


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
    """A formatter whose every line (tracebacks included) went through a scrubber."""

    def __init__(self, scrub: Scrubber, fmt: str | None = None) -> None:
        super().__init__(fmt)
        self._scrub = scrub

    def format(self, record: logging.LogRecord) -> str:
        return self._scrub(super().format(record))

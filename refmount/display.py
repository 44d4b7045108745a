"""Target URLs as people should see them: with their protocol, without secrets."""

from __future__ import annotations

import os.path

from fsspec.core import split_protocol

from refmount.fetch import LOCAL_PROTOCOLS, redact


def display_url(url: str) -> str:
    """``/data/x.nc`` -> ``file:///data/x.nc``; a remote URL without user information or
    query string (``https://u:p@h/x?sig=s`` -> ``https://h/x``).

    A relative local path is made absolute.  Local paths are not percent-encoded: the
    result is what fsspec itself accepts (``fsspec.open("file:///data/my file.nc")``)."""
    protocol, path = split_protocol(url)
    if protocol is None or protocol in LOCAL_PROTOCOLS:
        return f"file://{os.path.abspath(path)}"
    return redact(url)

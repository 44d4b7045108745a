"""Changing a served file the way a publisher does, and asking a server what version
it serves: for the tests of references that carry checksums."""

from __future__ import annotations

import os
import random
import urllib.request
from pathlib import Path


def replace(path: Path, seed: int) -> bytes:
    """Put new bytes of the same size at ``path`` (a new file renamed over it), modified
    100 s later than the old one, so that its ETag and Last-Modified change for any
    server; returns the new bytes."""
    old = path.stat()
    data = random.Random(seed).randbytes(old.st_size)
    fresh = path.with_suffix(".new")
    fresh.write_bytes(data)
    os.utime(fresh, ns=(old.st_atime_ns, old.st_mtime_ns + 100 * 10**9))
    fresh.replace(path)
    return data


def touch_later(path: Path, seconds: int = 5) -> None:
    """Move ``path``'s modification time ``seconds`` on, its bytes unchanged."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + seconds * 10**9))


def etag(url: str) -> str:
    """The ETag an HTTP server gives ``url`` now."""
    request = urllib.request.Request(url, method="HEAD")
    with urllib.request.urlopen(request) as resp:
        return str(resp.headers["ETag"])

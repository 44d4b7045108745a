"""Reading a mounted file in exactly one FUSE read request, and a daemon's counters."""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path

from tests.support.mounting import Mounted


def read_once(path: Path) -> bytes:
    """The whole file in one read request (O_DIRECT: no page cache, so no read-ahead and
    no second try, which the kernel makes after a failed page read)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        size = os.fstat(fd).st_size
        buffer = mmap.mmap(-1, max(size, 1) + 4095 & ~4095)  # page-aligned for O_DIRECT
        with buffer:
            done = os.preadv(fd, [buffer], 0)
            return buffer[:done]
    finally:
        os.close(fd)


def stats(mounted: Mounted) -> dict[str, int]:
    """The daemon's counters (its ``user.refmount.stats`` xattr: mounted with ``--xattrs``)."""
    return json.loads(os.getxattr(mounted.mountpoint, "user.refmount.stats"))

"""Kernel settings of a FUSE mount that pyfuse3 cannot pass: read-ahead and background.

The kernel's defaults (128 KiB read-ahead, 12 requests in the background) hide almost
none of a remote store's latency; raising them after mounting is what gcsfuse does too.

``tune_kernel`` stats the mount point, which the kernel answers by asking the FUSE
daemon (GETATTR).  It must therefore run in a thread or process other than the one
serving FUSE requests, e.g. ``await trio.to_thread.run_sync(tune_kernel, ...)`` from the
daemon once ``pyfuse3.main`` is running, or from the parent process after the mount is
ready: called from the serving thread it would deadlock.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

BDI_ROOT = Path("/sys/class/bdi")
CONNECTIONS_ROOT = Path("/sys/fs/fuse/connections")


def tune_kernel(mountpoint: str, *, read_ahead_kb: int, max_background: int) -> None:
    """Best effort: set the mount's read-ahead and its background request limit.

    Writes ``read_ahead_kb`` to ``/sys/class/bdi/0:<minor>/read_ahead_kb``, and
    ``max_background`` and ``congestion_threshold`` (three quarters of it) to
    ``/sys/fs/fuse/connections/<minor>/``.  Failures (no permission, no sysfs, an
    older kernel) are logged, never raised: the mount works without them, only slower.
    """
    try:
        minor = os.minor(os.stat(mountpoint).st_dev)
    except OSError as exc:
        log.warning("cannot tune the kernel for %s: stat failed: %s", mountpoint, exc)
        return
    congestion = max(1, max_background * 3 // 4)
    settings = [
        (BDI_ROOT / f"0:{minor}" / "read_ahead_kb", read_ahead_kb),
        (CONNECTIONS_ROOT / str(minor) / "max_background", max_background),
        (CONNECTIONS_ROOT / str(minor) / "congestion_threshold", congestion),
    ]
    for path, value in settings:
        _write(path, value)


def _write(path: Path, value: int) -> bool:
    try:
        path.write_text(f"{value}\n")
    except OSError as exc:
        level = logging.DEBUG if isinstance(exc, FileNotFoundError) else logging.WARNING
        log.log(level, "could not set %s to %d: %s", path, value, exc)
        return False
    log.debug("set %s to %d", path, value)
    return True

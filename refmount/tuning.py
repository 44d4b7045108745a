"""Kernel settings of a FUSE mount that pyfuse3 cannot pass: read-ahead and background.

The kernel's defaults (128 KiB read-ahead, 12 requests in the background) hide almost
none of a remote store's latency; raising them after mounting is what gcsfuse does too.

``tune_kernel`` stats the mount point, which the kernel answers by asking the FUSE
daemon (GETATTR).  It must therefore run in a thread or process other than the one
serving FUSE requests, e.g. ``await trio.to_thread.run_sync(tune_kernel, ...)`` from the
daemon once ``pyfuse3.main`` is running, or from the parent process after the mount is
ready: called from the serving thread it would deadlock.

pyfuse3 itself can be asked for fewer round trips only when it carries refmount's patch
(``.ci/pyfuse3-refmount.patch``, built by ``bash .ci/setup``): ``PYFUSE3_PATCHED`` says
whether it does, and ``log_fuse_features`` says so at start.

The background limit lives in fusectl (``/sys/fs/fuse/connections``).  systemd mounts it
at boot; a bare container or a fresh VM may not, and then only root can mount it:
``tune_kernel`` does so, best effort, when the mount's directory is missing there.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pyfuse3

log = logging.getLogger(__name__)

#: pyfuse3 with refmount's patch: ``read`` gets the inode of a file opened without OPEN,
#: so ``open`` may answer ENOSYS and the kernel then sends neither OPEN nor RELEASE (two
#: of a small file's four round trips); ``readdirplus_auto`` lets the kernel list with
#: plain READDIR where nobody stats the entries (``find``).
PYFUSE3_PATCHED = getattr(pyfuse3, "REFMOUNT_PATCH", 0) >= 1

BDI_ROOT = Path("/sys/class/bdi")
CONNECTIONS_ROOT = Path("/sys/fs/fuse/connections")


def log_fuse_features() -> None:
    """Say at start whether this pyfuse3 lets files be read without OPEN and RELEASE."""
    if PYFUSE3_PATCHED:
        log.info("pyfuse3 %s with refmount's patch: files are read without OPEN and RELEASE",
                 pyfuse3.__version__)  # fmt: skip
    else:
        log.info(
            "pyfuse3 %s without refmount's patch (bash .ci/setup builds it): every file open"
            " costs an OPEN and a RELEASE round trip",
            pyfuse3.__version__,
        )


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
    if not (CONNECTIONS_ROOT / str(minor)).exists():
        mount_fusectl(CONNECTIONS_ROOT)
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


def mount_fusectl(path: Path) -> bool:
    """Mount the FUSE control filesystem on ``path`` if it is not mounted; True if it is
    mounted afterwards.  Best effort and logged: only root may mount it, and only an
    existing empty directory that is not a mount point is used (a non-empty one means
    something else lives there)."""
    if os.path.ismount(path):
        return True
    if not path.is_dir() or any(path.iterdir()):
        log.debug("fusectl: %s is not an empty directory: not mounting it", path)
        return False
    if os.geteuid() != 0:
        log.warning(
            "fusectl is not mounted on %s and only root can mount it: the background"
            " request limit stays at the kernel default (mount -t fusectl none %s)",
            path,
            path,
        )
        return False
    try:
        result = subprocess.run(
            ["mount", "-t", "fusectl", "none", str(path)],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("fusectl: could not run mount on %s: %s", path, exc)
        return False
    if result.returncode != 0:
        log.warning("fusectl: mount on %s failed: %s", path, result.stderr.strip())
        return False
    log.info("fusectl was not mounted: mounted it on %s", path)
    return True

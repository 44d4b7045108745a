"""The daemon's control channel: a unix socket that answers every connection with one
JSON document, the mount's live state (what ``refmount status`` shows).

The socket is found from the mount point alone, whatever the mount's options (see
:func:`socket_path`): it lives in a directory only its user can enter, is made mode 0600,
and is removed when the daemon stops.  A crashed daemon's socket is replaced by the next
daemon on the same mount point.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import socket
import stat
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import trio

from refmount import __version__

log = logging.getLogger(__name__)

SYSTEM_DIR = Path("/run/refmount")
ANSWER_SECONDS = 5.0  # a client that does not take its answer within this is dropped


def socket_dir(uid: int) -> Path:
    """Where the daemons of user ``uid`` keep their control sockets: ``/run/refmount``
    for root; ``$XDG_RUNTIME_DIR/refmount`` for the user running this process;
    ``/run/user/UID/refmount`` for another user (or this one without the variable) when
    that exists; else ``$TMPDIR/refmount-UID``."""
    if uid == 0:
        return SYSTEM_DIR
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if uid == os.geteuid() and runtime:
        return Path(runtime) / "refmount"
    run_user = Path(f"/run/user/{uid}")
    if run_user.is_dir():
        return run_user / "refmount"
    return Path(tempfile.gettempdir()) / f"refmount-{uid}"


def socket_path(real_mountpoint: str, uid: int) -> Path:
    """The control socket of the daemon user ``uid`` runs on ``real_mountpoint`` (a real
    path, as /proc/mounts shows it): named by a digest of it, since a socket's path may
    not exceed 107 bytes."""
    digest = hashlib.sha256(real_mountpoint.encode("utf-8", "surrogateescape")).hexdigest()
    return socket_dir(uid) / f"{digest[:32]}.sock"


class CacheStats(Protocol):
    def stats(self) -> dict[str, int]: ...


class FetchCounters(Protocol):
    def as_dict(self) -> dict[str, Any]: ...


class ReadsInFlight:
    """Counts READ requests from their arrival to their answer."""

    def __init__(self) -> None:
        self.count = 0

    def counting(
        self, read: Callable[[int, int, int], Awaitable[Any]]
    ) -> Callable[[int, int, int], Awaitable[Any]]:
        """``read`` (an Operations' method), counted."""

        async def counted(fh: int, off: int, size: int) -> Any:
            self.count += 1
            try:
                return await read(fh, off, size)
            finally:
                self.count -= 1

        return counted


@dataclass
class MountState:
    """What ``refmount status`` reports.  Counters are read when asked, from the live
    objects; ``keys`` is asked of the current reference set (a reload may replace it)."""

    refs: str  # redacted
    mountpoint: str
    fetch: FetchCounters
    cache: CacheStats
    keys: Callable[[], int | None]
    reads: ReadsInFlight = field(default_factory=ReadsInFlight)
    mounted_since: float = field(default_factory=time.time)
    last_reload: dict[str, Any] | None = None
    #: a catalog's sets: how many, which are loaded (with their keys), load errors
    catalog: Callable[[], dict[str, Any]] | None = None
    #: which version of its source the set serves (see RefSet.source_version)
    version: Callable[[], dict[str, Any] | None] = lambda: None
    #: when ``--reload-interval`` last asked the source whether it changed
    last_check: float | None = None
    #: how many file inodes the kernel holds (looked up, less what it forgot)
    kernel_files: Callable[[], int] = lambda: 0

    def record_reload(self, *, ok: bool, message: str = "") -> None:
        """Note a reload: when, whether it took, and what it said (why it failed, or
        what changed)."""
        self.last_reload = {"time": time.time(), "ok": ok, "message": message}

    def record_check(self) -> None:
        """Note that the source was asked whether it changed (and answered)."""
        self.last_check = time.time()

    def snapshot(self) -> dict[str, Any]:
        return {
            "refmount": __version__,
            "pid": os.getpid(),
            "mountpoint": self.mountpoint,
            "refs": self.refs,
            "mounted_since": self.mounted_since,
            "last_reload": self.last_reload,
            "keys": self.keys(),
            "reads_in_flight": self.reads.count,
            "kernel_files": self.kernel_files(),
            "fetch": self.fetch.as_dict(),
            "cache": self.cache.stats(),
            **({"catalog": self.catalog()} if self.catalog is not None else {}),
            **({"version": version} if (version := self.version()) is not None else {}),
            "last_check": self.last_check,
        }


class ControlServer:
    """Serves :class:`MountState` on the control socket, from a task in the daemon's
    nursery.  A failure to set the socket up is logged and leaves the mount serving."""

    def __init__(self, path: Path, state: MountState) -> None:
        self.path = path
        self.state = state

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            listener = await self._listen()
        except OSError as exc:
            log.warning("no status channel (refmount status will not answer): %s", exc)
            task_status.started()
            return
        identity = os.stat(self.path)
        try:
            task_status.started()
            async with trio.open_nursery() as nursery:
                while True:
                    try:
                        connection, _ = await listener.accept()
                    except OSError as exc:  # EMFILE and the like: wait, do not spin
                        log.warning("status channel: %s", exc)
                        await trio.sleep(1)
                        continue
                    nursery.start_soon(self._answer, connection)
        finally:
            listener.close()
            self._remove(identity)

    async def _listen(self) -> trio.socket.SocketType:
        _private_directory(self.path.parent)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)  # left by a daemon that did not stop cleanly
        listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await listener.bind(os.fspath(self.path))
            os.chmod(self.path, 0o600)
            listener.listen(16)
        except OSError:
            listener.close()
            raise
        return listener

    async def _answer(self, connection: trio.socket.SocketType) -> None:
        with connection, trio.move_on_after(ANSWER_SECONDS):
            try:
                document = json.dumps(self.state.snapshot(), sort_keys=True).encode() + b"\n"
                view = memoryview(document)
                while view:
                    view = view[await connection.send(view) :]
            except OSError as exc:
                log.debug("status client went away: %s", exc)
            except Exception:  # the daemon must not die because of one status request
                log.exception("status answer failed")

    def _remove(self, identity: os.stat_result) -> None:
        """Remove the socket if it is still the one this daemon made."""
        try:
            now = os.lstat(self.path)
            if (now.st_dev, now.st_ino) == (identity.st_dev, identity.st_ino):
                os.unlink(self.path)
        except OSError:
            pass


def _private_directory(path: Path) -> None:
    """Make ``path`` (mode 0700), or check that an existing one is this user's own and
    closed to others: a socket in a directory someone else controls could be swapped."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise OSError(errno.EPERM, f"{path} is not a directory of this user")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)

"""Local files: reads in worker threads, and small reads answered at once from memory.

A small read whose pages are already in memory is one ``preadv(RWF_NOWAIT)`` on the
serving thread, on a descriptor kept open from an earlier read, instead of a worker
thread that opens, reads and closes (about half a millisecond on a small machine, most
of a random chunk read).  Anything the kernel cannot answer at once (pages not cached, a
short read) takes the ordinary path, with its deadline.
"""

from __future__ import annotations

import os
import stat
from collections import OrderedDict

import trio
from fsspec.implementations.local import LocalFileSystem

from refmount.errors import FetchError
from refmount.fetch import checksums
from refmount.fetch.backend import Version
from refmount.refs.model import Checksum

NOWAIT_MAX = 1 << 20  # the largest local read tried on the serving thread
OPEN_LOCAL_FILES = 256  # descriptors kept open for the fast path


def local_path(url: str) -> str:
    """The filesystem path of a local URL (``file:///x``, ``local://x`` or a path)."""
    return LocalFileSystem._strip_protocol(url)


class LocalBackend:
    """Local files.  Descriptors of files read before are kept, by URL, least recently
    used first; they are used, added and closed only on the serving thread, so no
    descriptor is ever closed (and its number reused) while a read uses it."""

    def __init__(self, limit: int = OPEN_LOCAL_FILES) -> None:
        self.limit = limit
        self._fds: OrderedDict[str, int] = OrderedDict()

    def try_now(
        self, url: str, start: int, end: int, checksum: Checksum | None = None
    ) -> bytes | None:
        """Bytes ``[start, end)`` if the kernel has them all in memory, else None (also
        when the file is not the version ``checksum`` names: the ordinary path says so)."""
        if end - start > NOWAIT_MAX:
            return None
        fd = self._fds.get(url)
        if fd is None:
            return None
        self._fds.move_to_end(url)
        buffer = bytearray(end - start)
        try:
            st = os.fstat(fd)
            if st.st_nlink == 0:  # deleted or replaced since: the path decides
                os.close(self._fds.pop(url))
                return None
            if checksum is not None:
                checksums.verify_stat(url, checksum, st)
            got = os.preadv(fd, [buffer], start, os.RWF_NOWAIT)
        except (OSError, checksums.ChangedObject):
            # EAGAIN: not all in memory; EOPNOTSUPP: a filesystem without it
            return None
        return bytes(buffer) if got == len(buffer) else None

    async def read(self, url: str, start: int, end: int, checksum: Checksum | None = None) -> bytes:
        data, fd = await trio.to_thread.run_sync(
            _read_local, url, start, end, checksum, abandon_on_cancel=True
        )
        self._keep(url, fd)
        return data

    async def size(self, url: str) -> int:
        st = await trio.to_thread.run_sync(os.stat, local_path(url), abandon_on_cancel=True)
        if not stat.S_ISREG(st.st_mode):
            raise FetchError(f"{local_path(url)} is not a regular file")
        return st.st_size

    async def version(self, url: str) -> Version:
        """Device, inode, size and mtime: a file replaced or rewritten changes one."""
        st = await trio.to_thread.run_sync(os.stat, local_path(url), abandon_on_cancel=True)
        validator = f"file:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
        modified = st.st_mtime_ns // 1_000_000_000
        return Version(validator, st.st_size, checksums.local_etag(st), modified)

    async def prepare(self) -> None:
        pass

    def _keep(self, url: str, fd: int) -> None:
        if url in self._fds:
            os.close(fd)
            return
        self._fds[url] = fd
        while len(self._fds) > self.limit:
            os.close(self._fds.popitem(last=False)[1])

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])


def _read_local(url: str, start: int, end: int, checksum: Checksum | None) -> tuple[bytes, int]:
    """Bytes ``[start, end)`` of a local file (fewer at its end), and the descriptor it
    was read through, for the fast path to keep.  With a ``checksum``, the file opened
    must be the version it names (checked on the descriptor: a file replaced after the
    check is not the one read).  Runs in a worker thread."""
    fd = os.open(local_path(url), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if checksum is not None:
            checksums.verify_stat(url, checksum, os.fstat(fd))
        pieces = []
        while start < end and (piece := os.pread(fd, end - start, start)):
            pieces.append(piece)
            start += len(piece)
        return b"".join(pieces), fd
    except BaseException:
        os.close(fd)
        raise

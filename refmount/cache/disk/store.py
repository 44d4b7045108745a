"""The files of a cache directory: entries, temporary files, and one lock per process.

Layout of ``DIR``::

    data/ab/cdef...       entries (:mod:`refmount.cache.disk.entry`), by key hash
    tmp/OWNER.N           entries being written by the process OWNER
    locks/OWNER           one per live process, held with flock(LOCK_EX) while it lives
    index.sqlite          the advisory index (:mod:`refmount.cache.disk.index`)

An entry is written whole to ``tmp/`` and renamed into ``data/``: a crash at any moment
leaves either no entry or a whole one, and at most a temporary file, which the next
process to start removes once the flock of its owner's lock file is free (the kernel
drops a flock when its process dies, however it dies).  No fsync: a crash of the machine
may leave an entry with lost bytes, which its checksum catches on the next read.

An entry that another process evicts while this one reads it stays readable until
closed (unlink keeps an open file); a read here opens, reads and closes in one go.
Checked bytes are read into this process's memory (never mapped): another process
cannot change them after their check.

Every method does blocking I/O: callers run them in worker threads.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import os
import re
import secrets
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from refmount.cache.disk.entry import (
    CorruptEntry,
    Entry,
    EntryKey,
    decode_header,
    encode,
    header_length,
    with_data,
)

#: Errors that mean "no room, or no writing here": admission stops for a while.
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})
_ENTRY_NAME = re.compile(r"^[0-9a-f]{62}$")
_PREFIX = re.compile(r"^[0-9a-f]{2}$")
HEAD_READ = 4096  # bytes read first: the whole header of nearly every entry


class DiskCacheError(Exception):
    """The cache directory cannot be used; the message says why."""


@dataclass(frozen=True)
class Space:
    """The cache filesystem's free space and size, in bytes, and its block size."""

    free: int
    total: int
    block: int

    def on_disk(self, length: int) -> int:
        """The bytes a file of ``length`` bytes takes: whole blocks."""
        return -(-length // self.block) * self.block


class Store:
    """One process's view of a cache directory."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.data = os.path.join(self.root, "data")
        self.tmp = os.path.join(self.root, "tmp")
        self.locks = os.path.join(self.root, "locks")
        self.index_path = os.path.join(self.root, "index.sqlite")
        self._check_root()
        self.owner = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._lock_fd = self._take_lock()
        self._seq = itertools.count()

    # -- start and stop -------------------------------------------------------------------

    def _check_root(self) -> None:
        """Make ``DIR`` and its subdirectories; refuse one owned by another user (its
        entries could have been planted: a checksum is no signature) or one this
        process cannot write."""
        try:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            st = os.stat(self.root)
        except OSError as exc:
            raise DiskCacheError(f"cannot use {self.root}: {exc.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise DiskCacheError(f"{self.root} is not a directory")
        if st.st_uid != os.geteuid():
            raise DiskCacheError(
                f"{self.root} belongs to uid {st.st_uid}, not to this user (uid "
                f"{os.geteuid()}): a cache directory must be the user's own"
            )
        for path in (self.data, self.tmp, self.locks):
            try:
                os.makedirs(path, mode=0o700, exist_ok=True)
            except OSError as exc:
                raise DiskCacheError(f"cannot use {self.root}: {exc.strerror}") from None

    def _take_lock(self) -> int:
        """Create ``locks/OWNER`` already locked: made under a dot name, flocked, then
        renamed into place, so nobody sees it unlocked.  (A sweeper that flocks the dot
        file first takes it for a dead one and removes it: then we make another.)"""
        final = os.path.join(self.locks, self.owner)
        for attempt in range(3):
            draft = os.path.join(self.locks, f".{self.owner}.{attempt}")
            try:
                fd = os.open(draft, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise DiskCacheError(f"cannot write in {self.root}: {exc.strerror}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.rename(draft, final)
                return fd
            except OSError:
                os.close(fd)
        raise DiskCacheError(f"cannot take a lock file in {self.locks}")

    def close(self) -> None:
        """Remove this process's temporary files and its lock."""
        self._remove_temps_of(self.owner)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.locks, self.owner))
        os.close(self._lock_fd)

    def alive(self, owner: str) -> bool:
        """Whether the process ``owner`` still holds its lock (is alive)."""
        if owner == self.owner:
            return True
        try:
            fd = os.open(os.path.join(self.locks, owner), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False  # gone: its process stopped, or a sweep found it dead
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False

    def sweep(self) -> int:
        """Remove the lock and temporary files of processes that died; returns how many
        died.  Also removes temporary files whose owner has no lock at all."""
        dead = 0
        for name in _listdir(self.locks):
            if name == self.owner:
                continue
            path = os.path.join(self.locks, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue  # alive
            try:
                if not name.startswith("."):
                    self._remove_temps_of(name)
                    dead += 1
                with contextlib.suppress(OSError):
                    os.unlink(path)
            finally:
                os.close(fd)
        for name in _listdir(self.tmp):
            owner = name.partition(".")[0]
            # A live owner made its lock before any temporary file: asked now, not from
            # a listing, a temporary file of a process that started meanwhile is kept.
            if owner != self.owner and not os.path.exists(os.path.join(self.locks, owner)):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.tmp, name))
        return dead

    def _remove_temps_of(self, owner: str) -> None:
        for name in _listdir(self.tmp):
            if name.partition(".")[0] == owner:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.tmp, name))

    # -- entries --------------------------------------------------------------------------

    def path(self, name: str) -> str:
        return os.path.join(self.data, name)

    def read(self, key: EntryKey) -> Entry | None:
        """The entry of ``key``; None when there is none; :class:`CorruptEntry` (the
        file removed) when there is one that fails a check."""
        fd = self.open(key)
        if fd is None:
            return None
        try:
            return self.read_entry(key, fd)
        finally:
            os.close(fd)

    def open(self, key: EntryKey) -> int | None:
        """A descriptor of ``key``'s entry file (the caller closes it), None if none."""
        try:
            return os.open(self.path(key.name), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None

    def read_whole(self, key: EntryKey, fd: int, whole: memoryview) -> Entry | Literal[True]:
        """Read ``fd``, the open file of ``key``'s entry, into ``whole`` (``key.length``
        bytes) when the entry holds the whole unit: header and data in one ``preadv``,
        the data checked where it landed, no other copy; True.  Any other entry (some
        spans of the unit) comes back as by :meth:`read_entry`."""
        st = os.fstat(fd)
        if st.st_size == key.whole_header_length + key.length:
            head = bytearray(key.whole_header_length)
            with self._removed_if_corrupt(key, st):
                got = os.preadv(fd, [head, whole], 0)
                if got == st.st_size and header_length(head) == len(head):
                    header = decode_header(key, head)
                    if header.spans == [(key.offset, key.end)]:
                        if zlib.crc32(whole) != header.data_crc:
                            raise CorruptEntry("data checksum mismatch")
                        return True
        return self.read_entry(key, fd, st)

    def read_entry(self, key: EntryKey, fd: int, st: os.stat_result | None = None) -> Entry:
        """The entry in ``fd``, the open file of ``key``'s entry, checked, or
        :class:`CorruptEntry` (the file removed).  Header and data are read apart, so
        that the data is one ``bytes`` object the reader gets as it is."""
        st = st or os.fstat(fd)
        with self._removed_if_corrupt(key, st):
            head = os.pread(fd, HEAD_READ, 0)
            length = header_length(head)
            if length > len(head):
                head = os.pread(fd, length, 0)
            header = decode_header(key, head)
            if st.st_size != header.data_offset + header.size:
                raise CorruptEntry(
                    f"{st.st_size - header.data_offset} bytes of data, "
                    f"the header says {header.size}"
                )
            return with_data(header, _read_all(fd, header.size, header.data_offset))

    @contextlib.contextmanager
    def _removed_if_corrupt(self, key: EntryKey, st: os.stat_result) -> Iterator[None]:
        """Remove the entry file ``st`` describes if the block raises CorruptEntry."""
        try:
            yield
        except CorruptEntry:
            self._remove_if_same(self.path(key.name), st)
            raise

    def _remove_if_same(self, path: str, st: os.stat_result) -> None:
        """Unlink ``path`` if it is still the file that was read (another process may
        have replaced it with a good entry since)."""
        with contextlib.suppress(OSError):
            now = os.stat(path)
            if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                os.unlink(path)

    def write_temp(self, key: EntryKey, entry: Entry) -> tuple[str, int]:
        """Write ``key``'s entry to a new temporary file: (its path, the bytes it takes on
        disk, in allocated blocks).  OSError (ENOSPC, EDQUOT, EROFS ...) as raised,
        with nothing left behind."""
        temp = os.path.join(self.tmp, f"{self.owner}.{next(self._seq)}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            pieces = encode(key, entry)
            want = sum(len(p) for p in pieces)
            done = os.writev(fd, pieces)
            if done != want:  # a short write: the rest, piece by piece
                blob = b"".join(pieces)
                while done < want:
                    done += os.write(fd, blob[done:])
            allocated = os.fstat(fd).st_blocks * 512
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        os.close(fd)
        return temp, allocated

    def place(self, temp: str, name: str) -> None:
        """Rename a written temporary file into place as entry ``name``."""
        target = self.path(name)
        try:
            os.rename(temp, target)
        except FileNotFoundError:
            if not os.path.exists(temp):
                raise
            os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
            os.rename(temp, target)

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(name))

    def discard(self, temp: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(temp)

    def free(self) -> int:
        return self.space().free

    def writing(self) -> dict[str, int]:
        """The bytes the temporary files take now, by owner (a file gone meanwhile,
        renamed into place or removed, counts nothing)."""
        found: dict[str, int] = {}
        for name in _listdir(self.tmp):
            with contextlib.suppress(OSError):
                size = os.stat(os.path.join(self.tmp, name)).st_blocks * 512
                owner = name.partition(".")[0]
                found[owner] = found.get(owner, 0) + size
        return found

    def space(self) -> Space:
        st = os.statvfs(self.root)
        return Space(
            free=st.f_bavail * st.f_frsize, total=st.f_blocks * st.f_frsize, block=st.f_bsize
        )

    def prefixes(self) -> list[str]:
        """The data subdirectories there are (``"00"`` to ``"ff"``)."""
        return sorted(n for n in _listdir(self.data) if _PREFIX.match(n))

    def scan(self, prefix: str) -> dict[str, tuple[int, float]]:
        """The entries of one data subdirectory: name -> (bytes allocated, mtime)."""
        found: dict[str, tuple[int, float]] = {}
        try:
            with os.scandir(os.path.join(self.data, prefix)) as entries:
                for entry in entries:
                    if not _ENTRY_NAME.match(entry.name):
                        continue
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISREG(st.st_mode):
                        found[f"{prefix}/{entry.name}"] = (st.st_blocks * 512, st.st_mtime)
        except FileNotFoundError:
            pass
        return found


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _read_all(fd: int, size: int, offset: int) -> bytes:
    """``size`` bytes of ``fd`` from ``offset`` (fewer if the file is shorter)."""
    data = os.pread(fd, size, offset)
    if len(data) == size or not data:
        return data
    pieces = [data]
    got = len(data)
    while got < size and (piece := os.pread(fd, size - got, offset + got)):
        pieces.append(piece)
        got += len(piece)
    return b"".join(pieces)

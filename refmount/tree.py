"""Keys to inodes, directories and attributes: the filesystem's logic, without FUSE.

Inode numbers are computed, not stored: the root is 1, a file is ``FILE_BASE`` plus the
file id its reference set gives it, and directories are numbered as they are first met
(there are few of them).  So inodes are stable for the life of the mount and nothing per
file is kept, however many files the kernel has seen.
"""

from __future__ import annotations

import stat
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from refmount.errors import FetchError
from refmount.fetch import redact
from refmount.refs.model import Ref, RefSet

ROOT_INODE = 1
FILE_BASE = 1 << 40
#: The largest size ``stat`` can report (``off_t``); a store may claim more.
MAX_FILE_SIZE = (1 << 63) - 1


@dataclass(frozen=True)
class Owner:
    """Who owns every entry, and which permission bits the mount hides."""

    uid: int
    gid: int
    umask: int = 0


class Entry(NamedTuple):
    """One directory entry as listed: ``size`` when the reference set knows it."""

    name: str
    inode: int
    size: int | None
    cursor: int


@dataclass(frozen=True, slots=True)
class Node:
    """What ``stat`` says of one entry."""

    inode: int
    mode: int
    nlink: int
    size: int


class Tree:
    """The directory tree of one reference set.

    ``remote_size`` answers the size of a whole remote file (``[url]`` references), which
    only the store knows; it is asked on first lookup and remembered by the fetcher, and
    ``known_size`` says it without asking when it has been asked before.
    """

    def __init__(
        self,
        refset: RefSet,
        owner: Owner,
        remote_size: Callable[[str], Awaitable[int]],
        known_size: Callable[[str], int | None] = lambda url: None,
    ) -> None:
        self.refset = refset
        self.owner = owner
        self._remote_size = remote_size
        self._known_size = known_size
        self._dir_paths: dict[int, str] = {ROOT_INODE: ""}
        self._dir_inodes: dict[str, int] = {"": ROOT_INODE}
        self._nlinks: dict[int, int] = {}
        self.file_mode = stat.S_IFREG | (0o444 & ~owner.umask)
        self._dir_mode = stat.S_IFDIR | (0o555 & ~owner.umask)

    # -- names ----------------------------------------------------------------------------

    def is_dir(self, inode: int) -> bool:
        return inode < FILE_BASE

    def dir_path(self, inode: int) -> str | None:
        return self._dir_paths.get(inode)

    def key(self, inode: int) -> str:
        return self.refset.key(inode - FILE_BASE)

    def path(self, inode: int) -> str:
        """The key of a file or the path of a directory, for messages."""
        return self._dir_paths.get(inode, "?") if self.is_dir(inode) else self.key(inode)

    def _dir_inode(self, path: str) -> int:
        inode = self._dir_inodes.get(path)
        if inode is None:
            inode = len(self._dir_paths) + ROOT_INODE
            self._dir_inodes[path] = inode
            self._dir_paths[inode] = path
        return inode

    async def lookup(self, parent: int, name: str) -> int | None:
        """The inode of ``name`` in directory ``parent``, or ``None``."""
        parent_path = self._dir_paths.get(parent)
        if parent_path is None or not name or name in (".", "..") or "/" in name:
            return None
        path = f"{parent_path}/{name}" if parent_path else name
        file_id = await self.refset.find_file(path)
        if file_id is not None:
            return FILE_BASE + file_id
        if self.refset.is_dir(path):
            return self._dir_inode(path)
        return None

    async def listing(self, inode: int, after: int = -1) -> Iterator[Entry]:
        """The entries of a directory, resuming after a child's cursor.

        Sizes the reference set knows come with each entry; ``size`` is ``None`` for
        subdirectories and whole remote files (ask :meth:`node`).
        """
        path = self._dir_paths[inode]
        await self.refset.ensure(path, after)
        return self._entries(path, after)

    def _entries(self, path: str, after: int) -> Iterator[Entry]:
        prefix = f"{path}/" if path else ""
        file_size = self.refset.file_size
        new_entry = tuple.__new__  # Entry(...) without its Python-level __new__: per entry
        for name, file_id, cursor in self.refset.children(path, after):
            if file_id is None:
                yield Entry(name, self._dir_inode(prefix + name), None, cursor)
            else:
                yield new_entry(Entry, (name, FILE_BASE + file_id, file_size(file_id), cursor))

    # -- attributes -----------------------------------------------------------------------

    async def ref(self, inode: int) -> Ref:
        return await self.refset.file_ref(inode - FILE_BASE)

    async def size(self, ref: Ref) -> int:
        if ref.data is not None:
            return len(ref.data)
        if ref.length is not None:
            return ref.length
        assert ref.url is not None
        size = await self._remote_size(ref.url)
        if not 0 <= size <= MAX_FILE_SIZE:
            raise FetchError(f"{redact(ref.url)}: the store reports a size of {size} bytes")
        return size

    def listed_size(self, inode: int) -> int | None:
        """A file's size without asking the store: listings never wait on a remote."""
        ref = self.refset.ref(inode - FILE_BASE)
        if ref.url is None or ref.length is not None:
            return None
        size = self._known_size(ref.url)
        return size if size is not None and 0 <= size <= MAX_FILE_SIZE else None

    async def node(self, inode: int) -> Node:
        if self.is_dir(inode):
            return Node(inode, self._dir_mode, self._dir_nlink(inode), 0)
        ref = await self.ref(inode)
        return Node(inode, self.file_mode, 1, await self.size(ref))

    def _dir_nlink(self, inode: int) -> int:
        nlink = self._nlinks.get(inode)
        if nlink is None:
            nlink = 2 + self.refset.subdirectory_count(self._dir_paths[inode])
            self._nlinks[inode] = nlink
        return nlink

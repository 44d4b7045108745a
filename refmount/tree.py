"""Keys to inodes, directories and attributes: the filesystem's logic, without FUSE.

Inode numbers are computed, not stored: the root is 1, a file is its generation's base
(``FILE_BASE`` for the set first mounted) plus the file id its reference set gives it,
and directories are numbered as they are first met (there are few of them).  So nothing
per file is kept, however many files the kernel has seen.

A reload makes a new tree (:meth:`Tree.successor`) with the next generation's base, so
that no inode of the old set can be mistaken for one of the new.  Files the kernel still
knows (it looked them up) and whose reference did not change keep their inode number: the
new tree pins them, so the kernel's entries and page cache of unchanged files stay
valid.  Directories keep their numbers too.
"""

from __future__ import annotations

import stat
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import trio

from refmount.errors import FetchError
from refmount.redaction import redact
from refmount.refs.model import BLOCK_SIZE, Ref, RefSet

ROOT_INODE = 1
FILE_BASE = 1 << 40
#: Inode numbers per generation: file ids of one set stay below this.
GENERATION_SPAN = 1 << 40


def file_inode(generation: int, file_id: int) -> int:
    """The inode a tree of ``generation`` gives the file ``file_id`` (a catalog names
    a set's file by it before the set is loaded)."""
    return FILE_BASE + generation * GENERATION_SPAN + file_id


#: The largest size ``stat`` can report (``off_t``); a store may claim more.
MAX_FILE_SIZE = (1 << 63) - 1


@dataclass(frozen=True)
class Owner:
    """Who owns every entry, and which permission bits the mount hides."""

    uid: int
    gid: int
    umask: int = 0


class Entry(NamedTuple):
    """One directory entry as listed: ``size`` when the reference set knows it, and the
    block size its set asks ``stat`` to report (:meth:`RefSet.block_size`)."""

    name: str
    inode: int
    size: int | None
    cursor: int
    block_size: int = BLOCK_SIZE


@dataclass(frozen=True, slots=True)
class Node:
    """What ``stat`` says of one entry."""

    inode: int
    mode: int
    nlink: int
    size: int
    block_size: int = BLOCK_SIZE


@dataclass
class Changes:
    """What a reload changed among what the kernel knows: entries it must forget, as
    (parent directory inode, name), and directory inodes whose attributes changed."""

    entries: list[tuple[int, str]]
    directories: list[int]
    pinned: int  # known files that kept their inode


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
        *,
        generation: int = 0,
        pinned: dict[int, int] | None = None,
        dir_paths: dict[int, str] | None = None,
    ) -> None:
        self.refset = refset
        self.owner = owner
        self.generation = generation
        self._remote_size = remote_size
        self._known_size = known_size
        self._base = file_inode(generation, 0)
        self._pinned_ids = pinned or {}  # inode -> file id, for inodes of older generations
        self._pinned_inodes = {file_id: inode for inode, file_id in self._pinned_ids.items()}
        self._dir_paths: dict[int, str] = dir_paths or {ROOT_INODE: ""}
        self._dir_inodes: dict[str, int] = {path: i for i, path in self._dir_paths.items()}
        self._next_dir = max(self._dir_paths) + 1
        self._nlinks: dict[int, int] = {}
        self.file_mode = stat.S_IFREG | (0o444 & ~owner.umask)
        self._dir_mode = stat.S_IFDIR | (0o555 & ~owner.umask)

    # -- names ----------------------------------------------------------------------------

    def is_dir(self, inode: int) -> bool:
        return inode < FILE_BASE

    def dir_path(self, inode: int) -> str | None:
        return self._dir_paths.get(inode)

    def directories(self) -> dict[int, str]:
        """The directories numbered so far (inode -> path), to number them alike again."""
        return dict(self._dir_paths)

    def inode(self, file_id: int) -> int:
        if self._pinned_inodes:
            pinned = self._pinned_inodes.get(file_id)
            if pinned is not None:
                return pinned
        return self._base + file_id

    def file_id(self, inode: int) -> int | None:
        """The file id of a file inode, or ``None`` for one a reload removed."""
        file_id = self._pinned_ids.get(inode)
        if file_id is None and 0 <= inode - self._base < GENERATION_SPAN:
            file_id = inode - self._base
            if file_id in self._pinned_inodes:  # that file answers to its older number
                return None
        return file_id

    def _file_id(self, inode: int) -> int:
        file_id = self.file_id(inode)
        if file_id is None:
            raise StaleInode(inode)
        return file_id

    def key(self, inode: int) -> str:
        return self.refset.key(self._file_id(inode))

    def owning_set(self, inode: int) -> tuple[RefSet, str]:
        """The reference set a file inode is of, and its key there."""
        return self.refset, self.key(inode)

    def path(self, inode: int) -> str:
        """The key of a file or the path of a directory, for messages."""
        return self._dir_paths.get(inode, "?") if self.is_dir(inode) else self.key(inode)

    def _dir_inode(self, path: str) -> int:
        inode = self._dir_inodes.get(path)
        if inode is None:
            inode = self._next_dir
            self._next_dir += 1
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
            return self.inode(file_id)
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
        file_size, block_size = self.refset.file_size, self.refset.block_size
        base, pinned = self._base, self._pinned_inodes
        new_entry = tuple.__new__  # Entry(...) without its Python-level __new__: per entry
        for name, file_id, cursor in self.refset.children(path, after):
            if file_id is None:
                yield Entry(name, self._dir_inode(prefix + name), None, cursor)
            else:
                inode = pinned.get(file_id, base + file_id) if pinned else base + file_id
                entry = (name, inode, file_size(file_id), cursor, block_size(file_id))
                yield new_entry(Entry, entry)

    # -- attributes -----------------------------------------------------------------------

    async def ref(self, inode: int) -> Ref:
        return await self.refset.file_ref(self._file_id(inode))

    async def size(self, ref: Ref) -> int:
        return await ref_size(ref, self._remote_size)

    def mtime(self, inode: int) -> float:
        """The modification time an entry shows: the set's."""
        return self.refset.mtime

    def listed_size(self, inode: int) -> int | None:
        """A file's size without asking the store: listings never wait on a remote."""
        ref = self.refset.ref(self._file_id(inode))
        if ref.url is None or ref.length is not None:
            return None
        size = self._known_size(ref.url)
        return size if size is not None and 0 <= size <= MAX_FILE_SIZE else None

    async def node(self, inode: int) -> Node:
        if self.is_dir(inode):
            return Node(inode, self._dir_mode, self._dir_nlink(inode), 0)
        file_id = self._file_id(inode)
        try:
            ref = await self.ref(inode)
            size = await self.size(ref)
        except FetchError:
            # A key of the set whose bytes cannot be served: it exists (ENOENT would read
            # as fill values), and its read answers EIO.  Its size as the set knows it.
            size = self.refset.file_size(file_id)
            if size is None:
                raise
        return Node(inode, self.file_mode, 1, size, self.refset.block_size(file_id))

    def _dir_nlink(self, inode: int) -> int:
        nlink = self._nlinks.get(inode)
        if nlink is None:
            nlink = 2 + self.refset.subdirectory_count(self._dir_paths[inode])
            self._nlinks[inode] = nlink
        return nlink

    # -- reloading ------------------------------------------------------------------------

    async def prepare_successor(self, refset: RefSet, known: Iterable[int]) -> None:
        """Load what :meth:`successor` will ask of ``refset`` for these inodes (a lazily
        loaded set), without blocking the loop; inodes known later are checked anyway."""
        for n, inode in enumerate(known):
            file_id = self.file_id(inode)
            if file_id is not None:
                await refset.ensure(self.refset.key(file_id))
            if n % 256 == 255:
                await trio.lowlevel.checkpoint()

    def successor(self, refset: RefSet, known: Iterable[int]) -> tuple[Tree, Changes]:
        """The tree of ``refset`` after this one, and what changed of what the kernel
        knows: ``known`` are the file inodes it holds.  Synchronous, so that nothing is
        looked up in between: run it on the serving loop, then swap."""
        pinned: dict[int, int] = {}
        entries: list[tuple[int, str]] = []
        for inode in known:
            file_id = self.file_id(inode)
            if file_id is None:
                continue  # removed or replaced by an earlier reload: already invalidated
            key = self.refset.key(file_id)
            try:
                new_id = refset.file_id(key)
                same = new_id is not None and refset.ref(new_id) == self.refset.ref(file_id)
            except Exception:  # a lazily loaded part not loaded: count it as changed
                new_id, same = None, False
            if same and new_id is not None:
                pinned[inode] = new_id
            else:
                parent, _, name = key.rpartition("/")
                parent_inode = self._dir_inodes.get(parent)
                if parent_inode is not None:
                    entries.append((parent_inode, name))
        dir_paths = {}
        for inode, path in self._dir_paths.items():
            if path == "" or refset.is_dir(path):
                dir_paths[inode] = path
            else:
                parent, _, name = path.rpartition("/")
                entries.append((self._dir_inodes[parent], name))
        successor = Tree(
            refset,
            self.owner,
            self._remote_size,
            self._known_size,
            generation=self.generation + 1,
            pinned=pinned,
            dir_paths=dir_paths,
        )
        return successor, Changes(entries, sorted(dir_paths), len(pinned))


async def ref_size(ref: Ref, remote_size: Callable[[str], Awaitable[int]]) -> int:
    """The size of a reference's bytes; a whole remote file's is asked of the store."""
    if ref.data is not None:
        return len(ref.data)
    if ref.length is not None:
        return ref.length
    assert ref.url is not None
    size = await remote_size(ref.url)
    if not 0 <= size <= MAX_FILE_SIZE:
        raise FetchError(f"{redact(ref.url)}: the store reports a size of {size} bytes")
    return size


class StaleInode(Exception):
    """An inode of a file that a reload removed (or gave a new inode)."""

    def __init__(self, inode: int) -> None:
        super().__init__(f"inode {inode} is no longer in the reference set")
        self.inode = inode

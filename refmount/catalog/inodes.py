"""Inode numbers of a catalog: disjoint ranges, one per set and generation, never reused.

An inode is ``range << RANGE_BITS | offset``.  Range 0 holds the catalog's own
directories (the root is 1, then each catalog directory and each set's root, numbered
by path as first met).  Each set is given one range for the directories inside it and
one per generation of its files (a generation is what :class:`refmount.tree.Tree` calls
it: a reload whose set changed), allocated when first needed and never handed out again
during the mount.  So no two sets share an inode, and a set unloaded then loaded again
from an unchanged refs file gets back exactly the inode numbers it had: the kernel's
entries stay right whatever it still holds.
"""

from __future__ import annotations

from refmount.tree import FILE_BASE, GENERATION_SPAN, ROOT_INODE, file_inode

RANGE_BITS = 40
OFFSET_MASK = (1 << RANGE_BITS) - 1
#: Inodes stay below 2**63 (some tools read st_ino as a signed number).
MAX_RANGES = 1 << (63 - RANGE_BITS)


class InodeSpaceFull(Exception):
    """Every range of the mount has been handed out (millions of loads)."""


class Ranges:
    """Hands out ranges, each to an owner (anything), and tells the owner of an inode."""

    def __init__(self, limit: int = MAX_RANGES) -> None:
        self._owners: list[object] = [None]  # range 0: the catalog's own directories
        self._limit = limit

    def allocate(self, owner: object) -> int:
        if len(self._owners) >= self._limit:
            raise InodeSpaceFull(f"all {self._limit} inode ranges of the mount are used")
        self._owners.append(owner)
        return len(self._owners) - 1

    def owner(self, inode: int) -> object | None:
        index = inode >> RANGE_BITS
        return self._owners[index] if 0 < index < len(self._owners) else None


class CatalogDirs:
    """Inodes of the catalog's own directories and set roots, by path (range 0)."""

    def __init__(self) -> None:
        self._paths: dict[int, str] = {ROOT_INODE: ""}
        self._inodes: dict[str, int] = {"": ROOT_INODE}

    def inode(self, path: str) -> int:
        inode = self._inodes.get(path)
        if inode is None:
            inode = len(self._paths) + 1
            if inode > OFFSET_MASK:
                raise InodeSpaceFull("too many catalog directories")
            self._inodes[path] = inode
            self._paths[inode] = path
        return inode

    def path(self, inode: int) -> str | None:
        return self._paths.get(inode)


class SetInodes:
    """Translates between one set's tree inodes (local) and the mount's (global).

    ``root`` is the set's directory in the catalog (range 0): the tree's root."""

    def __init__(self, ranges: Ranges, owner: object, root: int) -> None:
        self._ranges = ranges
        self._owner = owner
        self.root = root
        self._dir_range = ranges.allocate((owner, None))
        self._file_ranges: dict[int, int] = {}  # generation -> range
        self._generations: dict[int, int] = {}  # range -> generation

    def _file_range(self, generation: int) -> int:
        found = self._file_ranges.get(generation)
        if found is None:
            found = self._ranges.allocate((self._owner, generation))
            self._file_ranges[generation] = found
            self._generations[found] = generation
        return found

    def to_global(self, local: int) -> int:
        if local == ROOT_INODE:
            return self.root
        if local < FILE_BASE:
            return self._dir_range << RANGE_BITS | local
        generation, file_id = divmod(local - FILE_BASE, GENERATION_SPAN)
        return self._file_range(generation) << RANGE_BITS | file_id

    def to_local(self, inode: int) -> int | None:
        """The tree's inode for a global one of this set, ``None`` when not of it."""
        if inode == self.root:
            return ROOT_INODE
        index, offset = inode >> RANGE_BITS, inode & OFFSET_MASK
        if index == self._dir_range:
            return offset
        generation = self._generations.get(index)
        if generation is None:
            return None
        return file_inode(generation, offset)

    def is_dir(self, inode: int) -> bool:
        return inode == self.root or inode >> RANGE_BITS == self._dir_range

"""The catalog as the filesystem operations see it: the interface of a
:class:`refmount.tree.Tree`, each request handed to the set that owns its inode.

Catalog directories (the root, the source's directories, and each set's root before it
is loaded) are answered from the listing alone: listing or stat'ing them loads nothing.
Anything inside a set loads it first (:meth:`Catalog.tree`), and is answered by its tree
with inodes translated to the mount's (:mod:`refmount.catalog.inodes`).

A set's file listed beside it (:class:`refmount.catalog.names.SetFile`) is that file of
its tree under the tree's inode: a listing gives the inode it will have (the set's
generation and the file's id), and no size until the set is loaded, so the kernel keeps
nothing of it; a lookup or ``stat`` loads the set, and a set that cannot be loaded makes
it fail (EIO, the log naming the set), never ENOENT.
"""

from __future__ import annotations

import contextlib
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from refmount.catalog.catalog import Catalog
from refmount.catalog.inodes import RANGE_BITS
from refmount.catalog.sets import CatalogSet
from refmount.errors import FetchError
from refmount.refs.model import Ref, RefSet
from refmount.tree import (
    ROOT_INODE,
    Entry,
    Node,
    Owner,
    StaleInode,
    Tree,
    file_inode,
    ref_size,
)


class CatalogTree:
    """Tree-shaped view of a :class:`Catalog` for :class:`refmount.fuse_ops.Operations`."""

    def __init__(
        self, catalog: Catalog, owner: Owner, remote_size: Callable[[str], Awaitable[int]]
    ) -> None:
        self.catalog = catalog
        self.owner = owner
        self._remote_size = remote_size
        self.file_mode = stat.S_IFREG | (0o444 & ~owner.umask)
        self._dir_mode = stat.S_IFDIR | (0o555 & ~owner.umask)

    # -- which set -----------------------------------------------------------------------

    def _owner(self, inode: int) -> tuple[CatalogSet | None, int | None]:
        """The set an inode belongs to and its inode there; ``(None, None)`` for a
        catalog directory (or an inode of nothing)."""
        catalog = self.catalog
        if inode >> RANGE_BITS == 0:
            path = catalog.dirs.path(inode)
            item = catalog.sets.get(path) if path is not None else None
            return (item, ROOT_INODE) if item is not None else (None, None)
        owner = catalog.ranges.owner(inode)
        if owner is None:
            return None, None
        item = owner[0]  # type: ignore[index]
        return item, item.inodes.to_local(inode)

    def _set(self, inode: int) -> tuple[CatalogSet, int]:
        """The set of an inode and its inode there (a removed set's too: its trees
        answer a while for files opened before)."""
        item, local = self._owner(inode)
        if item is None or local is None:
            raise StaleInode(inode)
        return item, local

    @contextlib.asynccontextmanager
    async def _using(self, inode: int) -> AsyncIterator[tuple[CatalogSet, int, Tree]]:
        """The set of ``inode``, loaded, and kept from being unloaded meanwhile."""
        item, local = self._set(inode)
        if item.removed:
            raise StaleInode(inode)
        item.busy += 1
        try:
            yield item, local, await self.catalog.tree(item)
        finally:
            item.busy -= 1

    def _catalog_dir(self, inode: int) -> str | None:
        """The path of a catalog directory (not a set's), or None."""
        if inode >> RANGE_BITS:
            return None
        path = self.catalog.dirs.path(inode)
        return path if path is not None and path in self.catalog.plan.dirs else None

    # -- names ---------------------------------------------------------------------------

    def is_dir(self, inode: int) -> bool:
        if inode >> RANGE_BITS == 0:
            return True
        item, _ = self._owner(inode)
        return item is not None and item.inodes.is_dir(inode)

    def dir_path(self, inode: int) -> str | None:
        path = self._catalog_dir(inode)
        if path is not None:
            return path
        item, local = self._owner(inode)
        if item is None or local is None or item.removed:
            return None
        if local == ROOT_INODE:
            return item.path
        tree = item.current()
        inner = tree.dir_path(local) if tree is not None else (item.directories or {}).get(local)
        return None if inner is None else f"{item.path}/{inner}"

    def key(self, inode: int) -> str:
        item, local = self._set(inode)
        return self._answering(item, local).key(local)

    def owning_set(self, inode: int) -> tuple[RefSet, str]:
        """The reference set of the catalog a file inode is of, and its key there."""
        item, local = self._set(inode)
        tree = self._answering(item, local)
        return tree.refset, tree.key(local)

    def path(self, inode: int) -> str:
        path = self._catalog_dir(inode)
        if path is not None:
            return path
        item, local = self._owner(inode)
        if item is None or local is None:
            return f"inode {inode}"
        tree = item.current()
        inner = tree.path(local) if tree is not None and local != ROOT_INODE else ""
        return f"{item.path}/{inner}" if inner else item.path

    def _answering(self, item: CatalogSet, local: int) -> Tree:
        """The tree that knows ``local``: the set's, or one a reload replaced."""
        for tree in (item.tree, *reversed(item.retired)):
            if tree is not None and (tree.is_dir(local) or tree.file_id(local) is not None):
                return tree
        raise StaleInode(local)

    async def lookup(self, parent: int, name: str) -> int | None:
        path = self._catalog_dir(parent)
        if path is not None:
            await self.catalog.fresh()
            plan = self.catalog.plan
            child = f"{path}/{name}" if path else name
            if "/" in name or not (child in plan.sets or child in plan.dirs or child in plan.files):
                return None
            owner = plan.files.get(child)
            if owner is not None:
                return await self._beside(self.catalog.sets[owner], name)
            return self.catalog.dirs.inode(child)
        async with self._using(parent) as (item, local, tree):
            found = await tree.lookup(local, name)
            return None if found is None else item.inodes.to_global(found)

    async def _beside(self, item: CatalogSet, name: str) -> int:
        """The inode of a set's file listed beside it (loading the set)."""
        async with self._using(item.inodes.root) as (item, _local, tree):
            found = await tree.lookup(ROOT_INODE, name)
            if found is None:  # the view made no such file: still a name the catalog lists
                raise FetchError(f"set {item.path} has no file {name}")
            return item.inodes.to_global(found)

    def _listed_beside(self, item: CatalogSet, name: str) -> tuple[int, int | None]:
        """The inode and size of a set's file beside it, as a listing gives them: the
        loaded tree's, else the inode its next load gives it and no size."""
        tree = item.tree
        file_id = tree.refset.file_id(name) if tree is not None else None
        if tree is not None and file_id is not None:
            local, size = tree.inode(file_id), tree.refset.file_size(file_id)
        else:
            assert self.catalog.beside is not None
            generation = item.generation + item.changed
            local = file_inode(generation, self.catalog.beside.file_id)
            size = None
        return item.inodes.to_global(local), size

    async def listing(self, inode: int, after: int = -1) -> Iterator[Entry]:
        path = self._catalog_dir(inode)
        if path is not None:
            await self.catalog.fresh()
            return self._catalog_entries(path, after)
        async with self._using(inode) as (item, local, tree):
            entries = await tree.listing(local, after)
            return _translated(entries, item)

    def _catalog_entries(self, path: str, after: int) -> Iterator[Entry]:
        prefix = f"{path}/" if path else ""
        plan = self.catalog.plan
        children = plan.dirs.get(path, [])
        for cursor in range(after + 1, len(children)):
            name = children[cursor]
            owner = plan.files.get(prefix + name)
            if owner is None:
                yield Entry(name, self.catalog.dirs.inode(prefix + name), None, cursor)
            else:
                yield Entry(name, *self._listed_beside(self.catalog.sets[owner], name), cursor)

    # -- attributes ----------------------------------------------------------------------

    def mtime(self, inode: int) -> float:
        item, _ = self._owner(inode)
        if item is None:
            return self.catalog.mtime
        if item.entry.found.mtime is not None:
            return item.entry.found.mtime
        tree = item.current()
        return tree.refset.mtime if tree is not None else self.catalog.mtime

    async def ref(self, inode: int) -> Ref:
        item, local = self._set(inode)
        if item.removed:  # a file opened before reads on a while, as after a reload
            return await self._answering(item, local).ref(local)
        async with self._using(inode) as (item, local, _tree):
            return await self._answering(item, local).ref(local)

    async def size(self, ref: Ref) -> int:
        return await ref_size(ref, self._remote_size)

    def listed_size(self, inode: int) -> int | None:
        item, local = self._set(inode)
        try:
            return self._answering(item, local).listed_size(local)
        except (StaleInode, FetchError):  # a set's file beside it, the set not (all) loaded
            return None

    async def node(self, inode: int) -> Node:
        path = self._catalog_dir(inode)
        if path is not None:
            return Node(inode, self._dir_mode, 2 + self.catalog.plan.subdirectories(path), 0)
        item, local = self._set(inode)
        if local == ROOT_INODE and item.tree is None:  # a stat of a set loads nothing
            return Node(inode, self._dir_mode, 2, 0)
        async with self._using(inode) as (item, local, _tree):
            node = await self._answering(item, local).node(local)
            return Node(inode, node.mode, node.nlink, node.size, node.block_size)


def _translated(entries: Iterator[Entry], item: CatalogSet) -> Iterator[Entry]:
    to_global = item.inodes.to_global
    for name, inode, size, cursor, block_size in entries:
        yield Entry(name, to_global(inode), size, cursor, block_size)

"""One reference set of a catalog: loaded on first use, once however many ask, unloaded
when idle, reloaded when its refs file changed.

A set keeps, for the whole mount, its inode ranges (:class:`SetInodes`), the generation
of its files and the numbers of its directories, so that loading it again from an
unchanged refs file gives the same inode numbers: a request for an inode the kernel kept
through an unload loads the set again and gets the right answer.  A set whose refs file
changed while unloaded is loaded as the next generation (new file inodes; directories
that still exist keep theirs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from refmount.backoff import Backoff
from refmount.catalog.inodes import SetInodes
from refmount.catalog.names import SetEntry
from refmount.errors import FetchError
from refmount.refs import RefSet
from refmount.tree import Tree

log = logging.getLogger(__name__)

#: (refset, generation, directories kept from an earlier load or None) -> its tree.  A
#: decoded view, or any tree-shaped view of a set, can be made here instead of a Tree.
TreeFactory = Callable[[RefSet, int, dict[int, str] | None], Tree]
#: The URL of a set and its name in the mount -> the set, read with the mount's options
#: and bounds (blocking).  The name names what a view shows of it (``run01.nc``).
Loader = Callable[[str, str], RefSet]

FIRST_BACKOFF = 1.0
MAX_BACKOFF = 300.0


@dataclass(eq=False)
class CatalogSet:
    entry: SetEntry
    inodes: SetInodes = field(init=False)
    tree: Tree | None = None
    #: trees unloaded or replaced a short while ago, for requests that started on them
    retired: list[Tree] = field(default_factory=list)
    generation: int = 0
    directories: dict[int, str] | None = None  # the tree's, kept while unloaded
    changed: bool = False  # the refs file changed while unloaded
    removed: bool = False  # gone from the source
    backoff: Backoff = field(default_factory=lambda: Backoff(FIRST_BACKOFF, MAX_BACKOFF))
    loading: trio.Event | None = None
    busy: int = 0
    asked_signature: tuple[str, ...] | None = None  # when the listing tells none
    loaded_mtime: float | None = None  # of the refs file last loaded

    @property
    def path(self) -> str:
        return self.entry.path

    @property
    def error(self) -> str | None:
        """Why the set could not be loaded last (None: it could, or may have changed)."""
        return self.backoff.error

    @property
    def url(self) -> str:
        return self.entry.found.url

    def current(self) -> Tree | None:
        """The tree that answers now: the loaded one, else the one unloaded last."""
        if self.tree is not None:
            return self.tree
        return self.retired[-1] if self.retired else None

    async def load(self, loader: Loader, make_tree: TreeFactory) -> Tree:
        """The set's tree, loaded if it is not (once, whoever else waits for it).  A
        set that failed to load fails at once until its back-off has passed."""
        while self.tree is None:
            if self.loading is not None:
                await self.loading.wait()
                continue
            self.backoff.check()
            self.loading = trio.Event()
            try:
                refset = await trio.to_thread.run_sync(
                    loader, self.url, self.entry.name, abandon_on_cancel=True
                )
            except Exception as exc:
                self._failed(str(exc))
                raise FetchError(self.error or str(exc)) from None
            finally:
                self.loading.set()
                self.loading = None
            self._loaded(refset, make_tree)
        return self.tree

    def _failed(self, reason: str) -> None:
        backoff = self.backoff.failed(f"set {self.path} cannot be loaded: {reason}")
        # the request that meets it logs it as a warning (fuse_ops, once)
        log.info("catalog: %s (tried again after %g s)", self.error, backoff)

    def _loaded(self, refset: RefSet, make_tree: TreeFactory) -> None:
        # A refs file changed since it was last loaded, whatever the listing said (an
        # index page says nothing): its file ids may name other keys now.
        if self.loaded_mtime is not None and refset.mtime != self.loaded_mtime:
            self.changed = True
        self.loaded_mtime = refset.mtime
        directories = self.directories
        if self.changed:
            self.generation += 1
            if directories is not None:
                directories = {
                    inode: path
                    for inode, path in directories.items()
                    if path == "" or refset.is_dir(path)
                }
            self.changed = False
        self.tree = make_tree(refset, self.generation, directories)
        self.backoff.succeeded()
        log.info("catalog: loaded set %s (%s)", self.path, _describe(refset))

    def unload(self) -> Tree | None:
        """Let go of the tree (kept among the retired a short while); returns it."""
        tree = self.tree
        if tree is None:
            return None
        self.directories = tree.directories()
        self.tree = None
        self.retired.append(tree)
        log.info("catalog: unloaded set %s", self.path)
        return tree

    def replace(self, new: Tree) -> None:
        """Swap in a reloaded tree (the old one kept among the retired)."""
        old, self.tree = self.tree, new
        self.generation = new.generation
        self.loaded_mtime = new.refset.mtime
        if old is not None:
            self.retired.append(old)

    def key_count(self) -> int | None:
        tree = self.tree
        if tree is None or not hasattr(tree.refset, "__len__"):
            return None
        return len(tree.refset)  # type: ignore[arg-type]


def _describe(refset: RefSet) -> str:
    return f"{len(refset):,} keys" if hasattr(refset, "__len__") else "loaded lazily"  # type: ignore[arg-type]

"""The catalog: the sets a source holds, which are loaded, and keeping that up to date.

The listing of the source is cached for ``ttl`` seconds and refreshed by a task of the
daemon's nursery every ``ttl`` seconds (and at once on SIGHUP); a request that finds it
older than that waits for a fresh one.  A refresh that fails keeps the last listing.
What a refresh changed is told to the kernel: entries of removed sets, names that now
exist (it may cache them as missing), directory attributes; a loaded set whose refs file
changed is reloaded as a single mount reloads on SIGHUP (``refmount.service.reload``):
open files keep their bytes, changed keys get new inodes, unchanged ones keep theirs.

At most ``max_loaded`` sets stay loaded, their indexes holding at most
``max_loaded_bytes`` (as far as sets can tell: a Parquet set's records are bounded by
its own cache): past that, the least recently used idle ones are unloaded and the
kernel told to forget their entries.  Invalidations run in a worker thread, never on
the serving loop: ``invalidate_entry`` waits for requests on that directory, which the
loop serves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import pyfuse3
import trio

from refmount.catalog.inodes import CatalogDirs, Ranges, SetInodes
from refmount.catalog.lru import LoadedSets
from refmount.catalog.names import Found, Plan, SetFile, plan
from refmount.catalog.sets import CatalogSet, Loader, TreeFactory
from refmount.catalog.ttl import Expiring
from refmount.tree import FILE_BASE, Tree

log = logging.getLogger(__name__)

#: How long a tree replaced by a reload still answers reads of files opened before it
#: (as ``refmount.service.reload`` keeps a replaced set), and an unloaded one requests
#: begun on it (an unloaded set's inodes load it again: it need not wait long).
RETIRE_SECONDS = 60.0
UNLOADED_SECONDS = 2.0
#: Invalidations waiting for the worker thread; past this the oldest wait for room.
PENDING_INVALIDATIONS = 65_536


class Kernel(Protocol):
    """What the catalog asks of the filesystem operations: the file inodes the kernel
    holds (with lookup counts) and the names it caches as missing."""

    known: dict[int, int]
    negatives: set[tuple[int, str]]


class Catalog:
    def __init__(
        self,
        source: str,
        list_sets: Callable[[], list[Found]],
        load: Loader,
        make_tree: TreeFactory,
        *,
        ttl: float,
        max_loaded: int,
        max_loaded_bytes: int | None = None,
        signature: Callable[[str], tuple[str, ...]] | None = None,
        prepare: Callable[[Iterable[str]], Any] | None = None,
        beside: SetFile | None = None,
    ) -> None:
        """``list_sets()`` lists the source (blocking); ``load(url, name)`` reads one
        set; ``signature(url)`` asks the store about one refs file when the listing says
        nothing of it (HTTP); ``prepare(protocols)`` readies the fetcher for a set;
        ``beside`` is the file of each set listed next to it (:class:`SetFile`)."""
        self.source = source
        self.beside = beside
        self._list_sets = list_sets
        self._load = load
        self._make_tree = make_tree
        self._signature = signature
        self._prepare = prepare
        self.ranges = Ranges()
        self.dirs = CatalogDirs()
        self.sets: dict[str, CatalogSet] = {}
        self.loaded: LoadedSets[CatalogSet] = LoadedSets(max_loaded, max_loaded_bytes)
        self.plan = Plan()
        self.listing: Expiring[Plan] = Expiring(ttl)
        self.mtime = time.time()
        self.loads = 0
        self.kernel: Kernel | None = None
        #: hears how each SIGHUP refresh ended (``refmount status``'s last reload)
        self.record: Callable[..., None] | None = None
        self._reported: set[str] = set()
        self._refreshing: trio.Event | None = None
        self._wanted = trio.Event()
        self._reload_all = False
        send, self._invalidations = trio.open_memory_channel[tuple[str, Any]](PENDING_INVALIDATIONS)
        self._send_invalidation = send
        self._retiring: list[tuple[float, Tree]] = []
        self._serving = False  # before, the kernel knows nothing to invalidate
        self._prepared: set[str] = set()  # protocols the fetcher was readied for

    # -- the listing ----------------------------------------------------------------------

    def start(self) -> None:
        """List the source for the first time (blocking, before serving): a source that
        cannot be listed is a failed start."""
        self._apply(plan(self._list_sets(), self.beside))

    async def fresh(self) -> None:
        """Make sure the listing is no older than the TTL (one refresh at a time)."""
        if not self.listing.fresh:
            await self.refresh()

    async def refresh(self, *, reload_all: bool = False) -> str | None:
        """List the source again and apply what changed; returns why it failed, or None.
        One at a time: a caller that finds one under way waits for it (and, to reload
        every loaded set, then makes its own)."""
        while self._refreshing is not None:
            await self._refreshing.wait()
            if not reload_all:
                return None
        self._refreshing = trio.Event()
        try:
            try:
                found = await trio.to_thread.run_sync(self._list_sets, abandon_on_cancel=True)
            except Exception as exc:
                log.warning(
                    "catalog: cannot list %s, keeping the last listing: %s", self.source, exc
                )
                self.listing.set(self.plan)  # asked again after the TTL, not at every request
                return str(exc)
            await self._reload_changed(self._apply(plan(found, self.beside)), reload_all)
            return None
        finally:
            self._refreshing.set()
            self._refreshing = None

    def request_refresh(self) -> None:
        """SIGHUP: list the source and reload every loaded set whose refs changed (every
        loaded set, when the store tells nothing that shows a change)."""
        self._reload_all = True
        self._wanted.set()

    def _apply(self, new: Plan) -> list[CatalogSet]:
        """Take a new listing; returns the loaded sets whose refs file changed."""
        for problem in new.problems:
            if problem not in self._reported:
                self._reported.add(problem)
                log.warning("catalog: %s", problem)
        changed: list[CatalogSet] = []
        for path, entry in new.sets.items():
            found = self.sets.get(path)
            if found is None:
                found = CatalogSet(entry)
                found.inodes = SetInodes(self.ranges, found, self.dirs.inode(path))
                self.sets[path] = found
            elif found.removed:
                found.removed, found.changed = False, True
                found.backoff.forget()
            else:
                old = found.entry.found
                if old.url != entry.found.url or old.signature != entry.found.signature:
                    if found.tree is not None:
                        changed.append(found)
                    else:
                        found.changed = True
                        found.backoff.forget()
                if old.mtime != entry.found.mtime:
                    self._invalidate("inode", found.inodes.root)
            found.entry = entry
        for path, gone in self.sets.items():
            if path not in new.sets and not gone.removed:
                gone.removed = True
                self._unload(gone)
                self.loaded.discard(gone)
        old, old_dirs = self.plan, self.plan.dirs
        for path in [*new.dirs, *new.sets, *new.files, *old_dirs, *old.sets, *old.files]:
            if path and (path in new.sets or path in new.dirs or path in new.files) != (
                path in old.sets or path in old_dirs or path in old.files
            ):
                parent, _, name = path.rpartition("/")
                self._invalidate("entry", (self.dirs.inode(parent), name))
        for path, children in new.dirs.items():
            if old_dirs.get(path) != children:
                self._invalidate("inode", self.dirs.inode(path))
        if new.dirs != old_dirs:
            self.mtime = time.time()
        self.plan = new
        self.listing.set(new)
        return changed

    async def _reload_changed(self, changed: list[CatalogSet], reload_all: bool) -> None:
        if reload_all or self._signature is not None:
            for item in list(self.loaded):
                if item in changed or item.entry.found.signature:
                    continue
                if reload_all or await self._changed_unlisted(item):
                    changed.append(item)
        for item in changed:
            await self._reload(item)

    async def _changed_unlisted(self, item: CatalogSet) -> bool:
        """Whether a loaded set's refs file changed, asked of the store (the listing
        said nothing: HTTP index pages)."""
        assert self._signature is not None
        try:
            now = await trio.to_thread.run_sync(self._signature, item.url, abandon_on_cancel=True)
        except Exception as exc:
            log.warning("catalog: cannot look at %s for changes: %s", item.path, exc)
            return False
        before, item.asked_signature = item.asked_signature, now
        return before is not None and before != now

    # -- loading and unloading ------------------------------------------------------------

    async def tree(self, item: CatalogSet) -> Tree:
        """The loaded tree of a set (loading it, and unloading others past the limit)."""
        tree = item.tree
        if tree is None:
            tree = await item.load(self._load, self._make_tree)
            if item not in self.loaded:
                self.loads += 1
                self.loaded.touch(item, tree.refset.memory_bytes() or 0)
                new_protocols = tree.refset.protocols() - self._prepared
                if self._prepare is not None and new_protocols:
                    self._prepared |= new_protocols
                    await self._prepare(sorted(new_protocols))
            self._evict(keep=item)
        self.loaded.touch(item)
        return tree

    def _evict(self, keep: CatalogSet) -> None:
        for victim in self.loaded.over_limit(lambda s: s.busy > 0 or s.loading is not None, keep):
            self._unload(victim)

    def _unload(self, item: CatalogSet) -> None:
        """Unload a set and have the kernel forget its entries (the set's directory,
        and its file beside it)."""
        tree = item.unload()
        if tree is not None:
            self._retire(tree, RETIRE_SECONDS if item.removed else UNLOADED_SECONDS)
        parent, _, name = item.path.rpartition("/")
        self._invalidate("entry", (self.dirs.inode(parent), name))
        self._forget_beside(item)

    def _forget_beside(self, item: CatalogSet) -> None:
        """Have the kernel look up a set's file beside it again (its inode may change)."""
        if self.beside is not None:
            parent = self.dirs.inode(item.entry.parent)
            self._invalidate("entry", (parent, self.beside.name(item.entry.name)))

    async def _reload(self, item: CatalogSet) -> None:
        """Read a loaded set's refs again and swap its tree, as a SIGHUP reload does."""
        log.info("catalog: reloading set %s", item.path)
        try:
            refset = await trio.to_thread.run_sync(
                self._load, item.url, item.entry.name, abandon_on_cancel=True
            )
        except Exception as exc:
            log.error("catalog: reload of set %s failed, still serving the previous one: %s",
                      item.path, exc)  # fmt: skip
            return
        old = item.tree
        if old is None:  # unloaded meanwhile: the next load reads it anew
            item.changed = True
            refset.close()
            return
        known = self._known_files(item)
        await old.prepare_successor(refset, known)
        if item.tree is not old:
            item.changed = True
            refset.close()
            return
        # From here to the swap nothing awaits: no request sees a half-made tree.
        new, changes = old.successor(refset, known)
        item.replace(new)
        if item in self.loaded:
            self.loaded.touch(item, refset.memory_bytes() or 0)
        self._retire(old, RETIRE_SECONDS)
        to_global = item.inodes.to_global
        for parent, name in changes.entries:
            self._invalidate("entry", (to_global(parent), name))
        for directory in changes.directories:
            self._invalidate("inode", to_global(directory))
        self._forget_beside(item)
        if self.kernel is not None:
            for parent, name in list(self.kernel.negatives):
                if item.inodes.is_dir(parent):
                    self.kernel.negatives.discard((parent, name))
                    self._invalidate("entry", (parent, name))
        log.info("catalog: reloaded set %s: %d entries invalidated, %d known files unchanged",
                 item.path, len(changes.entries), changes.pinned)  # fmt: skip

    def _known_files(self, item: CatalogSet) -> list[int]:
        """The tree inodes of the set's files the kernel holds."""
        if self.kernel is None:
            return []
        local = (item.inodes.to_local(inode) for inode in list(self.kernel.known))
        return [inode for inode in local if inode is not None and inode >= FILE_BASE]

    def _retire(self, tree: Tree, seconds: float) -> None:
        """Close ``tree``'s set after ``seconds`` (its set keeps it among the retired)."""
        self._retiring.append((time.monotonic() + seconds, tree))

    def _close_retired(self, now: float) -> None:
        keep = []
        for until, tree in self._retiring:
            if until > now:
                keep.append((until, tree))
                continue
            for item in self.sets.values():
                if tree in item.retired:
                    item.retired.remove(tree)
            tree.refset.close()
        self._retiring = keep

    # -- serving ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Refresh every TTL (or on request), invalidate, close retired trees."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._invalidating)
            nursery.start_soon(self._closing)
            self._serving = True
            task_status.started()
            while True:
                with trio.move_on_after(self.listing.ttl):
                    await self._wanted.wait()
                self._wanted = trio.Event()
                reload_all, self._reload_all = self._reload_all, False
                if reload_all:
                    log.info("catalog: refreshing %s", self.source)
                error = await self.refresh(reload_all=reload_all)
                if reload_all and self.record is not None:
                    message = error or f"{len(self.plan.sets):,} sets listed"
                    self.record(ok=error is None, message=message)

    async def _closing(self) -> None:
        while True:
            await trio.sleep(1.0)
            self._close_retired(time.monotonic())

    def _invalidate(self, kind: str, what: Any) -> None:
        if not self._serving:
            return
        try:
            self._send_invalidation.send_nowait((kind, what))
        except trio.WouldBlock:
            log.warning("catalog: too many invalidations pending; dropped %s %r", kind, what)

    async def _invalidating(self) -> None:
        async for kind, what in self._invalidations:
            batch = [(kind, what)]
            while len(batch) < 1024:
                try:
                    batch.append(self._invalidations.receive_nowait())
                except trio.WouldBlock:
                    break
            await trio.to_thread.run_sync(_invalidate, batch)

    def close(self) -> None:
        for item in self.sets.values():
            for tree in [*item.retired, *([item.tree] if item.tree else [])]:
                tree.refset.close()

    # -- what status and the cache ask ----------------------------------------------------

    def url_extent(self, url: str) -> int | None:
        """The furthest byte any loaded set references in ``url`` (read-ahead's limit)."""
        extents = [e for s in self.loaded if (e := _extent(s, url)) is not None]
        return max(extents) if extents else None

    def status(self) -> dict[str, Any]:
        errors = {s.path: s.error for s in self.sets.values() if s.error and not s.removed}
        return {
            "source": self.source,
            "sets": len(self.plan.sets),
            "loaded": {s.path: s.key_count() for s in self.loaded},
            "max_loaded": self.loaded.limit,
            "loaded_bytes": self.loaded.nbytes,
            "loads": self.loads,
            "errors": errors,
            "problems": len(self.plan.problems),
        }

    def key_count(self) -> int | None:
        counts = [s.key_count() for s in self.loaded]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)


def _extent(item: CatalogSet, url: str) -> int | None:
    tree = item.tree
    return tree.refset.url_extent(url) if tree is not None else None


def _invalidate(batch: list[tuple[str, Any]]) -> None:
    """Tell the kernel to forget entries and attributes (a worker thread)."""
    for kind, what in batch:
        try:
            if kind == "entry":
                parent, name = what
                pyfuse3.invalidate_entry(parent, name.encode("utf-8", "surrogateescape"))
            else:
                pyfuse3.invalidate_inode(what, attr_only=True)
        except OSError as exc:  # ENOENT: the kernel did not cache it
            log.debug("invalidation of %s %r: %s", kind, what, exc)

"""Reloading REFS while mounted: SIGHUP, ``systemctl reload``, or ``--reload-interval``.

The new set is read in a worker thread while the old one keeps serving.  A new set that
cannot be read (malformed, unreachable, over a bound) changes nothing: the old tree keeps
serving and the log and ``STATUS=`` say why.  Otherwise the new tree replaces the old one
in one assignment on the serving loop, and then the kernel is told to forget what it
caches that changed: the entries of changed and removed keys (they get new inodes, so a
file opened before keeps reading the bytes it opened, from its own page cache and its own
reference), names it caches as missing, and the attributes of directories.  Unchanged
files keep their inode and their entry.

The invalidations run in a worker thread: ``invalidate_entry`` blocks until requests on
that directory finish, and those are served by this loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import fsspec.core
import pyfuse3
import trio

from refmount import icechunk
from refmount.cache import BlockCache
from refmount.fuse_ops import Operations
from refmount.options import Config
from refmount.redaction import Scrubber, shown
from refmount.refs import RefSet
from refmount.service.notify import notify
from refmount.tree import Tree

log = logging.getLogger(__name__)

#: How long a replaced set stays open for requests that started on it.
RETIRE_SECONDS = 60.0
SIGNATURE_FIELDS = ("ETag", "etag", "mtime", "LastModified", "last_modified", "size", "created")


def monotonic_usec() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def refs_signature(config: Config) -> tuple[str, ...]:
    """What the store cheaply says about REFS (ETag, modification time, size): a change
    means the set changed.  A Parquet directory is looked at through its .zmetadata, an
    Icechunk repository through the head of the branch it follows."""
    if config.icechunk:
        return icechunk.signature(
            config.refs, config.refs_options,
            branch=config.branch, tag=config.tag, snapshot=config.snapshot,
        )  # fmt: skip
    fs, path = fsspec.core.url_to_fs(config.refs, **config.refs_options)
    info = fs.info(path)
    if info.get("type") == "directory":
        info = fs.info(f"{path.rstrip('/')}/.zmetadata")
    return tuple(str(info.get(name)) for name in SIGNATURE_FIELDS)


class Reloader:
    """Reloads on request, one reload at a time; requests during a reload make one more."""

    def __init__(
        self,
        config: Config,
        operations: Operations,
        cache: BlockCache,
        load: Callable[[Config], RefSet],
        record: Callable[..., None] = lambda *, ok, message: None,
        checked: Callable[[], None] = lambda: None,
    ) -> None:
        """``record(ok=..., message=...)`` hears how each reload ended, ``checked`` of
        each answered look at the source (``refmount status`` shows the last ones)."""
        self.config = config
        self._record = record
        self._checked = checked
        self.operations = operations
        self.cache = cache
        self._load = load
        self._scrub = Scrubber(config.refs)
        self._wanted = trio.Event()

    def request(self) -> None:
        self._wanted.set()

    async def run(self) -> None:
        async with trio.open_nursery() as retiring:
            while True:
                await self._wanted.wait()
                self._wanted = trio.Event()
                old = await self.reload()
                if old is not None:
                    retiring.start_soon(self._retire, old)

    async def poll(self, interval: float, loaded: tuple[str, ...] | None = None) -> None:
        """Ask the store about REFS every ``interval`` seconds; reload when it changed.
        ``loaded`` is what the store said just before the set being served was read: a
        change made before the first look is a change too."""
        last = loaded
        while True:
            try:
                with trio.fail_after(self.config.timeout):
                    signature = await trio.to_thread.run_sync(
                        refs_signature, self.config, abandon_on_cancel=True
                    )
            except Exception as exc:
                log.warning("cannot look at %s for changes: %s", shown(self.config.refs), exc)
            else:
                self._checked()
                if last is not None and signature != last:
                    log.info("%s changed: reloading", shown(self.config.refs))
                    self.request()
                last = signature
            await trio.sleep(interval)

    async def reload(self) -> Tree | None:
        """Load REFS anew and swap it in; returns the replaced tree, or ``None``."""
        refs = shown(self.config.refs)
        notify(f"RELOADING=1\nMONOTONIC_USEC={monotonic_usec()}\nSTATUS=reloading {refs}")
        log.info("reloading %s", refs)
        try:
            # Abandoned if the daemon stops meanwhile: a slow load must not hold up SIGTERM.
            refset = await trio.to_thread.run_sync(self._load, self.config, abandon_on_cancel=True)
        except Exception as exc:
            reason = self._scrub(str(exc))
            log.error("reload of %s failed, still serving the previous set: %s", refs, reason)
            notify(f"READY=1\nSTATUS=serving the previous set: reload failed: {reason}"[:4000])
            self._record(ok=False, message=reason)
            return None
        operations = self.operations
        old = operations.tree
        await old.prepare_successor(refset, list(operations.known))
        # From here to the swap nothing awaits: no request sees a half-made tree.
        new, changes = old.successor(refset, list(operations.known))
        operations.tree = new
        # Readable at once by reads of files opened before (no OPEN with the patched
        # pyfuse3): a READ arriving while the kernel is told would otherwise be ESTALE.
        operations.retired.append(old)
        self.cache.extent = refset.url_extent
        negatives, operations.negatives = operations.negatives, set()
        entries = [*changes.entries, *negatives]
        await trio.to_thread.run_sync(_invalidate, entries, changes.directories)
        log.info(
            "reloaded %s: %d entries invalidated, %d known files unchanged",
            refs, len(entries), changes.pinned,
        )  # fmt: skip
        notify(f"READY=1\nSTATUS=serving {refs} (reloaded {time.strftime('%H:%M:%S')})")
        self._record(ok=True, message=f"{len(entries)} entries invalidated")
        await self.cache.fetcher.prepare(sorted(refset.protocols()))
        return old

    async def _retire(self, tree: Tree) -> None:
        """Keep a replaced tree (retired at the swap) readable for a while (reads of
        files opened before the reload, when pyfuse3 sends no OPEN), then let go of it."""
        retired = self.operations.retired
        try:
            await trio.sleep(RETIRE_SECONDS)
        finally:
            retired.remove(tree)
            tree.refset.close()


def _invalidate(entries: list[tuple[int, str]], directories: list[int]) -> None:
    """Tell the kernel to forget entries and directory attributes (a worker thread)."""
    for parent, name in entries:
        _quietly(pyfuse3.invalidate_entry, parent, name.encode("utf-8", "surrogateescape"))
    for inode in directories:
        _quietly(pyfuse3.invalidate_inode, inode, attr_only=True)


def _quietly(call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """ENOENT: the kernel did not cache it, nothing to forget."""
    try:
        call(*args, **kwargs)
    except OSError as exc:
        log.debug("invalidation %s%r: %s", call.__name__, args, exc)

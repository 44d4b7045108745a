"""The disk cache of one process: entries looked up, admitted, evicted and counted.

One :class:`DiskCache` per daemon (``serve`` makes it), shared by every reference set the
process serves; each set's fetcher gets a :class:`~refmount.cache.disk.tier.DiskTier` in
front of it that uses it.

Off the serving thread
    Every file operation runs in a worker thread: lookups and writes under one limiter
    of :data:`IO_THREADS`, the index (one SQLite connection) under a limiter of one.  A
    lookup of all the entries a fetch wants is one thread call.

Admission never holds a reader up
    The tier hands fetched bytes to :meth:`DiskCache.admit` and returns them to the
    reader at once; one writer task adds them to their units' entries behind it (read,
    merge, write a temporary file, rename: one at a time, so that two pieces of one
    unit fetched together both stay).  At most
    :data:`QUEUE_BYTES` wait to be written; beyond that, admission skips (counted).
    When the disk says no (ENOSPC, EDQUOT, EROFS, EACCES) or the index finds no room,
    admission pauses for :data:`PAUSE_SECONDS`, logged once per episode, then tries
    again: readers never see it.

Start-up is O(1)
    Opening the directory takes one lock file and opens the index.  Temporary files of
    dead processes are removed, and the index reconciled with the files when a process
    died or the index is new, by a background task; lookups do not need the index.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from dataclasses import dataclass

import trio

from refmount.cache.disk.entry import CorruptEntry, Entry, EntryKey
from refmount.cache.disk.index import Index, Limits, NoRoom
from refmount.cache.disk.store import FULL_ERRNOS, DiskCacheError, Store

log = logging.getLogger(__name__)

IO_THREADS = 4  # worker threads reading and writing entries at once
QUEUE_BYTES = 64 << 20  # bytes waiting to be written, at most
DRAIN_SECONDS = 10.0  # at a stop, the most spent writing what is queued
PAUSE_SECONDS = 30.0  # admission rests this long after the disk or the limits said no
FLUSH_SECONDS = 5.0  # how often uses are written to the index
FLUSH_COUNT = 4096  # or as soon as this many are waiting
HYSTERESIS = 0.05  # of the limit: evicted beyond what an admission needs
COUNTERS = (
    "disk_hits",
    "disk_misses",
    "disk_hit_bytes",
    "disk_written_entries",
    "disk_written_bytes",
    "disk_evictions",
    "disk_corrupt",
    "disk_refusals",
    "disk_skipped",
    "disk_bypassed",
    "disk_validations",
    "disk_validation_failures",
)


@dataclass(frozen=True)
class DiskCacheConfig:
    """``--disk-cache`` and its companions."""

    directory: str
    max_bytes: int = 10 << 30
    #: Free space to keep on the cache's filesystem: bytes, or a fraction of its size.
    min_free: int | float = 0.10
    #: Keep objects whose store gives no validator (declared never to change).
    immutable: bool = False
    check_interval: float = 60.0


class DiskCache:
    """A cache directory as one process uses it."""

    def __init__(self, config: DiskCacheConfig) -> None:
        self.config = config
        self.store = Store(config.directory)
        try:
            self.index = _open_index(self.store.index_path)
        except DiskCacheError:
            self.store.close()
            raise
        self.counters = dict.fromkeys(COUNTERS, 0)
        self._io = trio.CapacityLimiter(IO_THREADS)
        self._db = trio.CapacityLimiter(1)
        self._queue_send, self._queue_receive = trio.open_memory_channel[
            tuple[EntryKey, int, bytes | memoryview, int | None]
        ](float("inf"))
        self._queued = 0
        self._paused_until = -float("inf")
        self._pause_logged = False
        self._uses: dict[str, float] = {}
        self._forgotten: list[str] = []
        self._flush_now = trio.Event()
        self._usage = 0
        self._running = False

    # -- life -----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write, flush and tidy in the background until cancelled; then flush what is
        left and let go of the directory."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._tidy)
                nursery.start_soon(self._flusher)
                nursery.start_soon(self._writer)
                self._running = True
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._running = False
            with trio.CancelScope(shield=True), trio.move_on_after(DRAIN_SECONDS):
                await self._drain()
                await self._flush()
            self.close()

    def close(self) -> None:
        """Let go of the index and the directory (idempotent)."""
        if self.index is not None:
            self.index.close()
            self.index = None  # type: ignore[assignment]
            self.store.close()

    def stats(self) -> dict[str, int]:
        out = dict(self.counters)
        out["disk_bytes"] = self._usage
        out["disk_limit"] = self.config.max_bytes
        return out

    # -- lookups --------------------------------------------------------------------------

    async def lookup(self, keys: list[EntryKey]) -> list[Entry | None]:
        """The entries of ``keys`` there are, in order (None: none, or a corrupt one,
        now removed)."""
        found, corrupt = await trio.to_thread.run_sync(self._lookup, keys, limiter=self._io)
        self._count_corrupt(corrupt)
        return found

    def used(self, key: EntryKey, size: int) -> None:
        """Count a hit of ``size`` bytes in ``key``'s entry, and remember its use."""
        self.counters["disk_hits"] += 1
        self.counters["disk_hit_bytes"] += size
        self._uses[key.name] = trio.current_time()
        if len(self._uses) >= FLUSH_COUNT:
            self._flush_now.set()

    def _count_corrupt(self, corrupt: list[tuple[str, str]]) -> None:
        for name, reason in corrupt:
            self.counters["disk_corrupt"] += 1
            self._forgotten.append(name)
            log.warning("disk cache: removed a corrupt entry (%s)", reason)

    def _lookup(self, keys: list[EntryKey]) -> tuple[list[Entry | None], list[tuple[str, str]]]:
        """The entries found, and those found corrupt (and removed) with why.  Runs in a
        worker thread."""
        found: list[Entry | None] = []
        corrupt: list[tuple[str, str]] = []
        for key in keys:
            found.append(self._read(key, corrupt))
        return found, corrupt

    def _read(self, key: EntryKey, corrupt: list[tuple[str, str]]) -> Entry | None:
        try:
            return self.store.read(key)
        except CorruptEntry as exc:
            corrupt.append((key.name, str(exc)))
        except OSError as exc:
            log.debug("disk cache: cannot read an entry: %s", exc)
        return None

    # -- admission ------------------------------------------------------------------------

    def admit(self, key: EntryKey, start: int, piece: bytes | memoryview, eof: int | None) -> None:
        """Queue ``piece``, the bytes of ``key``'s unit from ``start`` on, to be added to
        its entry; ``eof``: where the object ends, if the fetch found out.  Never waits."""
        if not self._running or not key.cacheable() or not (piece or eof is not None):
            return
        if trio.current_time() < self._paused_until:
            self.counters["disk_refusals"] += 1
            return
        if self._queued + len(piece) > QUEUE_BYTES:
            self.counters["disk_skipped"] += 1
            return
        self._queued += len(piece)
        self._queue_send.send_nowait((key, start, piece, eof))

    async def _writer(self) -> None:
        """The one writer: one at a time, so that two pieces of one unit merge."""
        async for item in self._queue_receive:
            try:
                if trio.current_time() >= self._paused_until:
                    await self._write(*item)
                else:
                    self.counters["disk_refusals"] += 1
            finally:
                self._queued -= len(item[2])

    async def _drain(self) -> None:
        """Write what is still queued (at a stop)."""
        while True:
            try:
                item = self._queue_receive.receive_nowait()
            except trio.WouldBlock:
                return
            try:
                await self._write(*item)
            finally:
                self._queued -= len(item[2])

    async def _write(
        self, key: EntryKey, start: int, piece: bytes | memoryview, eof: int | None
    ) -> None:
        corrupt: list[tuple[str, str]] = []
        try:
            written = await trio.to_thread.run_sync(
                self._write_temp, key, start, piece, eof, corrupt, limiter=self._io
            )
        except OSError as exc:
            if exc.errno in FULL_ERRNOS:
                self._pause(f"{exc.strerror} in {self.store.root}")
            else:
                log.warning("disk cache: cannot write an entry: %s", exc)
            return
        finally:
            self._count_corrupt(corrupt)
        if written is None:
            return
        temp, size = written
        try:
            victims = await trio.to_thread.run_sync(
                self._admit, key.name, temp, size, limiter=self._db
            )
        except NoRoom as exc:
            self._pause(f"the limits leave no room ({exc})")
            return
        except (OSError, sqlite3.Error) as exc:
            log.warning("disk cache: cannot admit an entry: %s", exc)
            return
        finally:
            self.store.discard(temp)  # gone already when it was placed
        self.counters["disk_written_entries"] += 1
        self.counters["disk_written_bytes"] += len(piece)
        self.counters["disk_evictions"] += len(victims)
        if self._pause_logged:
            log.info("disk cache: admitting again")
            self._pause_logged = False

    def _write_temp(
        self,
        key: EntryKey,
        start: int,
        piece: bytes | memoryview,
        eof: int | None,
        corrupt: list[tuple[str, str]],
    ) -> tuple[str, int] | None:
        """A temporary file with the unit's entry as it is on disk now plus ``piece``;
        None when that adds nothing.  Runs in a worker thread."""
        entry = (self._read(key, corrupt) or Entry()).merged(start, piece, eof)
        if entry is None:
            return None
        return self.store.write_temp(key, entry)

    def _admit(self, name: str, temp: str, size: int) -> list[str]:
        """Runs in a worker thread, holding the index."""
        victims = self.index.admit(
            name,
            size,
            time.time(),
            self._limits(),
            self._free,
            lambda: self.store.place(temp, name),
            self.store.remove,
        )
        self._usage = self.index.total()
        return victims

    def _free(self) -> int:
        return self.store.space().free

    def _limits(self) -> Limits:
        config = self.config
        min_free = config.min_free
        if isinstance(min_free, float):
            min_free = int(self.store.space().total * min_free)
        return Limits(
            max_bytes=config.max_bytes, min_free=min_free, slack=int(config.max_bytes * HYSTERESIS)
        )

    def _trim(self) -> int:
        """Evict down to the limits without an admission.  Runs in a worker thread,
        holding the index."""
        evicted = self.index.trim(self._limits(), self._free, self.store.remove)
        self._usage = self.index.total()
        return evicted

    def _pause(self, reason: str) -> None:
        self.counters["disk_refusals"] += 1
        self._paused_until = trio.current_time() + PAUSE_SECONDS
        if not self._pause_logged:
            self._pause_logged = True
            log.warning(
                "disk cache: not admitting new entries for now: %s (reads are served "
                "from memory and the network meanwhile)",
                reason,
            )

    # -- background -----------------------------------------------------------------------

    async def _flusher(self) -> None:
        while True:
            with trio.move_on_after(FLUSH_SECONDS):
                await self._flush_now.wait()
            self._flush_now = trio.Event()
            await self._flush()

    async def _flush(self) -> None:
        """Write the uses recorded in memory, forget entries found corrupt, and evict
        down to the limits if something else filled the disk meanwhile."""
        if self.index is None:
            return
        uses, self._uses = self._uses, {}
        forgotten, self._forgotten = self._forgotten, []
        stamp = time.time()  # the index orders by wall-clock time: every process

        def write() -> int:
            if uses:
                self.index.touch([(stamp, name) for name in uses])
            if forgotten:
                self.index.forget(forgotten)
            return self._trim()

        try:
            self.counters["disk_evictions"] += await trio.to_thread.run_sync(
                write, limiter=self._db
            )
        except (OSError, sqlite3.Error) as exc:
            log.warning("disk cache: cannot record uses in the index: %s", exc)

    async def _tidy(self) -> None:
        """Remove what dead processes left; reconcile the index with the files when a
        process died or the index is new.  One subdirectory per transaction, so that
        admissions of other processes go on meanwhile."""
        dead = await trio.to_thread.run_sync(self.store.sweep, limiter=self._io)
        self._usage = await trio.to_thread.run_sync(self.index.total, limiter=self._db)
        if not dead and not self.index.created:
            self._flush_now.set()  # the limits may have changed since the last mount
            return
        added = dropped = 0
        prefixes = await trio.to_thread.run_sync(self.store.prefixes, limiter=self._io)
        for prefix in prefixes:
            try:
                new, gone = await trio.to_thread.run_sync(
                    self.index.reconcile,
                    prefix,
                    lambda prefix=prefix: self.store.scan(prefix),
                    limiter=self._db,
                )
            except sqlite3.Error as exc:
                log.warning("disk cache: cannot reconcile the index: %s", exc)
                return
            added += new
            dropped += gone
        self._flush_now.set()
        log.info(
            "disk cache: index reconciled with %s (%d entries found, %d gone; %d dead "
            "processes' files removed)",
            self.store.root,
            added,
            dropped,
            dead,
        )


def _open_index(path: str) -> Index:
    """The index at ``path``; a file SQLite cannot read is replaced (it is advisory:
    reconciling rebuilds it)."""
    try:
        return Index(path)
    except sqlite3.DatabaseError as exc:
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            raise DiskCacheError(f"the index {path} stays locked: {exc}") from None
        log.warning("disk cache: the index %s is unreadable (%s): making a new one", path, exc)
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + suffix)
    try:
        return Index(path)
    except (sqlite3.Error, OSError) as exc:
        raise DiskCacheError(f"cannot open the index {path}: {exc}") from None

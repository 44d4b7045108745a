"""The disk cache of one process: entries looked up, admitted, evicted and counted.

One :class:`DiskCache` per daemon (``serve`` makes it), shared by every reference set the
process serves; each set's fetcher gets a :class:`~refmount.cache.disk.tier.DiskTier` in
front of it that uses it.

Off the serving thread
    Every file operation runs in a worker thread: reads and writes under one limiter
    of :data:`IO_THREADS`, the index (one SQLite connection) under a limiter of one.
    All the entries a part wants are read by one thread call, straight into one buffer
    of the part (no join), each checked (header, size, CRC-32 of its data) where it
    landed: copying and checksumming let the GIL go.

Admission never holds a reader up
    The tier hands fetched bytes to :meth:`DiskCache.admit` and returns them to the
    reader; one writer task adds them to their units' entries behind it (read,
    merge, reserve the room in the index, write a temporary file, rename: a batch at a
    time, so that two pieces of one unit fetched together both stay, and the free-space
    floor holds while the batch is written).  At most ``queue_bytes`` (:data:`QUEUE_BYTES`
    unless the config says less) wait to be written; what comes while the queue is
    full is not kept (a network faster than the disk: counted in ``disk_refusals``).
    Queued pieces are views of fetched parts: a part the memory cache has evicted lives
    on while its pieces wait, so ``serve`` bounds the queue by the memory budget too.
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
import functools
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import trio

from refmount.cache.disk.entry import CorruptEntry, Entry, EntryKey, encoded_length
from refmount.cache.disk.index import Index, Limits, Reservation
from refmount.cache.disk.store import FULL_ERRNOS, DiskCacheError, Store

log = logging.getLogger(__name__)

IO_THREADS = 4  # worker threads reading and writing entries at once
WRITE_THREADS = 2  # threads writing one batch
QUEUE_BYTES = 64 << 20  # bytes waiting to be written, at most
DRAIN_SECONDS = 10.0  # at a stop, the most spent writing what is queued
PAUSE_SECONDS = 30.0  # admission rests this long after the disk or the limits said no
BATCH = 64  # entries written, then admitted in one transaction, at a time
GATHER_SECONDS = 0.05  # the longest a batch waits for more pieces
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
    "disk_bypassed",
    "disk_validations",
    "disk_validation_failures",
)


#: A piece waiting to be written: its unit, where it starts, its bytes, the object's end.
Queued = tuple[EntryKey, int, bytes | memoryview, int | None]
#: A temporary file written: its entry's name, its path, bytes on disk, bytes new.
_Written = tuple[str, str, int, int]
_In = TypeVar("_In")
_Out = TypeVar("_Out")


@dataclass
class _Merged:
    """A unit with a batch's pieces merged in: its entry, how many bytes of data it held
    before, whether the pieces changed it, how many bytes its file will take on disk."""

    key: EntryKey
    entry: Entry
    base_size: int
    changed: bool = False
    on_disk: int = 0


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
    #: Bytes waiting to be written, at most.
    queue_bytes: int = QUEUE_BYTES


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
        self._queue_send, self._queue_receive = trio.open_memory_channel[Queued](float("inf"))
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

    async def read_part(
        self, keys: list[EntryKey], wants: list[tuple[int, int]], start: int, end: int
    ) -> tuple[bytearray | memoryview | None, list[int | None]]:
        """What the entries of ``keys`` hold of ``wants`` (each unit's range of the part
        ``[start, end)``), read by one worker-thread call into one buffer of the part
        (a part of one unit: a view of its entry's bytes as read, nothing to fill):
        the buffer (None when no unit has an entry) and, per unit, how many bytes of its
        range it holds from the range's start (None: not all of them; fewer: the object
        ends there, and nothing after that unit was read).  Entries found corrupt are
        removed and counted."""
        buffer, got, corrupt = await trio.to_thread.run_sync(
            self._read_part, keys, wants, start, end, limiter=self._io
        )
        self._count_corrupt(corrupt)
        return buffer, got

    def _read_part(
        self, keys: list[EntryKey], wants: list[tuple[int, int]], start: int, end: int
    ) -> tuple[bytearray | memoryview | None, list[int | None], list[tuple[str, str]]]:
        """Runs in a worker thread: reading and checksumming let the GIL go."""
        corrupt: list[tuple[str, str]] = []
        if len(keys) == 1:  # one unit: its entry's bytes as read, no buffer to fill
            entry = self._read(keys[0], corrupt)
            piece = None if entry is None else entry.get(*wants[0])
            return piece, [None if piece is None else len(piece)], corrupt
        buffer: bytearray | None = None
        got: list[int | None] = [None] * len(keys)
        for i, (key, (lo, hi)) in enumerate(zip(keys, wants, strict=True)):
            try:
                fd = self.store.open(key)
            except OSError as exc:
                log.debug("disk cache: cannot open an entry: %s", exc)
                continue
            if fd is None:
                continue
            if buffer is None:  # the first entry found: a buffer for the whole part
                buffer = bytearray(end - start)
            held = None
            try:
                with memoryview(buffer) as view, view[lo - start : hi - start] as slot:
                    held = self._read_into(key, fd, lo, hi, slot)
            except CorruptEntry as exc:
                corrupt.append((key.name, str(exc)))
            except OSError as exc:
                log.debug("disk cache: cannot read an entry: %s", exc)
            finally:
                os.close(fd)
            got[i] = held
            if held is not None and held < hi - lo:
                break
        return buffer, got, corrupt

    def _read_into(self, key: EntryKey, fd: int, lo: int, hi: int, slot: memoryview) -> int | None:
        """Bytes ``[lo, hi)`` of ``key``'s unit from its open entry ``fd`` into ``slot``:
        how many it had (fewer where the object ends), None if not all of them."""
        if lo == key.offset and hi == key.end:
            found = self.store.read_whole(key, fd, slot)
            if found is True:
                return hi - lo
        else:
            found = self.store.read_entry(key, fd)
        piece = found.get(lo, hi)
        if piece is None:
            return None
        slot[: len(piece)] = piece
        return len(piece)

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
        its entry; ``eof``: where the object ends, if the fetch found out.  Never waits:
        when ``queue_bytes`` wait already (the network is faster than the disk), the
        piece is refused (counted in ``disk_refusals``) and the reader goes on."""
        if not self._running or not key.cacheable() or not (piece or eof is not None):
            return
        if trio.current_time() < self._paused_until:
            self.counters["disk_refusals"] += 1
            return
        if self._queued + len(piece) > self.config.queue_bytes and self._queued:
            self.counters["disk_refusals"] += 1
            return
        self._queued += len(piece)
        self._queue_send.send_nowait((key, start, piece, eof))

    async def _writer(self) -> None:
        """The one writer, a batch at a time: so that two pieces of one unit merge, and
        one transaction of the index admits many entries.  A batch gathers for up to
        :data:`GATHER_SECONDS` after its first piece: random reads arrive one chunk at
        a time, and a thread call and a transaction per chunk cost more than writing
        it."""
        async for item in self._queue_receive:
            batch = [item]
            try:
                with trio.move_on_after(GATHER_SECONDS):
                    while len(batch) < BATCH:
                        batch.append(await self._queue_receive.receive())
            finally:
                try:
                    # A batch is finished even at a stop: its temporary files are written.
                    with trio.CancelScope(shield=True):
                        await self._write(batch)
                finally:
                    self._queued -= sum(len(piece) for _, _, piece, _ in batch)

    async def _drain(self) -> None:
        """Write what is still queued (at a stop)."""
        batch: list[Queued] = []
        while True:
            try:
                batch.append(self._queue_receive.receive_nowait())
            except trio.WouldBlock:
                break
        for first in range(0, len(batch), BATCH):
            await self._write(batch[first : first + BATCH])

    async def _write(self, batch: list[Queued]) -> None:
        """Merge the batch's pieces into their units' entries, reserve the room they
        take (the free-space floor holds while they are written), write them as
        temporary files, admit them."""
        if trio.current_time() < self._paused_until:
            self.counters["disk_refusals"] += len(batch)
            return
        corrupt: list[tuple[str, str]] = []
        # Units split between WRITE_THREADS threads, every piece of one unit in the same.
        groups: list[list[Queued]] = [[] for _ in range(WRITE_THREADS)]
        for item in batch:
            groups[hash(item[0].name) % WRITE_THREADS].append(item)
        merged = await self._in_threads(
            [g for g in groups if g], lambda group, out: self._merge(group, out, corrupt)
        )
        self._count_corrupt(corrupt)
        units = [unit for got in merged for unit in got]
        if not units:
            return
        try:
            reservation = await trio.to_thread.run_sync(
                self._reserve, [unit.on_disk for unit in units], limiter=self._db
            )
        except (OSError, sqlite3.Error) as exc:
            log.warning("disk cache: cannot reserve room for entries: %s", exc)
            return
        self.counters["disk_evictions"] += len(reservation.evicted)
        if reservation.id is None and not reservation.others:
            self._pause("the free-space floor leaves no room")
            return
        # The room left is held by this batch's first units or by other writers: the
        # rest is lost, and the next batch finds room again.
        self.counters["disk_refusals"] += len(units) - reservation.granted
        if reservation.id is None:
            return
        kept = set(map(id, units[: reservation.granted]))
        failures: list[OSError] = []

        def write(group: list[_Merged], out: list[_Written]) -> None:
            try:
                self._write_temps([unit for unit in group if id(unit) in kept], out)
            except OSError as exc:
                failures.append(exc)

        written = [w for got in await self._in_threads(merged, write) for w in got]
        for exc in failures[:1]:
            if exc.errno in FULL_ERRNOS:
                self._pause(f"{exc.strerror} in {self.store.root}")
            else:
                log.warning("disk cache: cannot write an entry: %s", exc)
        try:
            admitted, evicted = await trio.to_thread.run_sync(
                self._admit, written, reservation.id, limiter=self._db
            )
        except (OSError, sqlite3.Error) as exc:
            log.warning("disk cache: cannot admit entries: %s", exc)
            return
        self.counters["disk_evictions"] += len(evicted)
        done = set(admitted)
        for name, _, _, new_bytes in written:
            if name in done:
                self.counters["disk_written_entries"] += 1
                self.counters["disk_written_bytes"] += new_bytes
        if len(done) < len(written):
            self._pause("the limits leave no room")
        elif self._pause_logged and reservation.granted == len(units):
            log.info("disk cache: admitting again")
            self._pause_logged = False

    async def _in_threads(
        self, groups: list[list[_In]], work: Callable[[list[_In], list[_Out]], None]
    ) -> list[list[_Out]]:
        """``work(group, out)`` for each group, in worker threads at once; what each
        put in its ``out``."""
        outs: list[list[_Out]] = [[] for _ in groups]
        async with trio.open_nursery() as nursery:
            for group, out in zip(groups, outs, strict=True):
                nursery.start_soon(
                    functools.partial(trio.to_thread.run_sync, limiter=self._io), work, group, out
                )
        return outs

    def _merge(
        self, batch: list[Queued], out: list[_Merged], corrupt: list[tuple[str, str]]
    ) -> None:
        """The batch's units, each as it is on disk now plus the batch's pieces of it (a
        unit with nothing new is left out), into ``out``.  Runs in a worker thread."""
        space = self.store.space()
        units: dict[str, _Merged] = {}
        for key, start, piece, eof in batch:
            unit = units.get(key.name)
            if unit is None:
                base = self._read(key, corrupt) or Entry()
                unit = units[key.name] = _Merged(key, base, base.size)
            entry = unit.entry.merged(start, piece, eof)
            if entry is not None:
                unit.entry, unit.changed = entry, True
        for unit in units.values():
            if unit.changed:
                unit.on_disk = space.on_disk(encoded_length(unit.key, unit.entry))
                out.append(unit)

    def _write_temps(self, units: list[_Merged], written: list[_Written]) -> None:
        """Temporary files of ``units``, into ``written`` as each is done (so that a
        failure leaves none unaccounted for).  Runs in a worker thread."""
        for unit in units:
            temp, size = self.store.write_temp(unit.key, unit.entry)
            written.append((unit.key.name, temp, size, unit.entry.size - unit.base_size))

    def _reserve(self, sizes: list[int]) -> Reservation:
        """Runs in a worker thread, holding the index."""
        return self.index.reserve(self.store.owner, sizes, time.time(), self._limits(), self.store)

    def _admit(self, written: list[_Written], reservation: int) -> tuple[list[str], list[str]]:
        """Runs in a worker thread, holding the index; removes the temporary files that
        were not placed."""
        items = [
            (name, size, functools.partial(self.store.place, temp, name))
            for name, temp, size, _ in written
        ]
        admitted: list[str] = []
        try:
            admitted, evicted = self.index.admit(
                items, time.time(), self._limits(), self.store.remove, reservation
            )
            self._usage = self.index.total()
            return admitted, evicted
        finally:
            placed = set(admitted)
            for name, temp, _, _ in written:
                if name not in placed:
                    self.store.discard(temp)

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
        evicted = self.index.trim(time.time(), self._limits(), self.store)
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
    except sqlite3.OperationalError as exc:  # locked, read-only, I/O error: not ours to fix
        raise DiskCacheError(f"cannot open the index {path}: {exc}") from None
    except sqlite3.DatabaseError as exc:  # not a database, or a damaged one
        log.warning("disk cache: the index %s is unreadable (%s): making a new one", path, exc)
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + suffix)
    try:
        return Index(path)
    except (sqlite3.Error, OSError) as exc:
        raise DiskCacheError(f"cannot open the index {path}: {exc}") from None

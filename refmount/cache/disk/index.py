"""The shared, advisory index of a cache directory: what each entry costs and when it
was last used, and the total, in one SQLite database (WAL mode) that every process
using the directory opens.

*Advisory*: the entry files are the truth.  A row without a file (its process died
between deleting and committing) only overstates the total; a file without a row (its
process died between renaming it into place and committing) is found by
:meth:`Index.reconcile`, which a process runs in the background when it finds that
another died, or that the index is new.  Nothing waits for it: a lookup is a path, not
a query.

The free-space floor holds at write time: before a process writes a batch of entries
as temporary files it reserves the room they take (:meth:`Index.reserve`), evicting
first where the free space, less what the live reservations have still to write, would
fall below the floor, and leaving out what does not fit.  A reservation is a row (its
owner, its bytes, when it expires) that the admission of the batch deletes; the row of
a process that died (its lock is free) goes at the next reservation of any process,
and any row at its expiry.  So the free space seen from outside stays above the floor
whatever number of processes write at once.

Admission and eviction are one transaction (``BEGIN IMMEDIATE``: one writer at a time,
across processes), inside which the caller deletes the victims' files and renames the
new entry into place (:meth:`Index.admit`): so the entries on disk never exceed the
size limit by more than the one a crashed process renamed without committing.  No process
manages the others: any of them evicts, least recently used first (:func:`plan_eviction`).

Use is recorded in memory by the caller and written here in batches (:meth:`touch`);
access times of the filesystem are too coarse (``relatime``) to order by.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

BUSY_TIMEOUT = 30.0  # seconds a process waits for another's transaction
RESERVE_SECONDS = 120.0  # a reservation not admitted by then is forgotten
WAL_PAGES = 64  # the log is checkpointed, and cut back, at this many pages
_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (name TEXT PRIMARY KEY, blocks INTEGER NOT NULL,
                                    used REAL NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS entries_by_use ON entries (used);
CREATE TABLE IF NOT EXISTS totals (id INTEGER PRIMARY KEY CHECK (id = 0),
                                   bytes INTEGER NOT NULL);
INSERT OR IGNORE INTO totals VALUES (0, 0);
CREATE TABLE IF NOT EXISTS reservations (id INTEGER PRIMARY KEY, owner TEXT NOT NULL,
                                         bytes INTEGER NOT NULL, expires REAL NOT NULL);
"""


@dataclass(frozen=True)
class Limits:
    """Bounds of one admission: the most the entries may take (``max_bytes``), the free
    space the filesystem must keep (``min_free``), and how much more than needed to
    evict once eviction starts (``slack``: hysteresis, so that a full cache does not
    evict at every admission)."""

    max_bytes: int
    min_free: int
    slack: int


def plan_eviction(
    candidates: Iterable[tuple[str, int]],
    *,
    total: int,
    incoming: int,
    free: int,
    limits: Limits,
) -> list[tuple[str, int]] | None:
    """Which entries to evict, least recently used first, to admit ``incoming`` bytes.

    ``candidates`` are (name, bytes), least recently used first; ``total`` is what the
    entries take now; ``free`` the filesystem's free space now (the new entry already
    written, as a temporary file).  Returns the victims: enough that afterwards the
    entries take at most ``max_bytes`` and at least ``min_free`` stays free, plus
    ``slack`` more where eviction is needed at all; or None when even evicting every
    candidate would not make room (then nothing is evicted and the entry is refused).
    """
    need = max(total + incoming - limits.max_bytes, limits.min_free - free)
    if incoming > limits.max_bytes:
        return None
    if need <= 0:
        return []
    want = need + limits.slack
    victims: list[tuple[str, int]] = []
    freed = 0
    for name, size in candidates:
        if freed >= want:
            break
        victims.append((name, size))
        freed += size
    return victims if freed >= need else None


class Disk(Protocol):
    """What the index asks of the directory it describes."""

    def free(self) -> int:
        """The filesystem's free space now, in bytes."""

    def remove(self, name: str) -> None:
        """Delete entry ``name``'s file."""

    def alive(self, owner: str) -> bool:
        """Whether the process ``owner`` lives."""

    def writing(self) -> dict[str, int]:
        """The bytes the temporary files take now, by owner."""


@dataclass(frozen=True)
class Reservation:
    """What :meth:`Index.reserve` granted: the row to hand to :meth:`Index.admit` (None
    when nothing was granted), how many of the sizes asked for it holds, the entries
    evicted to make room, and the bytes other processes' reservations held (room that
    comes back, or becomes entries that can be evicted, as their writers finish)."""

    id: int | None
    granted: int
    evicted: list[str]
    others: int


class Index:
    """One process's connection to the shared index (used from one thread at a time)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.created = not os.path.exists(path)
        self._db = sqlite3.connect(
            path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
        )
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            # The log lives beside the entries, under the same floor: keep it small.
            self._db.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
            self._db.execute(f"PRAGMA journal_size_limit={WAL_PAGES * 4096}")
            self._db.executescript(_SCHEMA)  # idempotent, whoever runs it first
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def total(self) -> int:
        return int(self._db.execute("SELECT bytes FROM totals WHERE id = 0").fetchone()[0])

    def count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM entries").fetchone()[0])

    def reserve(
        self,
        owner: str,
        sizes: Sequence[int],
        now: float,
        limits: Limits,
        disk: Disk,
    ) -> Reservation:
        """Reserve room for entries of ``sizes`` bytes (on disk) that ``owner`` is about
        to write, in order, each only if the free space less what every live
        reservation has still to write stays above the floor once it is written:
        evicting first (least recently used), or stopping at the first that even
        evicting every entry would not make room for.  Rows of owners that are not
        alive any more, or expired, are dropped first.

        Only the floor is looked at here: the entries' total is bounded at admission,
        when the entries an admission replaces are known."""
        evicted: list[str] = []
        granted = 0
        with self._transaction() as db:
            db.execute("DELETE FROM reservations WHERE expires < ?", (now,))
            owners = [row[0] for row in db.execute("SELECT DISTINCT owner FROM reservations")]
            gone = [(o,) for o in owners if o != owner and not disk.alive(o)]
            db.executemany("DELETE FROM reservations WHERE owner = ?", gone)
            # What the others' files take first, the free space after: bytes they write
            # in between are then counted twice (room underestimated), never not at all.
            unwritten = self._unwritten(db, now, disk)
            room = disk.free() - unwritten
            for size in sizes:
                victims = plan_eviction(
                    db.execute("SELECT name, blocks FROM entries ORDER BY used"),
                    total=0,
                    incoming=size,
                    free=room - size,
                    limits=limits,
                )
                if victims is None:
                    break
                freed = self._evict(db, victims, disk.remove)
                evicted += [v for v, _ in victims]
                room += freed - size
                granted += 1
            (others,) = db.execute(
                "SELECT total(bytes) FROM reservations WHERE owner != ?", (owner,)
            ).fetchone()
            if not granted:
                return Reservation(None, 0, evicted, int(others))
            cursor = db.execute(
                "INSERT INTO reservations (owner, bytes, expires) VALUES (?, ?, ?)",
                (owner, sum(sizes[:granted]), now + RESERVE_SECONDS),
            )
            return Reservation(cursor.lastrowid, granted, evicted, int(others))

    def _unwritten(self, db: sqlite3.Connection, now: float, disk: Disk) -> int:
        """The bytes the live reservations have still to write: what each owner
        reserved less what its temporary files take already (counted in the free
        space)."""
        rows = db.execute(
            "SELECT owner, sum(bytes) FROM reservations WHERE expires >= ? GROUP BY owner", (now,)
        ).fetchall()
        if not rows:
            return 0
        written = disk.writing()
        return sum(max(0, int(held) - written.get(owner, 0)) for owner, held in rows)

    def _evict(
        self,
        db: sqlite3.Connection,
        victims: list[tuple[str, int]],
        remove: Callable[[str], None],
    ) -> int:
        """Remove the victims' files and rows; returns the bytes they took."""
        for victim, _ in victims:
            remove(victim)
        db.executemany("DELETE FROM entries WHERE name = ?", [(v,) for v, _ in victims])
        freed = sum(size for _, size in victims)
        db.execute("UPDATE totals SET bytes = bytes - ? WHERE id = 0", (freed,))
        return freed

    def admit(
        self,
        items: list[tuple[str, int, Callable[[], None]]],
        now: float,
        limits: Limits,
        remove: Callable[[str], None],
        reservation: int | None = None,
    ) -> tuple[list[str], list[str]]:
        """Admit entries, each ``(name, size, place)`` (new, or replacing the entry of
        that name), written as temporary files in ``reservation``'s room, in one
        transaction: for each, pick the victims that the size limit says must go,
        ``remove`` each (delete its file), ``place`` the new entry (rename it into
        place), and record it all; and let go of the reservation.  Returns (the names
        admitted, the victims' names); an entry for which even evicting everything
        would not make room is left out (its ``place`` not called).  An exception from
        ``place`` undoes the whole transaction.  (A rename takes no room: the floor was
        held by the reservation.)"""
        admitted: list[str] = []
        evicted: list[str] = []
        with self._transaction() as db:
            db.execute("DELETE FROM reservations WHERE id = ?", (reservation,))
            total = self.total()
            for name, size, place in items:
                row = db.execute("SELECT blocks FROM entries WHERE name = ?", (name,)).fetchone()
                replaced = 0 if row is None else int(row[0])

                def candidates(name: str = name) -> Iterator[tuple[str, int]]:
                    # Asked only when something must go.
                    yield from db.execute(
                        "SELECT name, blocks FROM entries WHERE name != ? ORDER BY used", (name,)
                    )

                victims = plan_eviction(
                    candidates(),
                    total=total - replaced,
                    incoming=size,
                    free=limits.min_free,
                    limits=limits,
                )
                if victims is None:
                    continue
                total -= self._evict(db, victims, remove)
                place()
                db.execute("INSERT OR REPLACE INTO entries VALUES (?, ?, ?)", (name, size, now))
                db.execute("UPDATE totals SET bytes = bytes + ? WHERE id = 0", (size - replaced,))
                total += size - replaced
                admitted.append(name)
                evicted += [v for v, _ in victims]
        return admitted, evicted

    def trim(self, now: float, limits: Limits, disk: Disk) -> int:
        """Evict what the limits say must go now (no admission: the limits or the free
        space changed, or another process or program filled the disk).  Returns how
        many entries went."""
        with self._transaction() as db:
            rows = db.execute("SELECT name, blocks FROM entries ORDER BY used")
            victims = plan_eviction(
                rows,
                total=self.total(),
                incoming=0,
                free=disk.free() - self._unwritten(db, now, disk),
                limits=limits,
            )
            if not victims:  # nothing to do, or nothing would be enough: evict all there is
                if victims is None:
                    victims = db.execute("SELECT name, blocks FROM entries").fetchall()
                if not victims:
                    return 0
            self._evict(db, victims, disk.remove)
        return len(victims)

    def touch(self, uses: Sequence[tuple[str, float]]) -> None:
        """Record when entries were last used (a batch from memory)."""
        with self._transaction() as db:
            db.executemany("UPDATE entries SET used = max(used, ?) WHERE name = ?", uses)

    def forget(self, names: Sequence[str]) -> None:
        """Drop the rows of entries whose files are gone (found corrupt, removed)."""
        with self._transaction() as db:
            for name in names:
                row = db.execute("SELECT blocks FROM entries WHERE name = ?", (name,)).fetchone()
                if row is not None:
                    db.execute("DELETE FROM entries WHERE name = ?", (name,))
                    db.execute("UPDATE totals SET bytes = bytes - ? WHERE id = 0", (row[0],))

    def reconcile(
        self, prefix: str, scan: Callable[[], dict[str, tuple[int, float]]]
    ) -> tuple[int, int]:
        """Make the rows of one data subdirectory ``prefix`` (``"ab"``) agree with its
        files: ``scan`` lists them, by name, as (bytes, last use as the file's times
        say).  It runs inside the transaction, so no admission renames a file in between.
        Returns (rows added, rows dropped)."""
        low, high = f"{prefix}/", f"{prefix}0"  # "0" follows "/" in byte order
        with self._transaction() as db:
            files = scan()
            rows = dict(
                db.execute(
                    "SELECT name, blocks FROM entries WHERE name >= ? AND name < ?", (low, high)
                ).fetchall()
            )
            gone = [n for n in rows if n not in files]
            new = [(n, size, used) for n, (size, used) in files.items() if n not in rows]
            changed = sum(-rows[n] for n in gone) + sum(size for _, size, _ in new)
            db.executemany("DELETE FROM entries WHERE name = ?", [(n,) for n in gone])
            db.executemany("INSERT INTO entries VALUES (?, ?, ?)", new)
            db.execute("UPDATE totals SET bytes = bytes + ? WHERE id = 0", (changed,))
        return len(new), len(gone)

"""The disk tier: what the block cache fetches a part through when ``--disk-cache`` is on.

It stands in front of one :class:`~refmount.fetch.Fetcher` with the fetcher's ``fetch``:
the block cache's parts, demand and read-ahead alike, come from disk when their bytes are
there and from the network otherwise, and what comes from the network is handed to the
disk cache to keep.  So the memory cache and read-ahead work on top unchanged, and a
chunk on disk is never fetched again for read-ahead.

Units
    A part's range is cut at multiples of ``unit`` bytes; each piece is looked for in
    its unit's entry (:mod:`refmount.cache.disk.entry`), which holds whatever spans of
    the unit have been fetched, by any read, in any process.  A whole zarr chunk read
    at random, and the same bytes read by a stream's read-ahead, find each other.  All
    of a part's entries are read in one worker-thread call; the pieces not found are
    fetched as runs of adjacent units, one request per run, and only those bytes.

Versions
    Entries are keyed by the object's validator (:mod:`refmount.cache.disk.validators`);
    an object without one, or whose validator could not be asked, bypasses the disk.
    Between a validator check and a fetch the object may change: bytes of a version
    newer than the key can be stored under it, never older ones, and the next check
    (at most ``check_interval`` later) moves every reader to the new key.
"""

from __future__ import annotations

import trio

from refmount.cache.disk.cache import DiskCache
from refmount.cache.disk.entry import EntryKey
from refmount.cache.disk.validators import Validators
from refmount.fetch import Fetcher

UNIT = 256 << 10  # the block cache's block size: a block part's blocks are whole units
JOIN_INLINE = 1 << 20  # pieces joined on the serving thread up to this many bytes


class DiskTier:
    """``fetch`` of ``fetcher``, through the disk cache ``disk``."""

    def __init__(self, disk: DiskCache, fetcher: Fetcher, *, unit: int = UNIT) -> None:
        self.disk = disk
        self.fetcher = fetcher
        self.unit = unit
        self.validators = Validators(
            fetcher.version,
            interval=disk.config.check_interval,
            immutable=disk.config.immutable,
            counters=disk.counters,
        )

    def stats(self) -> dict[str, int]:
        return self.disk.stats()

    async def fetch(self, url: str, start: int, end: int, *, allow_short: bool = False) -> bytes:
        """Bytes ``[start, end)`` of ``url``, as :meth:`Fetcher.fetch` gives them."""
        if end <= start:
            return b""
        validator, size = await self.validators.current(url)
        if size is not None and end > size:  # past the end of the object
            if not allow_short:  # not what the reference says: the fetcher reports it
                validator = None
            elif start >= size:
                return b""
            else:
                end = size
        if validator is None:
            self.disk.counters["disk_bypassed"] += 1
            return await self.fetcher.fetch(url, start, end, allow_short=allow_short)
        keys, wants = self._units(url, validator, start, end)
        entries = await self.disk.lookup(keys)
        pieces: list[bytes | memoryview | None] = []
        for key, (lo, hi), entry in zip(keys, wants, entries, strict=True):
            piece = None if entry is None else entry.get(lo, hi)
            if piece is None:
                self.disk.counters["disk_misses"] += 1
            else:
                self.disk.used(key, len(piece))
            pieces.append(piece)
            if piece is not None and len(piece) < hi - lo:
                break  # the object ends here
        # One request per run of misses, one after another: nearly always there is one
        # run, and a failure reaches the block cache as the fetcher raised it.
        for first, last in _missing_runs(pieces):
            await self._fill(keys, wants, pieces, first, last, allow_short)
        kept = _kept(wants, pieces)
        data = _whole(kept)
        if data is None:
            # Joining megabytes is a copy the serving thread must not wait on.
            data = (
                await trio.to_thread.run_sync(b"".join, kept)
                if sum(len(p) for p in kept) > JOIN_INLINE
                else b"".join(kept)
            )
        if not allow_short and len(data) != end - start:
            # An entry that says the object ends sooner than the whole reference: the
            # object is not what the reference says; the fetcher's answer decides.
            return await self.fetcher.fetch(url, start, end)
        return data

    def _units(
        self, url: str, validator: str, start: int, end: int
    ) -> tuple[list[EntryKey], list[tuple[int, int]]]:
        """The units ``[start, end)`` touches, and the range wanted of each."""
        unit = self.unit
        keys: list[EntryKey] = []
        wants: list[tuple[int, int]] = []
        pos = start
        while pos < end:
            base = pos // unit * unit
            stop = min(end, base + unit)
            keys.append(EntryKey(url, validator, base, unit))
            wants.append((pos, stop))
            pos = stop
        return keys, wants

    async def _fill(
        self,
        keys: list[EntryKey],
        wants: list[tuple[int, int]],
        pieces: list[bytes | memoryview | None],
        first: int,
        last: int,
        allow_short: bool,
    ) -> None:
        """Fetch the wanted ranges of units ``first`` to ``last - 1`` as one request,
        fill them into ``pieces`` and queue them to be kept."""
        lo, hi = wants[first][0], wants[last - 1][1]
        data = await self.fetcher.fetch(keys[first].url, lo, hi, allow_short=allow_short)
        view = memoryview(data)
        eof = lo + len(data) if len(data) < hi - lo else None
        for i in range(first, last):
            start, stop = wants[i]
            piece = view[start - lo : stop - lo]
            pieces[i] = piece
            ends_here = eof is not None and eof <= keys[i].end
            await self.disk.admit(keys[i], start, piece, eof if ends_here else None)
            if len(piece) < stop - start:
                break


def _missing_runs(pieces: list[bytes | memoryview | None]) -> list[tuple[int, int]]:
    """``[first, last)`` of each run of adjacent misses."""
    runs: list[tuple[int, int]] = []
    first = None
    for i, piece in enumerate(pieces):
        if piece is None:
            if first is None:
                first = i
            continue
        if first is not None:
            runs.append((first, i))
            first = None
    if first is not None:
        runs.append((first, len(pieces)))
    return runs


def _kept(
    wants: list[tuple[int, int]], pieces: list[bytes | memoryview | None]
) -> list[bytes | memoryview]:
    """The pieces in order, up to the first one that ends the object."""
    kept: list[bytes | memoryview] = []
    for (lo, hi), piece in zip(wants, pieces, strict=False):
        if piece is None:
            break
        kept.append(piece)
        if len(piece) < hi - lo:
            break
    return kept


def _whole(kept: list[bytes | memoryview]) -> bytes | None:
    """The bytes of ``kept`` without a copy, when they are all of one bytes object."""
    if not kept:
        return b""
    if len(kept) > 1:
        return None
    piece = kept[0]
    if isinstance(piece, bytes):
        return piece
    whole = piece.obj  # a view of all of one entry's data, or of a fetch
    if isinstance(whole, bytes) and piece.nbytes == len(whole):
        return whole
    return None

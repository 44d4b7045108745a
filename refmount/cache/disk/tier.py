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
    of a part's entries are read in one worker-thread call into one buffer of the part;
    the pieces not found are fetched as runs of adjacent units, one request per run,
    and only those bytes, copied into their places.  A part with no entry at all is
    the fetch's own bytes, not copied.

Versions
    Entries are keyed by the object's validator (:mod:`refmount.cache.disk.validators`);
    an object without one, or whose validator could not be asked, bypasses the disk.
    Between a validator check and a fetch the object may change: bytes of a version
    newer than the key can be stored under it, never older ones, and the next check
    (at most ``check_interval`` later) moves every reader to the new key.  A read whose
    reference names a checksum uses the disk only while the object's current version is
    the one named (its ETag or modification time, as the version check saw them); else
    it goes to the fetcher, which refuses it.
"""

from __future__ import annotations

import trio

from refmount.cache.disk.cache import DiskCache
from refmount.cache.disk.entry import EntryKey
from refmount.cache.disk.validators import Validators
from refmount.fetch import Fetcher, checksums
from refmount.refs.model import Checksum

UNIT = 256 << 10  # the block cache's block size: a block part's blocks are whole units
COPY_INLINE = 1 << 20  # fetched bytes copied into a part on the serving thread up to this


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

    async def fetch(
        self,
        url: str,
        start: int,
        end: int,
        *,
        allow_short: bool = False,
        checksum: Checksum | None = None,
    ) -> bytes | memoryview:
        """Bytes ``[start, end)`` of ``url``, as :meth:`Fetcher.fetch` gives them."""
        if end <= start:
            return b""
        version = await self.validators.current(url)
        validator, size = version.validator, version.size
        if checksum is not None and checksums.mismatch(
            checksum, etag=version.etag, modified=version.modified
        ):
            validator = None  # not the version named: the fetcher decides, and refuses
        if size is not None and end > size:  # past the end of the object
            if not allow_short:  # not what the reference says: the fetcher reports it
                validator = None
            elif start >= size:
                return b""
            else:
                end = size
        if validator is None:
            self.disk.counters["disk_bypassed"] += 1
            return await self.fetcher.fetch(
                url, start, end, allow_short=allow_short, checksum=checksum
            )
        keys, wants = self._units(url, validator, start, end)
        buffer, got = await self.disk.read_part(keys, wants, start, end)
        if buffer is None:  # nothing on disk: the fetch's bytes as they are
            self.disk.counters["disk_misses"] += len(keys)
            return await self._fetch(keys, wants, 0, len(keys), allow_short, checksum)
        reach = end  # where the object's bytes end, if before ``end``
        count = len(keys)  # the units up to the one where the object ends
        for i, ((lo, hi), n) in enumerate(zip(wants, got, strict=True)):
            if n is None:
                self.disk.counters["disk_misses"] += 1
                continue
            self.disk.used(keys[i], n)
            if n < hi - lo:
                reach, count = lo + n, i + 1
                break
        # One request per run of misses, one after another: nearly always there is at
        # most one run, and a failure reaches the block cache as the fetcher raised it.
        for first, last in _missing_runs(got[:count]):
            lo, hi = wants[first][0], wants[last - 1][1]
            data = await self._fetch(keys, wants, first, last, allow_short, checksum)
            if len(data) > COPY_INLINE:  # a copy of megabytes the serving thread must not wait on
                await trio.to_thread.run_sync(_copy_into, buffer, lo - start, data)
            else:
                _copy_into(buffer, lo - start, data)
            if len(data) < hi - lo:
                reach = lo + len(data)
                break
        if reach < end:
            if not allow_short:
                # An entry that says the object ends sooner than the whole reference:
                # the object is not what the reference says; the fetcher's answer
                # decides.
                return await self.fetcher.fetch(url, start, end, checksum=checksum)
            return bytes(memoryview(buffer)[: reach - start])  # the object's last part
        if isinstance(buffer, bytearray):
            return memoryview(buffer).toreadonly()  # checked bytes: nobody writes them now
        whole = buffer.obj  # one unit: a view of its entry's bytes
        return whole if isinstance(whole, bytes) and len(whole) == buffer.nbytes else buffer

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

    async def _fetch(
        self,
        keys: list[EntryKey],
        wants: list[tuple[int, int]],
        first: int,
        last: int,
        allow_short: bool,
        checksum: Checksum | None,
    ) -> bytes:
        """Fetch the wanted ranges of units ``first`` to ``last - 1`` as one request and
        hand them to the disk cache to keep."""
        lo, hi = wants[first][0], wants[last - 1][1]
        data = await self.fetcher.fetch(
            keys[first].url, lo, hi, allow_short=allow_short, checksum=checksum
        )
        view = memoryview(data)
        eof = lo + len(data) if len(data) < hi - lo else None
        for i in range(first, last):
            start, stop = wants[i]
            piece = view[start - lo : stop - lo]
            ends_here = eof is not None and eof <= keys[i].end
            self.disk.admit(keys[i], start, piece, eof if ends_here else None)
            if len(piece) < stop - start:
                break
        return data


def _missing_runs(got: list[int | None]) -> list[tuple[int, int]]:
    """``[first, last)`` of each run of adjacent misses."""
    runs: list[tuple[int, int]] = []
    first = None
    for i, n in enumerate(got):
        if n is None:
            if first is None:
                first = i
            continue
        if first is not None:
            runs.append((first, i))
            first = None
    if first is not None:
        runs.append((first, len(got)))
    return runs


def _copy_into(buffer: bytearray | memoryview, at: int, data: bytes) -> None:
    with memoryview(buffer) as view:
        view[at : at + len(data)] = data

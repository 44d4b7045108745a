"""Zarr v3 sharded arrays (``sharding_indexed``): each inner chunk served as a v2 chunk.

A shard is one object holding the inner chunks of a block of the array, each encoded by
the inner codecs, and an index: per inner chunk (C order) its offset and length in the
shard, two little-endian uint64, both all ones for a chunk not written; the index at the
shard's end (or start), followed by its CRC-32C when ``index_codecs`` say so.

The decoded view presents the array with the inner chunk shape as its chunks; the inner
chunk ``(i, j)`` is served from the shard holding it: its reader
(:class:`refmount.decode.reads.DecodedReads`) fetches the shard's index (one exact
range, kept by the block cache under the memory budget like any other bytes, so a
shard's index is fetched once for all its inner chunks), :class:`ShardDecoder` checks it
and locates the inner chunk, and only that chunk's byte range is fetched and decoded
with the inner pipeline's decoder.  A reader going through a shard (a second inner chunk
of it read) gets each inner chunk's :class:`Run` of up to :data:`RUN` neighbours in the
shard's bytes (the whole shard of 64) in one request, when they lie back to back, and
they are decoded together: jobs of :data:`GROUP` inner chunks (``decode-run``), not one
per inner chunk; the shards the reader enters next (:meth:`ShardLayout.after`) are then
read ahead from their :meth:`ShardDecoder.first_run`.  A shard held inline is read whole.
An inner chunk not written reads as the fill value.  A shard is never served as a chunk.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from refmount.decode.arrays import ArrayRefused, ChunkDecoder
from refmount.decode.codecs import Buffer, DecodeError

_MISSING = (1 << 64) - 1
#: Inner chunks fetched as one request once a shard is being read: how many, and their
#: most bytes.
RUN = 64
RUN_BYTES = 8 << 20
#: A run's inner chunks are decoded in jobs of this many (the workers run them side by
#: side), of at most ``BATCH_BYTES`` decoded bytes.
GROUP = 16
BATCH_BYTES = 64 << 20
#: Shards read ahead of a reader going through one, at most.
AHEAD = 8


@dataclass(frozen=True)
class ShardLayout:
    """Where inner chunks lie: ``per_shard`` inner chunks along each dimension, the index
    at the ``end`` (or start), with a CRC-32C after it when ``checksummed``."""

    per_shard: tuple[int, ...]
    end: bool
    checksummed: bool

    @property
    def count(self) -> int:
        return math.prod(self.per_shard)

    @property
    def index_size(self) -> int:
        return self.count * 16 + (4 if self.checksummed else 0)

    def shard_of(self, inner: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
        """The shard holding inner chunk ``inner``, and the inner chunk's position in it."""
        shard, position = [], 0  # C order, in plain integers (a lookup's cost, per file)
        for i, n in zip(inner, self.per_shard, strict=True):
            shard.append(i // n)
            position = position * n + i % n
        return tuple(shard), position

    def after(self, shard: tuple[int, ...], grid: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The shards a reader going through ``shard`` of an array of ``grid`` inner
        chunks reads next in C order, :data:`AHEAD` at most: a reader of whole rows of
        inner chunks enters a row of shards together, and the next row while it reads
        them, so those are read ahead at once, not a row of shards at a time."""
        counts = tuple(-(-g // n) for g, n in zip(grid, self.per_shard, strict=True))
        if not counts:
            return []
        first = int(np.ravel_multi_index(shard, counts)) + 1
        stop = min(first + AHEAD, math.prod(counts))
        return [tuple(int(i) for i in np.unravel_index(n, counts)) for n in range(first, stop)]

    def ranks(self, shard: tuple[int, ...], grid: tuple[int, ...]) -> list[int]:
        """Per inner chunk of ``shard`` (index order), its place in C order among the
        inner chunks of an array of ``grid``: when a reader of the whole array in C
        order comes to it (those past the grid's edge, never read, as the edge's)."""
        if not grid:
            return [0]
        local = np.indices(self.per_shard).reshape(len(grid), -1)
        first = np.array(shard)[:, None] * np.array(self.per_shard)[:, None]
        within = np.minimum(first + local, np.array(grid)[:, None] - 1)
        return [int(rank) for rank in np.ravel_multi_index(tuple(within), grid)]

    def inner_chunks(self, shard: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The inner chunks of ``shard``, in index order."""
        starts = [s * n for s, n in zip(shard, self.per_shard, strict=True)]
        return [
            tuple(start + i for start, i in zip(starts, local, strict=True))
            for local in np.ndindex(*self.per_shard)
        ]


def _index_codecs(codecs: Any) -> bool:
    """Whether the index has a CRC-32C; other index encodings are refused."""
    names = [c.get("name") if isinstance(c, dict) else c for c in codecs or []]
    endian = [
        (c.get("configuration") or {}).get("endian", "little")
        for c in codecs or []
        if isinstance(c, dict) and c.get("name") == "bytes"
    ]
    if names not in (["bytes"], ["bytes", "crc32c"]) or endian != ["little"]:
        raise ArrayRefused(f"shard index codecs {codecs!r} are not decoded")
    return names == ["bytes", "crc32c"]


def shard_layout(
    configuration: dict[str, Any], shard_shape: list[int]
) -> tuple[ShardLayout, list[int], Any]:
    """The layout of shards of ``shard_shape``, the inner chunk shape and inner codecs."""
    inner = configuration.get("chunk_shape")
    if (
        not isinstance(inner, list)
        or len(inner) != len(shard_shape)
        or not all(isinstance(n, int) and n > 0 for n in inner)
        or any(s % n for s, n in zip(shard_shape, inner, strict=True))
    ):
        raise ArrayRefused(f"inner chunks {inner!r} do not divide shards {shard_shape!r}")
    location = configuration.get("index_location", "end")
    if location not in ("start", "end"):
        raise ArrayRefused(f"shard index_location {location!r}")
    per_shard = tuple(s // n for s, n in zip(shard_shape, inner, strict=True))
    if math.prod(per_shard) > 1 << 20:
        raise ArrayRefused(f"{math.prod(per_shard)} inner chunks per shard, over 2**20")
    checksummed = _index_codecs(configuration.get("index_codecs"))
    layout = ShardLayout(per_shard, location == "end", checksummed)
    return layout, inner, configuration.get("codecs")


@dataclass(frozen=True)
class Run:
    """Inner chunks lying back to back in a shard: their bytes ``[start, end)``, and per
    inner chunk (in the order of its bytes) its position, and its offset in the run's
    bytes and length."""

    start: int
    end: int
    spans: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class ShardDecoder:
    """Inner chunk ``position`` of a whole shard, decoded by ``inner`` (a
    :class:`refmount.decode.codecs.ChunkDecoding`)."""

    key: str
    inner: ChunkDecoder
    layout: ShardLayout
    position: int
    fill: bytes | None  # None: the fill value has no bytes of the dtype

    @property
    def size(self) -> int:
        return self.inner.size

    @property
    def error(self) -> str | None:
        return self.inner.error

    @property
    def max_raw_size(self) -> int:
        return self.layout.count * self.inner.max_raw_size + self.layout.index_size

    @property
    def job(self) -> tuple[str, dict[str, Any]] | None:
        """The inner chunk's job: its index is read in the daemon, its bytes decoded
        by the job (:meth:`refmount.decode.reads.DecodedReads`)."""
        return self.inner.job

    def index_range(self, shard_size: int) -> tuple[int, int]:
        """Where the index lies in a shard of ``shard_size`` bytes (``[start, end)``)."""
        size = self.layout.index_size
        if shard_size < size:
            raise DecodeError(f"a shard of {shard_size} bytes is shorter than its index")
        return (shard_size - size, shard_size) if self.layout.end else (0, size)

    def entries(self, index: Buffer) -> np.ndarray:
        """The index's ``(offset, length)`` rows, its size and CRC-32C checked."""
        view = memoryview(index).cast("B")
        entries = view[: self.layout.count * 16]
        if len(view) != self.layout.index_size:
            raise DecodeError(f"a shard index of {len(view)} bytes, not {self.layout.index_size}")
        if self.layout.checksummed:
            import google_crc32c

            stored = int.from_bytes(view[-4:], "little")
            if google_crc32c.value(bytes(entries)) != stored:
                raise DecodeError("the shard index's crc32c does not match")
        return np.frombuffer(entries, "<u8").reshape(-1, 2)

    def locate(self, index: Buffer, shard_size: int) -> tuple[int, int] | None:
        """``(offset, length)`` of the inner chunk in a shard of ``shard_size`` bytes,
        from its index (checked); ``None`` when the shard holds no such chunk."""
        offset, length = (int(n) for n in self.entries(index)[self.position])  # no wrapping
        if offset == _MISSING and length == _MISSING:
            return None
        if offset == _MISSING or length == _MISSING:
            raise DecodeError(f"a shard index entry ({offset}, {length}) missing one field")
        if offset + length > shard_size:
            raise DecodeError(f"an inner chunk at {offset}+{length} past the shard's end")
        if length > self.inner.max_raw_size:
            raise DecodeError(f"an inner chunk of {length} bytes, over {self.inner.max_raw_size}")
        return offset, length

    def run(self, index: Buffer, shard_size: int) -> Run | None:
        """This inner chunk's run: the shard's written inner chunks in the order of their
        bytes (zarr writes them in Morton order: neighbours), cut in runs of :data:`RUN`;
        ``None`` unless the run's chunks lie back to back within :data:`RUN_BYTES`.  One
        request, and one decoding job, for a reader going through the shard."""
        rows = np.frombuffer(memoryview(index).cast("B")[: self.layout.count * 16], "<u8")
        rows = rows.reshape(-1, 2)
        written = np.flatnonzero((rows[:, 0] != _MISSING) | (rows[:, 1] != _MISSING))
        ordered = written[np.argsort(rows[written, 0], kind="stable")]
        at = np.flatnonzero(ordered == self.position)
        if not len(at):
            return None
        first = int(at[0]) - int(at[0]) % RUN
        positions = ordered[first : first + RUN].tolist()
        members = rows[positions].tolist()  # Python integers: sums never wrap
        start = end = members[0][0]
        for offset, length in members:
            if offset != end or offset == _MISSING or length == _MISSING:
                return None  # a gap, an overlap, or a half-missing entry (refused by its read)
            if length > self.inner.max_raw_size:
                return None  # the one too long is refused by its own read
            end = offset + length
        if end - start > RUN_BYTES or end > shard_size:
            return None
        spans = tuple(
            (p, offset - start, length)
            for p, (offset, length) in zip(positions, members, strict=True)
        )
        return Run(start, end, spans)

    def first_run(self, index: Buffer, shard_size: int) -> Run | None:
        """The run of the inner chunk whose bytes come first in the shard (``None``: none
        written, or not back to back), the index checked."""
        rows = self.entries(index)
        written = np.flatnonzero((rows[:, 0] != _MISSING) | (rows[:, 1] != _MISSING))
        if not len(written):
            return None
        first = int(written[np.argmin(rows[written, 0])])
        return self.at(first).run(index, shard_size)

    def at(self, position: int) -> ShardDecoder:
        """The decoder of inner chunk ``position`` of the same shards."""
        key = _key(self.inner, self.layout, position)
        return ShardDecoder(key, self.inner, self.layout, position, self.fill)

    def inner_bytes(self, raw: Buffer) -> memoryview | None:
        """The inner chunk's encoded bytes in the whole shard ``raw``, its index checked;
        ``None`` when the shard holds no such chunk (it reads as the fill value)."""
        view = memoryview(raw).cast("B")
        start, end = self.index_range(len(view))
        found = self.locate(view[start:end], len(view))
        return None if found is None else view[found[0] : found[0] + found[1]]

    def filled(self) -> bytes:
        """The inner chunk of a shard that holds none: the fill value."""
        if self.fill is None:
            raise DecodeError("an inner chunk not written, and no fill value to serve")
        return self.fill

    def decode(self, raw: Buffer) -> bytes:
        inner = self.inner_bytes(raw)
        return self.filled() if inner is None else self.inner.decode(inner)


def shard_decoder(
    inner: ChunkDecoder, layout: ShardLayout, position: int, fill_value: Any
) -> ShardDecoder:
    """Inner chunk ``position``'s decoder; ``fill_value`` as the ``.zarray`` says it."""
    served = inner.served_dtype
    little = served.newbyteorder("<") if served.byteorder == ">" else served
    try:
        value = 0 if fill_value is None else fill_value
        fill: bytes | None = np.full(inner.chunks, value, dtype=little).tobytes()
    except (ValueError, TypeError, OverflowError):
        fill = None
    return ShardDecoder(_key(inner, layout, position), inner, layout, position, fill)


def _key(inner: ChunkDecoder, layout: ShardLayout, position: int) -> str:
    """The decoded chunk's key: the inner decoder's, its layout and place."""
    return hashlib.sha256(f"{inner.key}/{layout}/{position}".encode()).hexdigest()[:32]

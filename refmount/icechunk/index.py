"""One array's chunk references, held as a few compact columns sorted by chunk index.

Built from icechunk's columnar batches (``array_chunk_iterator``): no Python object per
chunk is kept.  A row is one chunk that exists; ``kinds`` says where its bytes are:
``NATIVE`` (an object ``chunks/<id>`` of the repository), ``VIRTUAL`` (a range of a URL)
or ``INLINE`` (bytes held in the manifest).  ``location`` indexes ``paths`` (chunk ids
and URLs, each distinct one once) for the first two and ``inline`` for the last.

The array's node id and manifest ids are kept with it, and :meth:`rows_of` finds rows by
chunk coordinates, so that the checksums of virtual chunks, read from the same manifest
files (:mod:`refmount.icechunk.manifest`), are joined in (:meth:`with_checksums`): a
small list of distinct checksums and an int32 column indexing it (-1: none).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from refmount.icechunk.manifest import INLINE, NATIVE, VIRTUAL, ManifestError
from refmount.refs.model import Checksum

#: One batch of ``array_chunk_iterator``: coordinates, kinds, paths, offsets, lengths,
#: and the inline bytes by row.
Batch = tuple[np.ndarray, np.ndarray, list[str], np.ndarray, np.ndarray, dict[int, bytes]]


@dataclass(frozen=True)
class ArrayIndex:
    node_id: str
    manifest_ids: tuple[str, ...]
    grid: tuple[int, ...]
    indices: np.ndarray  # int64, sorted, distinct: chunk indices in C order
    kinds: np.ndarray  # uint8
    location: np.ndarray  # int32: into paths, or into inline for INLINE rows
    offsets: np.ndarray  # uint64
    lengths: np.ndarray  # uint64
    paths: pa.Array  # string
    inline: pa.Array  # binary
    checksum: np.ndarray | None = None  # int32: into checksums, -1 for none
    checksums: tuple[Checksum, ...] = ()

    def __post_init__(self) -> None:
        # memoryviews: indexing one gives a Python int, indexing NumPy a NumPy scalar
        object.__setattr__(self, "_indices", memoryview(self.indices))
        object.__setattr__(self, "_lengths", memoryview(self.lengths))

    @classmethod
    def build(
        cls,
        batches: Iterable[Batch],
        grid: tuple[int, ...],
        *,
        node_id: str = "",
        manifest_ids: tuple[str, ...] = (),
    ) -> ArrayIndex:
        """The index of the chunks in ``batches`` (see :class:`IndexBuilder`)."""
        builder = IndexBuilder(grid)
        for batch in batches:
            builder.add(batch)
        return builder.finish(node_id=node_id, manifest_ids=manifest_ids)

    def with_checksums(
        self, parts: Iterable[tuple[np.ndarray, np.ndarray, list[Checksum]]]
    ) -> ArrayIndex:
        """This index with the checksums of its chunks: ``parts`` are, per manifest, the
        coordinates of its chunks (``[n, ndim]``), the index of each one's checksum in
        the list that follows (-1: none), and that list.  ManifestError when a manifest
        lists a chunk with a checksum that the index does not hold."""
        column = np.full(len(self), -1, np.int32)
        table: list[Checksum] = []
        for coords, which, checksums in parts:
            has = which >= 0
            rows = self.rows_of(coords[has]) if has.any() else np.zeros(0, np.int64)
            if (rows < 0).any():
                raise ManifestError("a manifest's checksums name chunks its references lack")
            column[rows] = which[has] + len(table)
            table.extend(checksums)
        return replace(self, checksum=column, checksums=tuple(table))

    def checksum_of(self, row: int) -> Checksum | None:
        if self.checksum is None or (which := int(self.checksum[row])) < 0:
            return None
        return self.checksums[which]

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def nbytes(self) -> int:
        columns = (self.indices, self.kinds, self.location, self.offsets, self.lengths)
        held = sum(c.nbytes for c in columns) + self.paths.nbytes + self.inline.nbytes
        return held + (self.checksum.nbytes if self.checksum is not None else 0)

    def row(self, index: int, hint: int = -1) -> int | None:
        """The row of chunk ``index``, or None when the manifest does not hold it.
        ``hint``: the row of the chunk asked before; a listing asks them in order, and
        the row after it is then the answer without a search."""
        held = self._indices  # type: ignore[attr-defined]
        if 0 <= hint < len(held) - 1 and held[hint + 1] == index:
            return hint + 1
        row = int(np.searchsorted(self.indices, index))
        return row if row < len(held) and held[row] == index else None

    def size(self, row: int) -> int:
        return self._lengths[row]  # type: ignore[attr-defined,no-any-return]

    def rows_of(self, coords: np.ndarray) -> np.ndarray:
        """The rows of chunks given by coordinates (``[n, ndim]``), -1 for chunks the
        index does not hold."""
        wanted = _linear(np.asarray(coords, np.int64), self.grid)
        rows = np.searchsorted(self.indices, wanted)
        found = rows < len(self.indices)
        found[found] = self.indices[rows[found]] == wanted[found]
        return np.where(found, rows, -1)

    def present(self, start: int, stop: int) -> np.ndarray:
        """The chunk indices in ``[start, stop)`` the manifest holds (int64)."""
        lo, hi = np.searchsorted(self.indices, [start, stop])
        return self.indices[lo:hi]

    def path(self, row: int) -> str:
        return self.paths[int(self.location[row])].as_py()

    def inline_bytes(self, row: int) -> bytes:
        return self.inline[int(self.location[row])].as_py()

    def kind_counts(self) -> dict[str, int]:
        counts = np.bincount(self.kinds, minlength=4)
        return {"native": int(counts[NATIVE]), "virtual": int(counts[VIRTUAL]),
                "inline": int(counts[INLINE])}  # fmt: skip


class IndexBuilder:
    """Builds an :class:`ArrayIndex` a batch at a time: each batch is turned into compact
    columns as it arrives (its paths dictionary-encoded), so that the Python strings of
    a million references never live all at once."""

    def __init__(self, grid: tuple[int, ...]) -> None:
        self.grid = grid
        self._indices: list[np.ndarray] = []
        self._kinds: list[np.ndarray] = []
        self._location: list[np.ndarray] = []
        self._offsets: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []
        self._dictionaries: list[pa.Array] = []
        self._inline: list[bytes] = []
        self._paths = 0

    def add(self, batch: Batch) -> None:
        """ManifestError for coordinates outside the grid, an unknown kind, or inline
        bytes that do not match the inline chunks."""
        coords, kinds, paths, offsets, lengths, inlined = batch
        count = len(kinds)
        if np.shape(coords) != (count, len(self.grid)) or len(paths) != count:
            raise ManifestError(f"a batch of {count} references is malformed")
        kind = np.asarray(kinds, np.uint8)
        if not np.isin(kind, (NATIVE, VIRTUAL, INLINE)).all():
            raise ManifestError(f"unknown chunk kind(s) {sorted(set(kind.tolist()) - {1, 2, 3})}")
        encoded = pc.dictionary_encode(pa.array(paths, pa.string()))
        location = np.asarray(encoded.indices, np.int32) + np.int32(self._paths)
        self._paths += len(encoded.dictionary)
        self._dictionaries.append(encoded.dictionary)
        inline_rows = np.fromiter(inlined.keys(), np.int64, len(inlined))
        if (kind[inline_rows] != INLINE).any() or (kind == INLINE).sum() != len(inline_rows):
            raise ManifestError("inline bytes do not match the inline chunks")
        location[inline_rows] = np.arange(len(inline_rows), dtype=np.int32) + len(self._inline)
        self._inline.extend(inlined.values())
        self._indices.append(_linear(np.asarray(coords, np.int64), self.grid))
        self._kinds.append(kind)
        self._location.append(location)
        self._offsets.append(np.asarray(offsets, np.uint64))
        self._lengths.append(np.asarray(lengths, np.uint64))

    def finish(self, *, node_id: str = "", manifest_ids: tuple[str, ...] = ()) -> ArrayIndex:
        """The index, sorted by chunk index; ManifestError for a chunk listed twice."""

        def joined(parts: list[np.ndarray], dtype: type) -> np.ndarray:
            return np.concatenate(parts) if parts else np.zeros(0, dtype)

        indices = joined(self._indices, np.int64)
        order = np.argsort(indices, kind="stable")
        indices = indices[order]
        if len(indices) > 1 and (np.diff(indices) == 0).any():
            raise ManifestError("a chunk is listed twice")
        paths = (
            pa.concat_arrays(self._dictionaries)
            if self._dictionaries
            else pa.array([], pa.string())
        )
        return ArrayIndex(
            node_id=node_id,
            manifest_ids=manifest_ids,
            grid=self.grid,
            indices=indices,
            kinds=joined(self._kinds, np.uint8)[order],
            location=joined(self._location, np.int32)[order],
            offsets=joined(self._offsets, np.uint64)[order],
            lengths=joined(self._lengths, np.uint64)[order],
            paths=paths,
            inline=pa.array(self._inline, pa.binary()),
        )


def _linear(coords: np.ndarray, grid: tuple[int, ...]) -> np.ndarray:
    """C-order indices of chunk coordinates; ManifestError for one outside the grid."""
    if not len(grid):
        if len(coords) > 1:
            raise ManifestError("a rank-0 array with more than one chunk")
        return np.zeros(len(coords), np.int64)
    bounds = np.asarray(grid, np.int64)
    if len(coords) and ((coords < 0) | (coords >= bounds)).any():
        bad = coords[((coords < 0) | (coords >= bounds)).any(axis=1)][0].tolist()
        raise ManifestError(f"chunk {bad} lies outside the grid {list(grid)}")
    strides = np.array([int(np.prod(grid[d + 1 :])) for d in range(len(grid))], np.int64)
    return coords @ strides if len(coords) else np.zeros(0, np.int64)

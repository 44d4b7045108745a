"""One array's chunk references, held as a few compact columns sorted by chunk index.

Built from the array's references in its manifest files, as
:mod:`refmount.icechunk.manifest` reads them (:meth:`ArrayIndex.from_manifests`): no
Python object per chunk is kept.  A row is one chunk that exists; ``kinds`` says where
its bytes are: ``NATIVE`` (an object ``chunks/<id>`` of the repository), ``VIRTUAL`` (a
range of a URL) or ``INLINE`` (bytes held in the manifest).  ``location`` indexes
``paths`` (chunk ids and URLs) for the first two and ``inline`` for the last.  The
checksums of virtual chunks come with them: a small list of distinct checksums and an
int32 column indexing it (-1: none).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from refmount.icechunk.manifest import (
    INLINE,
    NATIVE,
    VIRTUAL,
    ArrayRefs,
    ManifestError,
    arrow_array,
)
from refmount.refs import arrays
from refmount.refs.model import Checksum

#: One manifest's part of an array: its references, the manifest's distinct checksums
#: (what ``ArrayRefs.checksums`` indexes), and the extents the snapshot gives the
#: manifest for the array (``[start, stop)`` per dimension): references outside them are
#: not the array's.
Part = tuple[ArrayRefs, list[Checksum], tuple[tuple[int, int], ...]]


@dataclass(frozen=True)
class ArrayIndex:
    grid: tuple[int, ...]
    indices: np.ndarray  # int64, sorted, distinct: chunk indices in C order
    kinds: np.ndarray  # uint8
    location: np.ndarray  # int32: into paths, or into inline for INLINE rows
    offsets: np.ndarray  # uint64
    lengths: np.ndarray  # uint64
    paths: pa.Array  # string
    inline: pa.Array  # binary
    checksum: np.ndarray  # int32: into checksums, -1 for none
    checksums: tuple[Checksum, ...]

    def __post_init__(self) -> None:
        # memoryviews: indexing one gives a Python int, indexing NumPy a NumPy scalar
        object.__setattr__(self, "_indices", memoryview(self.indices))
        object.__setattr__(self, "_lengths", memoryview(self.lengths))

    @classmethod
    def from_manifests(cls, parts: Iterable[Part], grid: tuple[int, ...]) -> ArrayIndex:
        """The index of an array's references in its manifests; ManifestError for a
        chunk outside the grid or listed twice."""
        columns: dict[str, list[np.ndarray]] = {
            name: [] for name in ("indices", "kinds", "location", "offsets", "lengths", "checksum")
        }
        targets: list[pa.Array] = []
        inline: list[bytes] = []
        checksums: list[Checksum] = []
        held = 0
        for refs, table, extents in parts:
            keep = _within(refs.coords, extents)
            location = refs.location[keep]
            is_inline = refs.kinds[keep] == INLINE
            location += np.where(is_inline, len(inline), held).astype(np.int32)
            which = refs.checksums[keep]
            columns["indices"].append(_linear(refs.coords[keep].astype(np.int64), grid))
            columns["kinds"].append(refs.kinds[keep])
            columns["location"].append(location)
            columns["offsets"].append(refs.offsets[keep])
            columns["lengths"].append(refs.lengths[keep])
            columns["checksum"].append(np.where(which >= 0, which + len(checksums), -1))
            targets.append(refs.targets)
            held += len(refs.targets)
            inline.extend(refs.inline)
            checksums.extend(table)
        dtypes = {"indices": np.int64, "kinds": np.uint8, "location": np.int32,
                  "offsets": np.uint64, "lengths": np.uint64, "checksum": np.int32}  # fmt: skip
        joined = {
            name: np.concatenate(parts).astype(dtypes[name], copy=False)
            if parts
            else np.zeros(0, dtypes[name])
            for name, parts in columns.items()
        }
        if not (np.diff(joined["indices"]) > 0).all():  # sorted when one manifest holds all
            order = np.argsort(joined["indices"], kind="stable")
            joined = {name: column[order] for name, column in joined.items()}
            if (np.diff(joined["indices"]) == 0).any():
                raise ManifestError("a chunk is listed twice")
        pool = arrays.POOL  # glibc's heap: what a load frees goes back (malloc_trim)
        paths = (
            pa.concat_arrays(targets, memory_pool=pool) if targets else arrow_array([], pa.string())
        )
        return cls(
            grid=grid,
            paths=paths,
            inline=arrow_array(inline, pa.binary()),
            checksums=tuple(checksums),
            **joined,
        )

    def checksum_of(self, row: int) -> Checksum | None:
        if (which := int(self.checksum[row])) < 0:
            return None
        return self.checksums[which]

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def nbytes(self) -> int:
        columns = (self.indices, self.kinds, self.location, self.offsets, self.lengths,
                   self.checksum)  # fmt: skip
        return sum(c.nbytes for c in columns) + self.paths.nbytes + self.inline.nbytes

    def row(self, index: int) -> int | None:
        """The row of chunk ``index``, or None when the manifest does not hold it."""
        held = self._indices  # type: ignore[attr-defined]
        row = int(np.searchsorted(self.indices, index))
        return row if row < len(held) and held[row] == index else None

    def size(self, row: int) -> int:
        return self._lengths[row]  # type: ignore[attr-defined,no-any-return]

    def present(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """The chunk indices in ``[start, stop)`` the manifest holds (int64), and their
        sizes (uint64)."""
        lo, hi = np.searchsorted(self.indices, [start, stop])
        return self.indices[lo:hi], self.lengths[lo:hi]

    def path(self, row: int) -> str:
        return self.paths[int(self.location[row])].as_py()

    def inline_bytes(self, row: int) -> bytes:
        return self.inline[int(self.location[row])].as_py()

    def kind_counts(self) -> dict[str, int]:
        counts = np.bincount(self.kinds, minlength=4)
        return {"native": int(counts[NATIVE]), "virtual": int(counts[VIRTUAL]),
                "inline": int(counts[INLINE])}  # fmt: skip


def covered_grid(parts: Iterable[Part], rank: int) -> tuple[int, ...]:
    """The chunks along each dimension that the references of ``parts`` cover (each
    part's inside its extents): the grid of an array whose own refmount cannot read
    and whose manifests give no extents of its rank.  ManifestError for coordinates of
    another rank."""
    grid = np.zeros(rank, np.int64)
    for refs, _, extents in parts:
        coords = refs.coords[_within(refs.coords, extents)]
        if not len(coords):
            continue
        if coords.ndim != 2 or coords.shape[1] != rank:
            raise ManifestError(f"chunk coordinates of {coords.shape[-1]} dimensions in an "
                                f"array of {rank}")  # fmt: skip
        grid = np.maximum(grid, coords.max(axis=0).astype(np.int64) + 1)
    return tuple(grid.tolist())


def _within(coords: np.ndarray, extents: tuple[tuple[int, int], ...]) -> np.ndarray:
    """The rows whose coordinates lie inside ``extents`` (all rows without extents)."""
    keep = np.ones(len(coords), dtype=bool)
    if coords.ndim == 2 and len(extents) == coords.shape[1]:
        for dim, (start, stop) in enumerate(extents):
            keep &= (coords[:, dim] >= start) & (coords[:, dim] < stop)
    return keep


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

"""Chunk keys, chunk indices and file ids of a Parquet set's arrays: pure arithmetic.

Chunk keys are canonical: each index is ASCII decimal without sign or leading zeros
(``0``, ``12``; not ``00``, ``-0``, ``+1``), one index per dimension, inside the chunk
grid ``ceil(shape / chunks)``; a scalar array has the one chunk ``0``.  Anything else is
not a chunk key (fsspec does not check: its ``x/1`` silently reads ``x/0.1``).

File ids: each array (sorted by name) owns the block ``base + chunk index`` (C order),
after the ``base`` ids the metadata files take.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from refmount.errors import RefsError
from refmount.refs.parquet.layout import MAX_FILE_IDS, ArrayLayout

if TYPE_CHECKING:  # numpy is imported with the first record
    import numpy as np

_INDEX_RE = re.compile(r"0|[1-9][0-9]{0,19}")


@dataclass(frozen=True, slots=True)
class ChunkGrid:
    """One zarr array: its chunk grid and where its file ids and record files are."""

    name: str  # "" for an array at the root
    index: int  # position in ChunkGrids.arrays
    grid: tuple[int, ...]  # chunks per dimension; (1,) for a scalar
    strides: tuple[int, ...]  # C-order strides over the grid
    nchunks: int
    nested: bool  # dimension_separator "/"
    base: int  # file id of chunk 0
    meta_count: int  # metadata entries listed before the chunks in its directory
    record_dir: str  # ROOT or ROOT/name

    @property
    def prefix(self) -> str:
        return f"{self.name}/" if self.name else ""

    @property
    def ndim(self) -> int:
        """Number of indices in a chunk key."""
        return len(self.grid)

    def ravel(self, parts: list[str]) -> int | None:
        """The chunk index of canonical index strings, or None when not a chunk."""
        if len(parts) != len(self.grid):
            return None
        index = 0
        for part, size, stride in zip(parts, self.grid, self.strides, strict=True):
            if not _INDEX_RE.fullmatch(part):
                return None
            i = int(part)
            if i >= size:
                return None
            index += i * stride
        return index

    def unravel(self, index: int) -> list[int]:
        out = []
        for stride in self.strides:
            i, index = divmod(index, stride)
            out.append(i)
        return out

    def chunk_name(self, index: int) -> str:
        """The key of a chunk, relative to the array directory."""
        return ("/" if self.nested else ".").join(map(str, self.unravel(index)))

    def chunk_names(self, indices: np.ndarray) -> list[str]:
        """:meth:`chunk_name` of many indices (int64: file ids stay below 2**48)."""
        import numpy as np  # loaded with the record the indices come from

        columns = [list(map(str, c.tolist())) for c in np.unravel_index(indices, self.grid)]
        return list(map(("/" if self.nested else ".").join, zip(*columns, strict=True)))

    def index_dir_start(self, indices: list[int]) -> int:
        """The chunk index of the first chunk below a nested index directory."""
        return sum(i * s for i, s in zip(indices, self.strides, strict=False))


class ChunkGrids:
    """Every array of a set: keys to chunk indices, file ids to chunks, and back."""

    def __init__(
        self,
        arrays: Mapping[str, ArrayLayout],
        *,
        base: int,
        meta_counts: Mapping[str, int],
        root: str,
    ) -> None:
        self.arrays: list[ChunkGrid] = []
        for name in sorted(arrays):
            layout = arrays[name]
            grid = layout.grid
            nchunks = math.prod(grid)
            if base + nchunks > MAX_FILE_IDS:
                raise RefsError(f"key {name + '/.zarray'!r}: too many chunks ({nchunks})")
            self.arrays.append(
                ChunkGrid(
                    name=name,
                    index=len(self.arrays),
                    grid=grid,
                    strides=tuple(math.prod(grid[i + 1 :]) for i in range(len(grid))),
                    nchunks=nchunks,
                    nested=layout.nested,
                    base=base,
                    meta_count=meta_counts.get(name, 0),
                    record_dir=f"{root}/{name}" if name else root,
                )
            )
            base += nchunks
        self._bases = [a.base for a in self.arrays]
        self.by_name = {a.name: a for a in self.arrays}
        self._max_nested_ndim = max((a.ndim for a in self.arrays if a.nested), default=0)

    def parse_chunk(self, key: str) -> tuple[ChunkGrid, int] | None:
        """The array and chunk index of a chunk key (no record is consulted)."""
        parent, _, leaf = key.rpartition("/")
        arr = self.by_name.get(parent)
        if arr is not None and not arr.nested:
            index = arr.ravel(leaf.split("."))
            return None if index is None else (arr, index)
        if self._max_nested_ndim:
            parts = key.split("/")
            for n in range(1, min(len(parts), self._max_nested_ndim) + 1):
                arr = self.by_name.get("/".join(parts[:-n]))
                if arr is not None and arr.nested and arr.ndim == n:
                    index = arr.ravel(parts[-n:])
                    return None if index is None else (arr, index)
        return None

    def index_dir(self, path: str) -> tuple[ChunkGrid, list[int]] | None:
        """A nested array's index directory: the array and the indices in ``path``."""
        parts = path.split("/")
        for n in range(1, min(len(parts), self._max_nested_ndim - 1) + 1):
            arr = self.by_name.get("/".join(parts[:-n]))
            if arr is None or not arr.nested or n >= arr.ndim or arr.nchunks == 0:
                continue
            indices = []
            for part, size in zip(parts[-n:], arr.grid, strict=False):
                if not _INDEX_RE.fullmatch(part) or int(part) >= size:
                    return None
                indices.append(int(part))
            return arr, indices
        return None

    def chunk_of(self, file_id: int) -> tuple[ChunkGrid, int]:
        """The array and chunk index of a chunk's file id (KeyError when none)."""
        pos = bisect.bisect_right(self._bases, file_id) - 1
        if file_id < 0 or pos < 0:
            raise KeyError(f"unknown file id {file_id}")
        arr = self.arrays[pos]
        index = file_id - arr.base
        if index >= arr.nchunks:
            raise KeyError(f"unknown file id {file_id}")
        return arr, index

    def listing_range(self, path: str, after: int) -> tuple[ChunkGrid, int, int] | None:
        """The array and chunk index range ``[start, stop)`` whose chunks a listing of
        directory ``path`` after cursor ``after`` shows; None when it shows no chunks."""
        arr = self.by_name.get(path)
        if arr is not None:
            if arr.nested and arr.ndim > 1:
                return None
            return arr, max(after + 1 - arr.meta_count, 0), arr.nchunks
        found = self.index_dir(path)
        if found is None:
            return None
        arr, indices = found
        if len(indices) < arr.ndim - 1:
            return None
        lo = arr.index_dir_start(indices)
        return arr, lo + max(after + 1, 0), lo + arr.grid[-1]

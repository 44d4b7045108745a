"""Chunk keys of one array, by its ``chunk_key_encoding``, and the directories they imply.

Zarr v3's ``default`` encoding writes chunk ``(1, 2)`` as ``c/1/2`` (``/`` separator) or
``c.1.2`` (``.``); the ``v2`` encoding as ``1.2`` or ``1/2``; a rank-0 array's one chunk
is ``c`` (``default``) or ``0`` (``v2``).  With ``/`` the keys nest: every index directory
of the grid exists (as in a Parquet set), and the chunk files of the last level exist
when the manifest holds them.  A chunk's *index* is its position in the grid in C order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np


class ChunkKeys:
    """The chunk keys of one array, relative to the array's directory."""

    def __init__(self, grid: tuple[int, ...], *, v2: bool = False, separator: str = "/") -> None:
        if separator not in ("/", "."):
            raise ValueError(f"chunk key separator {separator!r} is neither '/' nor '.'")
        self.grid = grid
        self.ndim = len(grid)
        self.count = math.prod(grid)
        self.separator = separator
        self.v2 = v2
        #: keys nest in directories (a rank-0 array's one key never does)
        self.nested = separator == "/" and self.ndim > 0
        #: the directory (relative to the array) where the chunk keys start: ``c`` for
        #: nested ``default`` keys, else the array's own directory
        self.top = "c" if self.nested and not v2 else ""
        self._strides = [math.prod(grid[d + 1 :]) for d in range(self.ndim)]

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], grid: tuple[int, ...]) -> ChunkKeys:
        """From a Zarr v3 array's ``zarr.json`` (``chunk_key_encoding``)."""
        encoding = metadata.get("chunk_key_encoding") or {"name": "default"}
        name = encoding.get("name") if isinstance(encoding, Mapping) else encoding
        configuration = encoding.get("configuration") if isinstance(encoding, Mapping) else None
        configuration = configuration if isinstance(configuration, Mapping) else {}
        if name not in ("default", "v2"):
            raise ValueError(f"unknown chunk_key_encoding {name!r}")
        separator = configuration.get("separator", "/" if name == "default" else ".")
        return cls(grid, v2=name == "v2", separator=separator)

    # --- one chunk ----------------------------------------------------------------------

    def coordinates(self, index: int) -> list[int]:
        coords = []
        for stride in self._strides:
            coord, index = divmod(index, stride)
            coords.append(coord)
        return coords

    def name(self, index: int) -> str:
        """The key of chunk ``index``, relative to the array."""
        parts = [str(c) for c in self.coordinates(index)]
        if self.v2:
            return self.separator.join(parts) if parts else "0"
        return "c" + "".join(self.separator + part for part in parts)

    def parse(self, relative: str) -> int | None:
        """The index of the chunk whose key is ``relative``, or None when it is not one
        (not canonical, outside the grid)."""
        if self.ndim == 0:
            return 0 if relative == ("0" if self.v2 else "c") else None
        if not self.v2:
            head, _, relative = relative.partition(self.separator)
            if head != "c":
                return None
        coords = _numbers(relative.split(self.separator))
        return None if coords is None else self._index(coords)

    def _index(self, coords: list[int]) -> int | None:
        if len(coords) != self.ndim or any(c >= n for c, n in zip(coords, self.grid, strict=True)):
            return None
        return sum(c * s for c, s in zip(coords, self._strides, strict=True))

    # --- directories --------------------------------------------------------------------

    def directory(self, relative: str) -> tuple[int, ...] | None:
        """The leading coordinates fixed by a directory of the chunk keys (``()`` for the
        top one), or None when ``relative`` is not one."""
        if not self.nested or not self.count:
            return () if relative == "" and not self.top else None
        if relative == self.top:
            return ()
        prefix = self.top + "/" if self.top else ""
        if not relative.startswith(prefix):
            return None
        coords = _numbers(relative[len(prefix) :].split("/"))
        if coords is None or len(coords) > self.ndim - 1:
            return None
        if any(c >= n for c, n in zip(coords, self.grid, strict=False)):
            return None
        return tuple(coords)

    def file_range(self, fixed: tuple[int, ...]) -> tuple[int, int] | None:
        """The chunk indices a directory with ``fixed`` leading coordinates lists as files
        (all its chunks, or only the last level's), or None when it lists directories."""
        if not self.nested:
            return 0, self.count
        if len(fixed) < self.ndim - 1:
            return None
        start = sum(c * s for c, s in zip(fixed, self._strides, strict=False))
        return start, start + self.grid[-1]

    def file_names(self, indices: np.ndarray, fixed: tuple[int, ...]) -> list[str]:
        """The names, within their directory, of chunk files ``indices`` (int64)."""
        if self.nested:
            start = self.file_range(fixed)
            assert start is not None
            return list(map(str, (indices - start[0]).tolist()))
        return [self.name(i) for i in indices.tolist()]


def _numbers(parts: list[str]) -> list[int] | None:
    """Canonical non-negative decimal numbers (``0``, ``12``; not ``012``, ``+1``, ``""``)."""
    numbers = []
    for part in parts:
        if not part.isdigit() or not part.isascii() or (len(part) > 1 and part[0] == "0"):
            return None
        numbers.append(int(part))
    return numbers

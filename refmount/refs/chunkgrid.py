"""Zarr v3 chunk grids: how many chunks an array has along each dimension, and whether
the grid can be said as a regular one.

``regular`` gives one ``chunk_shape``.  ``rectilinear`` (zarr-extensions; zarr-python 3.2+
writes it, icechunk 2 stores it) gives per dimension either a bare integer (a regular
step) or a list of edge lengths, each an integer or a run ``[length, count]``; the edges
may run past the array's extent.  Chunk keys are the same for both: a chunk's index along
each dimension.

A hostile run count cannot make this expand a list: counts are summed, never repeated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: The largest chunk count per dimension a grid may claim.
MAX_CHUNKS = 1 << 40


class GridError(ValueError):
    """A chunk grid that is not one refmount reads; the message says why."""


def _size(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 1 << 62:
        raise GridError(f"{what} {value!r} is not a positive integer")
    return value


def _runs(spec: Any, axis: int) -> list[tuple[int, int]]:
    """A rectilinear dimension as ``(edge length, count)`` runs; a bare integer is
    ``(step, None)``-like: one run of unbounded count, given as count 0."""
    if not isinstance(spec, list):
        return [(_size(spec, f"dimension {axis}'s step"), 0)]
    if not spec:
        raise GridError(f"dimension {axis} has no chunk edges")
    runs = []
    for item in spec:
        if isinstance(item, list):
            if len(item) != 2:
                raise GridError(f"dimension {axis}: run {item!r} is not [length, count]")
            runs.append((_size(item[0], "edge length"), _size(item[1], "run count")))
        else:
            runs.append((_size(item, "edge length"), 1))
    return runs


def _count(runs: list[tuple[int, int]], extent: int, axis: int) -> int:
    """How many chunks of ``runs`` start inside ``extent``; the edges must cover it."""
    if runs[0][1] == 0:
        return math.ceil(extent / runs[0][0])
    count, covered = 0, 0
    for length, repeat in runs:
        if covered >= extent:
            break
        taken = min(repeat, math.ceil((extent - covered) / length))
        count += taken
        covered += taken * length
    if covered < extent:
        raise GridError(f"dimension {axis}'s chunk edges cover {covered} of {extent}")
    return count


def _grid_runs(spec: Any, rank: int) -> list[list[tuple[int, int]]]:
    if not isinstance(spec, Mapping):
        raise GridError(f"chunk grid {spec!r} is not a named grid")
    name = spec.get("name")
    configuration = spec.get("configuration")
    if not isinstance(configuration, Mapping):
        raise GridError(f"chunk grid {name!r} has no configuration")
    if name == "regular":
        shape = configuration.get("chunk_shape")
        dims = shape if isinstance(shape, list) else None
        runs = None if dims is None else [[(_size(n, "chunk size"), 0)] for n in dims]
    elif name == "rectilinear":
        if configuration.get("kind", "inline") != "inline":
            raise GridError(f"rectilinear grid of kind {configuration.get('kind')!r}")
        shapes = configuration.get("chunk_shapes")
        dims = shapes if isinstance(shapes, list) else None
        runs = None if dims is None else [_runs(d, axis) for axis, d in enumerate(dims)]
    else:
        raise GridError(f"chunk grid {name!r} is neither regular nor rectilinear")
    if runs is None or len(runs) != rank:
        raise GridError(f"chunk grid {name!r} does not have {rank} dimensions")
    return runs


def chunk_counts(spec: Any, shape: list[int]) -> tuple[int, ...]:
    """Chunks along each dimension of an array of ``shape`` with chunk grid ``spec``."""
    runs = _grid_runs(spec, len(shape))
    counts = tuple(_count(r, s, axis) for axis, (r, s) in enumerate(zip(runs, shape, strict=True)))
    if any(n > MAX_CHUNKS for n in counts):
        raise GridError(f"{counts} chunks per dimension, over {MAX_CHUNKS}")
    return counts


def regular_shape(spec: Any, shape: list[int]) -> list[int] | None:
    """The one chunk shape that names the same chunks, with the same stored shapes, as
    ``spec`` over ``shape``, or ``None`` (an irregular grid).  A rectilinear grid's
    chunks are stored at their own edge lengths (a regular grid pads its last chunk), so
    only a grid whose every chunk starting inside the extent has the first one's edges is
    regular."""
    runs = _grid_runs(spec, len(shape))
    out = []
    for axis, (dimension, extent) in enumerate(zip(runs, shape, strict=True)):
        _count(dimension, extent, axis)  # the edges cover the extent
        first, covered = dimension[0][0], 0
        for length, repeat in dimension:
            if covered >= extent or repeat == 0:
                break
            if length != first:
                return None
            covered += length * repeat
        out.append(first)
    return out

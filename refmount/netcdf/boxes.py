"""A run of elements in C order as hyper-rectangles, and the chunks each one covers.

A read of a netCDF variable's bytes is a run of consecutive elements (C order).  Such a
run is at most ``2 * rank - 1`` boxes: the rest of a partial first row, whole rows, the
start of a partial last row, recursively; their elements in C order, box after box, are
the run's.  So a read never assembles more elements than it returns.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (start, stop) per dimension


def boxes(shape: tuple[int, ...], first: int, last: int) -> list[Box]:
    """The boxes of elements ``first`` to ``last`` (excluded) of an array of ``shape``."""
    if first >= last:
        return []
    if not shape:
        return [((), ())]
    inner = math.prod(shape[1:])
    row0, rest0 = divmod(first, inner)
    row1, rest1 = divmod(last, inner)
    out: list[Box] = []

    def rows(row: int, start: int, stop: int) -> None:
        for a, b in boxes(shape[1:], start, stop):
            out.append(((row, *a), (row + 1, *b)))

    if row0 == row1:
        rows(row0, rest0, rest1)
        return out
    if rest0:
        rows(row0, rest0, inner)
        row0 += 1
    if row1 > row0:
        out.append(((row0, *[0] * (len(shape) - 1)), (row1, *shape[1:])))
    if rest1:
        rows(row1, 0, rest1)
    return out


def chunk_indices(box: Box, chunks: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """The chunks a box covers, in C order."""
    ranges = [
        range(a // c, (b - 1) // c + 1) for a, b, c in zip(box[0], box[1], chunks, strict=True)
    ]
    return itertools.product(*ranges)


def overlap(
    box: Box, index: tuple[int, ...], chunks: tuple[int, ...]
) -> tuple[tuple[slice, ...], tuple[slice, ...]]:
    """``(in the box, in the chunk)``: where a chunk's part of a box goes, and comes from."""
    into, out_of = [], []
    for a, b, i, c in zip(box[0], box[1], index, chunks, strict=True):
        low, high = max(a, i * c), min(b, (i + 1) * c)
        into.append(slice(low - a, high - a))
        out_of.append(slice(low - i * c, high - i * c))
    return tuple(into), tuple(out_of)

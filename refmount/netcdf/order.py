"""The order of a file's variables: as CF writers lay them out, not the view's listing.

A reference set keeps no variable order (kerchunk lists arrays by name), and readers
depend on it: CDO describes a horizontal grid once, from the first variable that has
it, and takes that variable's grid mapping for every variable on the grid.  In name
order a grid's first variable is often one without ``grid_mapping`` (``cont`` before
``temp``), and CDO then loses the projection (``crs``) of the whole file, where it reads
it from the original file, whose writer defined coordinates and the mapped variables
first.  So a group's arrays come in this order, each class in the listing's order:

1. coordinate variables (one dimension, named as their array), in the order their
   dimensions first appear in the other arrays' dimensions, those of most dimensions
   first (``air(time, lat, lon)``: ``time``, ``lat``, ``lon``, as writers define them
   before the variable), then the rest;
2. grid mappings: the variables another names in its ``grid_mapping`` attribute
   (``"crs"``, or CF's extended form ``"crs: x y other: lat lon"``);
3. variables with a ``grid_mapping`` attribute;
4. the others.
"""

from __future__ import annotations

from typing import Any, TypeVar

from refmount.decode.scalars import DIMENSIONS_ATTRIBUTE

T = TypeVar("T")
GRID_MAPPING = "grid_mapping"


def cf_order(arrays: list[tuple[str, T, dict[str, Any]]]) -> list[tuple[str, T, dict[str, Any]]]:
    """``arrays`` (path, array, ``.zattrs``) in the order above."""
    mappings = {name for _, _, document in arrays for name in mapping_names(document)}
    first_use: dict[str, int] = {}
    used = [
        dimensions
        for path, _, document in arrays
        if isinstance(dimensions := document.get(DIMENSIONS_ATTRIBUTE), list)
        and not _is_coordinate(path, document)
    ]
    for dimensions in sorted(used, key=len, reverse=True):
        for dimension in dimensions:
            first_use.setdefault(str(dimension), len(first_use))

    def rank(item: tuple[str, T, dict[str, Any]]) -> tuple[int, int]:
        path, _, document = item
        name = path.rpartition("/")[2]
        if _is_coordinate(path, document):
            return 0, first_use.get(name, len(first_use))
        if name in mappings:
            return 1, 0
        return (2 if mapping_names(document) else 3), 0

    return sorted(arrays, key=rank)


def _is_coordinate(path: str, document: dict[str, Any]) -> bool:
    """Whether an array is a coordinate variable: one dimension, named as the array."""
    return document.get(DIMENSIONS_ATTRIBUTE) == [path.rpartition("/")[2]]


def mapping_names(document: dict[str, Any]) -> list[str]:
    """The grid mapping variables an array's ``grid_mapping`` names."""
    value = document.get(GRID_MAPPING)
    if not isinstance(value, str):
        return []
    words = value.split()
    named = [word[:-1] for word in words if word.endswith(":")]
    return named or words

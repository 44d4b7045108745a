"""The order of a file's variables: as CF writers lay them out, not the view's listing.

A reference set keeps no variable order (kerchunk lists arrays by name), and readers
depend on it: CDO describes a horizontal grid once, from the first variable that has
it, and takes that variable's grid mapping for every variable on the grid.  In name
order a grid's first variable is often one without ``grid_mapping`` (``cont`` before
``temp``), and CDO then loses the projection (``crs``) of the whole file, where it reads
it from the original file, whose writer defined coordinates and the mapped variables
first.  So a group's arrays come in this order, each class in the listing's order:

1. coordinate variables (one dimension, named as their array);
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

    def rank(item: tuple[str, T, dict[str, Any]]) -> int:
        path, _, document = item
        name = path.rpartition("/")[2]
        if document.get(DIMENSIONS_ATTRIBUTE) == [name]:
            return 0
        if name in mappings:
            return 1
        return 2 if mapping_names(document) else 3

    return sorted(arrays, key=rank)


def mapping_names(document: dict[str, Any]) -> list[str]:
    """The grid mapping variables an array's ``grid_mapping`` names."""
    value = document.get(GRID_MAPPING)
    if not isinstance(value, str):
        return []
    words = value.split()
    named = [word[:-1] for word in words if word.endswith(":")]
    return named or words

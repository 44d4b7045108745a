"""Rank-0 (scalar) arrays as the decoded view presents them: one-element arrays along a
dimension named ``_scalar_``.

Why: Debian's netCDF-C 4.9.0 (``ncdump``) dies (SIGSEGV) reading a rank-0 Zarr array's
data, and GDAL's raster API refuses rank 0 (``Unsupported number of dimensions``).
netCDF-C itself writes a scalar variable to pure Zarr as shape ``[1]``, chunks ``[1]``
along a dimension ``_scalar_``, and reads that back.  The one chunk's key is ``0`` and
its bytes are the one value either way, so only the metadata changes: the ``.zarray``'s
shape and chunks, and the ``.zattrs``'s ``_ARRAY_DIMENSIONS`` (the attributes are made
when the set has none for the array).
"""

from __future__ import annotations

from typing import Any

#: The dimension netCDF-C names a scalar variable's one element by in pure Zarr.
SCALAR_DIMENSION = "_scalar_"
DIMENSIONS_ATTRIBUTE = "_ARRAY_DIMENSIONS"


def as_one_element(meta: dict[str, Any]) -> dict[str, Any]:
    """A rank-0 array's ``.zarray`` fields as a one-element array's."""
    return {**meta, "shape": [1], "chunks": [1]}


def scalar_attributes(document: Any) -> Any:
    """A rank-0 array's ``.zattrs`` with its one dimension named; a document that is not
    a JSON object is left as it is (readers refuse it alike in either view)."""
    if not isinstance(document, dict):
        return document
    return {**document, DIMENSIONS_ATTRIBUTE: [SCALAR_DIMENSION]}

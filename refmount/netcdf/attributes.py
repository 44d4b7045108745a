"""A variable's attributes in the types its readers need.

A set's ``.zattrs`` is JSON, which has numbers, not types: a ``float`` attribute and a
``double`` one look alike, and ``-32767`` says nothing of ``short``.  Readers decide by
those types: CF-aware readers (xarray, CDO, netCDF4-python) unpack to the type of
``scale_factor``/``add_offset``, and netCDF-C refuses a ``_FillValue`` not in its
variable's type.  So, following CF:

- ``_FillValue``, ``missing_value``, ``valid_min``, ``valid_max`` and ``valid_range``
  are written in the variable's (packed) type, each value converted exactly (an
  unsigned variable's in the wider type it is written in); a value the
  type does not hold is written as any other attribute (logged; a ``_FillValue`` is left
  out: netCDF-C would refuse the file).  A ``_FillValue`` may be spelled ``"NaN"``,
  ``"Infinity"``, ``"-Infinity"``, or, as xarray writes floats' into Zarr v2 attributes,
  base64 of a little-endian double;
- ``scale_factor`` and ``add_offset`` are written in the unpacked type, float or double,
  the same for both: a float variable's when they are floats' values, a double
  variable's double, and a packed (integer) variable's float when every value is a float's
  and one of them says so (:func:`refmount.netcdf.types.from_single`: kerchunk writes a
  float ``0.01`` as ``0.009999999776482582``), else double;
- a variable whose ``.zattrs`` has no ``_FillValue`` is given the one its Zarr
  ``fill_value`` stands for, where it stands for one (:func:`zarr_fill`).
"""

from __future__ import annotations

import base64
import binascii
import logging
import math
import struct
from typing import Any

import numpy as np

from refmount.decode.scalars import DIMENSIONS_ATTRIBUTE
from refmount.errors import FetchError
from refmount.netcdf.header import NC_CHAR, NC_DOUBLE, NC_FLOAT, TYPES, Attribute
from refmount.netcdf.types import NON_FINITE, FileType, attribute, floats_values, from_single

log = logging.getLogger(__name__)

FILL = "_FillValue"
#: The attributes CF gives in the variable's (packed) type.
IN_VARIABLE_TYPE = (FILL, "missing_value", "valid_min", "valid_max", "valid_range")
#: The attributes CF gives in the unpacked type.
PACKING = ("scale_factor", "add_offset")


def variable_attributes(
    path: str, document: dict[str, Any], kind: FileType, *, cdf5: bool, fill: Any = None
) -> list[Attribute]:
    """The attributes of the variable of array ``path``: its ``.zattrs`` ``document``
    (without ``_ARRAY_DIMENSIONS``), and ``fill`` as its ``_FillValue`` when the document
    has none (``None``: no fill value)."""
    out: list[Attribute] = []
    if fill is not None and FILL not in document:
        made = _fill_value(fill, kind)
        if made is None:
            log.warning("%s: fill_value %r is not a value of its type: no _FillValue", path, fill)
        else:
            out.append(made)
    packing = _packing_type(document, kind)
    for name, value in document.items():
        if name == DIMENSIONS_ATTRIBUTE or not name:
            continue
        if name == FILL:
            made = _fill_value(value, kind)
            if made is None:
                log.warning("%s: _FillValue %r is not a value of its type: left out", path, value)
            else:
                out.append(made)
            continue
        if name in IN_VARIABLE_TYPE and kind.width is None:
            made = in_variable_type(name, value, kind)
            if made is not None:
                out.append(made)
                continue
            log.info("%s: %s %r is not in the variable's type: written as given", path, name, value)
        elif name in PACKING and packing is not None:
            values = value if isinstance(value, list) else [value]
            dtype = TYPES[packing][0]
            out.append(Attribute(name, packing, np.array(values, dtype=dtype)))
            continue
        out.append(attribute(name, value, cdf5=cdf5))
    return out


def in_variable_type(name: str, value: Any, kind: FileType) -> Attribute | None:
    """``value`` (one number or a list) in the variable's type, or ``None`` if a value is
    not one of the type's."""
    items = value if isinstance(value, list) else [value]
    numbers = [_number(item, kind) for item in items]
    if not numbers or any(n is None for n in numbers):
        return None
    try:
        with np.errstate(all="ignore"):
            served = np.array(numbers).astype(kind.served)
        for got, wanted in zip(served.tolist(), numbers, strict=True):
            if got != wanted and not (isinstance(wanted, float) and math.isnan(wanted)):
                return None
            if isinstance(wanted, float) and math.isnan(wanted) and kind.served.kind != "f":
                return None
        data = bytes(kind.convert(served))
    except (OverflowError, ValueError, FetchError):
        return None
    return Attribute(name, kind.nc_type, np.frombuffer(data, kind.file_dtype))


def _fill_value(value: Any, kind: FileType) -> Attribute | None:
    """``_FillValue``: one value in the variable's type (a char variable's first byte of
    a text), or ``None``."""
    if kind.width is not None:
        text = value.encode("utf-8") if isinstance(value, str) else None
        return Attribute(FILL, NC_CHAR, text[:1]) if text else None
    if isinstance(value, list):
        return None
    return in_variable_type(FILL, value, kind)


def _number(item: Any, kind: FileType) -> int | float | None:
    if isinstance(item, bool) or item is None:
        return None
    if isinstance(item, int | float):
        return item
    if not isinstance(item, str):
        return None
    if item in NON_FINITE:
        return NON_FINITE[item]
    if kind.served.kind == "f":  # xarray's Zarr v2 spelling of a float's fill value
        try:
            raw = base64.b64decode(item, validate=True)
        except (binascii.Error, ValueError):
            return None
        if len(raw) == 8:
            return struct.unpack("<d", raw)[0]
    return None


def _packing_type(document: dict[str, Any], kind: FileType) -> int | None:
    """NC_FLOAT or NC_DOUBLE for ``scale_factor`` and ``add_offset``, or ``None`` when
    they are not numbers (written as given)."""
    numbers: list[float] = []
    for name in PACKING:
        if name not in document:
            continue
        value = document[name]
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, bool) or not isinstance(item, int | float):
                return None
            numbers.append(float(item))
    if not numbers or kind.width is not None:
        return None
    singles = floats_values(numbers)
    if kind.nc_type == NC_FLOAT and singles:
        return NC_FLOAT
    if kind.nc_type == NC_DOUBLE or not singles:
        return NC_DOUBLE
    return NC_FLOAT if any(from_single(n) for n in numbers) else NC_DOUBLE


def zarr_fill(meta: dict[str, Any], *, scalar: bool, kind: FileType) -> Any:
    """The ``_FillValue`` an array's Zarr v2 ``fill_value`` stands for in a set whose
    arrays carry none as an attribute (kerchunk moves each to the ``fill_value``), or
    ``None``.  Not 0: zarr's and HDF5's default, which the source file does not say (an
    HDF5 dataset h5py wrote, a netCDF-3 variable VirtualiZarr read); not a scalar's
    netCDF default fill: kerchunk gives a netCDF-4 file's scalars HDF5's fill value, which
    netCDF-C sets to that default whether the variable has a ``_FillValue`` or not."""
    value = meta.get("fill_value")
    if value is None or isinstance(value, bool) or kind.width is not None:
        return None
    number = _number(value, kind)
    if number is None or number == 0:
        return None
    if scalar and number == TYPES[kind.nc_type][1]:
        return None
    return value


__all__ = ["IN_VARIABLE_TYPE", "PACKING", "in_variable_type", "variable_attributes", "zarr_fill"]

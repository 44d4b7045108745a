"""What each decoded array's values and each attribute are in a netCDF classic file.

Values (the decoded view's served dtype, :mod:`refmount.decode.dtypes`):

- int8, int16, int32, float32, float64: NC_BYTE, NC_SHORT, NC_INT, NC_FLOAT, NC_DOUBLE;
- bool (served as uint8): NC_BYTE;
- unsigned: in CDF-5 its own type (NC_UBYTE, ...); in CDF-1/2 the next wider type
  that holds every value (uint8 NC_SHORT, uint16 NC_INT, uint32 NC_DOUBLE), each value
  converted.  Not the signed type of its size with ``_Unsigned = "true"`` (netCDF's
  convention): Octave's ``ncread`` and R's ncdf4 ignore that attribute and read the
  values past the signed range as negative numbers, and CDO reads the data as unsigned
  but its ``_FillValue`` as signed, so fill values read as data;
- int64 and uint64 (datetimes included, served as int64 with CF units): NC_INT64 and
  NC_UINT64 in CDF-5; in CDF-1/2 NC_DOUBLE, each value converted exactly, a value a
  double cannot hold failing its read (EIO), never rounded.  Debian's GDAL 3.6, R's
  ncdf4 and scipy cannot open CDF-5 at all: one int64 variable must not cost them the
  dataset;
- fixed-width bytes ``|S<n>`` (strings, ``--decode-strings fixed`` alike): NC_CHAR with
  a last dimension of length ``n``.

A value's offset in the file is its index times its size there (:attr:`FileType.itemsize`:
an unsigned value's is larger than served, a time's written as ``int`` smaller).
Attributes (JSON): text as NC_CHAR, integers as NC_INT (wider ones as
NC_INT64 in CDF-5, else as exact doubles), numbers that are floats' values written out
(:func:`from_single`) as NC_FLOAT, other numbers as NC_DOUBLE, lists of numbers alike;
anything else as its JSON text.  :mod:`refmount.netcdf.attributes` gives those CF reads
by type their variable's types.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from refmount.errors import FetchError
from refmount.netcdf.header import (
    NC_BYTE,
    NC_CHAR,
    NC_DOUBLE,
    NC_FLOAT,
    NC_INT,
    NC_INT64,
    NC_SHORT,
    NC_UBYTE,
    NC_UINT,
    NC_UINT64,
    NC_USHORT,
    TYPES,
    Attribute,
)

_SIGNED = {1: NC_BYTE, 2: NC_SHORT, 4: NC_INT}
_UNSIGNED = {1: NC_UBYTE, 2: NC_USHORT, 4: NC_UINT}
#: CDF-1/2's type holding every value of an unsigned type of each size.
_WIDER = {1: NC_SHORT, 2: NC_INT, 4: NC_DOUBLE}
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
INT32 = (-(1 << 31), (1 << 31) - 1)
FLOAT_MAX = float(np.finfo(np.float32).max)


class TypeRefused(Exception):
    """A served dtype with no place in netCDF classic; the message says why."""


@dataclass(frozen=True)
class FileType:
    """How one array's decoded values are written: ``served`` the decoded view's dtype
    (little-endian), ``nc_type`` the file's, ``width`` the char length of ``|S<n>``;
    ``widen`` converts unsigned values to the wider ``nc_type``; ``as_double`` converts
    64-bit integers;
    ``divisor`` divides a CF time's values (written in a coarser unit), but ``keep``
    (its fill value); ``narrow`` writes 64-bit integers (a time) as ``int``, ``keep``
    as ``int``'s default fill."""

    served: np.dtype
    nc_type: int
    width: int | None = None
    widen: bool = False
    as_double: bool = False
    divisor: int = 1
    keep: int | None = None
    narrow: bool = False

    @property
    def file_dtype(self) -> np.dtype:
        if self.width is not None:
            return np.dtype(f"S{self.width}")
        return TYPES[self.nc_type][0]

    @property
    def itemsize(self) -> int:
        """The bytes of one value in the file (a time written as ``int``: 4, served 8)."""
        return self.file_dtype.itemsize

    def convert(self, values: np.ndarray) -> memoryview:
        """Decoded values (a writable array this takes: swapped in place) as the file's
        bytes; :class:`FetchError` (EIO) for an integer a double cannot hold exactly."""
        if self.divisor != 1:
            values = in_unit(values, self.divisor, self.keep)
        if self.narrow:
            values = as_int(values, self.keep)
        if self.as_double:
            values = exact_doubles(values)
        elif self.widen:
            values = values.astype(self.file_dtype)
        elif self.width is None and values.itemsize > 1:
            values.byteswap(inplace=True)
        return memoryview(np.ascontiguousarray(values)).cast("B")


def in_unit(values: np.ndarray, divisor: int, keep: int | None) -> np.ndarray:
    """Times counted in a unit ``divisor`` times coarser (``keep`` left as it is), or
    :class:`FetchError` for a value that is not a whole number of the unit."""
    counted = values != keep if keep is not None else np.ones(values.shape, bool)
    remainder = np.where(counted, values % values.dtype.type(divisor), 0)
    if remainder.any():
        value = values[np.argmax(remainder != 0)]
        raise FetchError(f"the time {value} is not a whole number of the unit chosen for it")
    return np.where(counted, values // values.dtype.type(divisor), values)


def as_int(values: np.ndarray, keep: int | None) -> np.ndarray:
    """64-bit integers as ``int`` (``keep`` as ``int``'s default fill), or
    :class:`FetchError` for one that is not an ``int``."""
    fill = TYPES[NC_INT][1]
    kept = values == keep if keep is not None else np.zeros(values.shape, bool)
    inside = (values >= INT32[0]) & (values <= INT32[1])
    if not (inside | kept).all():
        value = values[np.argmax(~(inside | kept))]
        raise FetchError(f"the time {value} is not an int of the unit chosen for it")
    return np.where(kept, fill, values).astype("<i4")


def exact_doubles(values: np.ndarray) -> np.ndarray:
    """64-bit integers as big-endian doubles, or :class:`FetchError` if one is inexact."""
    doubles = values.astype(">f8")
    limit = 2.0**64 if values.dtype.kind == "u" else 2.0**63
    inside = (doubles < limit) & (doubles >= -limit)
    back = np.where(inside, doubles, 0).astype(values.dtype)
    bad = ~inside | (back != values)
    if bad.any():
        value = values[np.argmax(bad)]
        raise FetchError(f"the integer {value} has no exact double (a CDF-5 file holds it)")
    return doubles


def file_type(
    served: np.dtype,
    *,
    boolean: bool,
    cdf5: bool,
    divisor: int = 1,
    keep: int | None = None,
    narrow: bool = False,
) -> FileType:
    """The file type of a served dtype, or :class:`TypeRefused`; ``divisor`` and ``keep``
    for 64-bit integers (:class:`FileType`)."""
    kind, size = served.kind, served.itemsize
    if served.names is not None:
        raise TypeRefused(f"records ({served}) have no netCDF classic type")
    if kind == "S":
        return FileType(served, NC_CHAR, width=size)
    if kind == "f" and size in (4, 8):
        return FileType(served, NC_FLOAT if size == 4 else NC_DOUBLE)
    if boolean or (kind == "i" and size in _SIGNED):
        return FileType(served, _SIGNED[size])
    if kind == "u" and size in _UNSIGNED:
        if cdf5:
            return FileType(served, _UNSIGNED[size])
        return FileType(served, _WIDER[size], widen=True)
    if kind in "iu" and size == 8:
        if narrow and not cdf5:
            return FileType(served, NC_INT, divisor=divisor, keep=keep, narrow=True)
        nc_type = (NC_INT64 if kind == "i" else NC_UINT64) if cdf5 else NC_DOUBLE
        return FileType(served, nc_type, as_double=not cdf5, divisor=divisor, keep=keep)
    raise TypeRefused(f"dtype {served.str} has no netCDF classic type")


def attribute(name: str, value: Any, *, cdf5: bool) -> Attribute:
    """A JSON attribute value as a netCDF attribute."""
    if isinstance(value, str):
        return Attribute(name, NC_CHAR, value.encode("utf-8"))
    items = value if isinstance(value, list) else [value]
    numbers = _numbers(items)
    if numbers is not None and items:
        if all(isinstance(n, int) for n in numbers):
            found = _integers(name, numbers, cdf5)
            if found is not None:
                return found
        if single(numbers):
            return Attribute(name, NC_FLOAT, np.array(numbers, dtype=">f4"))
        if all(isinstance(n, float) or _exact_double(n) for n in numbers):
            return Attribute(name, NC_DOUBLE, np.array(numbers, dtype=">f8"))
    text = json.dumps(value, ensure_ascii=False, allow_nan=True)
    return Attribute(name, NC_CHAR, text.encode("utf-8"))


def floats_values(numbers: list[int | float]) -> bool:
    """Whether every number is a float's value (NaN and infinities included)."""
    return all(_float_value(n) for n in numbers)


def _float_value(n: int | float) -> bool:
    if not math.isfinite(n):
        return True
    return abs(n) <= FLOAT_MAX and float(np.float32(n)) == n


def single(numbers: list[int | float]) -> bool:
    """Whether JSON numbers are a float attribute's: floats' values, one of which says
    so (:func:`from_single`)."""
    floats = all(isinstance(n, float) for n in numbers)
    return floats and floats_values(numbers) and any(map(from_single, numbers))


def from_single(n: int | float) -> bool:
    """Whether a JSON number is a float's value written out as a double: a float's
    value whose shortest spelling as a float is shorter than its spelling as a double
    (``0.009999999776482582``, which a float ``0.01`` becomes).  A number both spell alike
    (``0.5``) says nothing."""
    if not isinstance(n, float) or not math.isfinite(n) or not _float_value(n):
        return False
    return float(str(np.float32(n))) != n


def _numbers(items: list[Any]) -> list[int | float] | None:
    out: list[int | float] = []
    for item in items:
        if isinstance(item, bool):
            out.append(int(item))
        elif isinstance(item, int | float):
            out.append(item)
        elif isinstance(item, str) and item in NON_FINITE and out:
            out.append(NON_FINITE[item])  # the decoded view's spelling after a number
        else:
            return None
    return out


def _exact_double(n: int | float) -> bool:
    try:
        return float(n) == n
    except OverflowError:
        return False


def _integers(name: str, numbers: list[int | float], cdf5: bool) -> Attribute | None:
    low, high = min(numbers), max(numbers)
    if INT32[0] <= low and high <= INT32[1]:
        return Attribute(name, NC_INT, np.array(numbers, dtype=">i4"))
    if cdf5 and low >= -(1 << 63) and high < 1 << 63:
        return Attribute(name, NC_INT64, np.array(numbers, dtype=">i8"))
    if cdf5 and low >= 0 and high < 1 << 64:
        return Attribute(name, NC_UINT64, np.array(numbers, dtype=">u8"))
    return None

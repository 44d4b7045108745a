"""What the decoded view serves each stored data type as: one policy for kerchunk (Zarr
v2) sets and Zarr v3 trees alike (:func:`refmount.decode.arrays.parse_zarray` applies
it to every ``.zarray``, the v3 tree's included).

Found by running the readers (``tests/test_decode_dtypes.py``): Debian's ncdump
(netCDF-C 4.9.0) dies (SIGSEGV) on a tree holding any ``|b1``, complex, ``|S<n>``,
``<U<n>`` or datetime array, whatever its values.  So:

- ``|b1`` is served as ``|u1``: 0 and 1, the same bytes;
- ``M8[unit]`` and ``m8[unit]`` as the 64-bit integers they are (``<i8``), with CF
  ``units`` (``seconds since 1970-01-01T00:00:00``, ``milliseconds``) and, for times,
  ``calendar`` ``proleptic_gregorian`` in the array's ``.zattrs`` (the set's own
  attributes win); NaT is the fill value.  A unit CF has no exact name for (months,
  years, a multiple such as ``M8[10s]``) is left out;
- ``f2`` (half precision) as ``f4``: every half-precision value is a single-precision
  one exactly, and Debian's ncdump dies on a tree holding an ``f2`` array;
- complex is left out (no reader of the matrix reads it without dying);
- fixed-width strings are left out by default; with ``--decode-strings fixed``
  (readers that read them) ``|S<n>`` is served as it is, and ``<U<n>`` (UTF-32) as
  ``|S<4n>``: each value's UTF-8 bytes, NUL padded.  ``4n`` bytes hold any ``n``
  characters' UTF-8, so the width is exact for every value and the chunk is no larger
  than the stored one; a value that is not text (a lone surrogate) is a
  :class:`DecodeError` for its chunk.

Everything else (integers, floats, records of plain fields) is served as it is.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from refmount.decode.codecs import Buffer, DecodeError
from refmount.decode.strings import MAX_WIDTH

CRASHES_NCDUMP = "Debian's ncdump (netCDF-C 4.9.0) dies on a tree holding one"
FIXED_STRINGS = "--decode-strings fixed serves them"
#: numpy's time units that CF names, and their CF names.
TIME_UNITS = {
    "W": "weeks", "D": "days", "h": "hours", "m": "minutes", "s": "seconds",
    "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds",
}  # fmt: skip
EPOCH = " since 1970-01-01T00:00:00"
#: numpy's NaT as an int64.
NAT = -(1 << 63)


class DtypeRefused(Exception):
    """A stored data type the decoded view does not serve; the message says why."""


@dataclass(frozen=True)
class Served:
    """A stored dtype as served: ``dtype`` the served one (in the stored byte order),
    ``attributes`` added to the array's ``.zattrs``, ``utf8_chars`` set when stored
    ``<U<n>`` values are re-encoded to UTF-8 (``n``)."""

    stored: np.dtype
    dtype: np.dtype
    attributes: dict[str, Any] = field(default_factory=dict)
    utf8_chars: int | None = None

    def fill_value(self, value: Any) -> Any:
        """The stored fill value as the served dtype's, the way a ``.zarray`` writes it."""
        kind = self.stored.kind
        if kind == "b" and isinstance(value, bool):
            return int(value)
        if kind in "mM" and value == "NaT":
            return NAT
        if self.utf8_chars is not None and isinstance(value, str):
            try:
                return base64.standard_b64encode(value.encode("utf-8")).decode()
            except UnicodeEncodeError:
                return None
        return value


def served(stored: np.dtype, *, fixed_strings: bool) -> Served:
    """How ``stored`` is served, or :class:`DtypeRefused` saying why it is left out."""
    kind = stored.kind
    if kind == "f" and stored.itemsize == 2:
        return Served(stored, np.dtype(stored.byteorder.replace("=", "<") + "f4"))
    if stored.names is not None or kind in "iuf":
        return Served(stored, stored)
    if kind == "b":
        return Served(stored, np.dtype("|u1"))
    if kind == "c":
        raise DtypeRefused(f"complex values ({stored.str}): {CRASHES_NCDUMP}")
    if kind in "mM":
        return _time(stored)
    if kind in "SU" and not fixed_strings:
        raise DtypeRefused(
            f"fixed-width strings ({stored.str}): {CRASHES_NCDUMP} ({FIXED_STRINGS})"
        )
    if kind == "S":
        return Served(stored, stored)
    if kind == "U":
        chars = stored.itemsize // 4
        if 4 * chars > MAX_WIDTH:
            raise DtypeRefused(
                f"strings of {chars} characters ({stored.str}): their UTF-8 may take "
                f"{4 * chars} bytes, over {MAX_WIDTH}"
            )
        return Served(stored, np.dtype(f"|S{4 * chars}"), utf8_chars=chars)
    raise DtypeRefused(f"dtype {stored.str} is not served")


def _time(stored: np.dtype) -> Served:
    unit, count = np.datetime_data(stored)
    if unit not in TIME_UNITS or count != 1:
        raise DtypeRefused(
            f"times of unit {count}{unit} ({stored.str}): CF time units (W, D, h, m, s, "
            "ms, us, ns) are served as integers, no other exactly"
        )
    since = EPOCH if stored.kind == "M" else ""
    attributes = {"units": TIME_UNITS[unit] + since}
    if since:
        attributes["calendar"] = "proleptic_gregorian"
    return Served(stored, np.dtype(stored.byteorder.replace("=", "<") + "i8"), attributes)


def utf8_fixed(data: Buffer, chars: int) -> bytes:
    """Little-endian ``<U<chars>`` values as ``|S<4 * chars>``: each value's UTF-8,
    NUL padded; :class:`DecodeError` for a value that is not text (a code point over
    U+10FFFF, or a surrogate)."""
    points = np.frombuffer(data, dtype="<u4")
    if ((points > 0x10FFFF) | ((points >= 0xD800) & (points <= 0xDFFF))).any():
        raise DecodeError(f"a <U{chars} value holds a code point that is not text")
    width = 4 * chars
    out = bytearray(len(points) // max(chars, 1) * width)
    for at, value in enumerate(np.frombuffer(data, dtype=f"<U{chars}").tolist()):
        encoded = value.encode("utf-8")
        out[at * width : at * width + len(encoded)] = encoded
    return bytes(out)


__all__ = ["NAT", "DtypeRefused", "Served", "served", "utf8_fixed"]

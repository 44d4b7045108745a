"""GRIB2 messages: the ``grib`` filter kerchunk's ``scan_grib`` writes (decoded with
ecCodes) and ``gribberish``'s codec.

A chunk is one whole GRIB message.  ``grib``'s ``var`` says what to read from it: the
field's ``values`` (every value equal to the message's ``missingValue`` becomes NaN, as
kerchunk's codec does), ``latitudes``/``longitudes`` for those coordinates (a 1-D
coordinate of a regular grid is the first column or row), and for the rank-0
coordinates ``scan_grib`` writes the key they stand for: the level for the message's
``typeOfLevel``, ``time`` and ``valid_time`` as seconds since 1970, ``step`` in its
units.  The message's own sizes are checked against the chunk's before ecCodes decodes
anything: a header claiming a huge grid is refused, not allocated.  Decoding runs in a
worker process (:mod:`refmount.decode.chunkjob`).
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from refmount.decode.stage import (
    Buffer,
    CodecError,
    DecodeError,
    Stage,
    exact,
    flag,
    needs,
    numeric_dtype,
    to_bytes,
    unknown_size,
)

#: A variable name as cfgrib and scan_grib write them.
_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,127}")
#: The GRIB edition 2 indicator section: "GRIB", 2 reserved, discipline, edition, length.
_INDICATOR = 16


#: The dtypes scan_grib names by numpy's names (``str(data.dtype)``).
_DTYPE_NAMES = {"float64", "float32", "int64", "int32", "uint8", "uint16", "uint32", "uint64"}


def _dtype(value: Any) -> np.dtype:
    if value in _DTYPE_NAMES:
        return np.dtype(value)
    return numeric_dtype(value, "grib: dtype")


def _message_length(data: Buffer, codec_id: str) -> int:
    """The message's declared length, checked against the bytes there are."""
    head = bytes(data[:_INDICATOR])
    if len(head) < 8 or head[:4] != b"GRIB":
        raise DecodeError(f"{codec_id}: the chunk is not a GRIB message")
    if head[7] == 2:
        if len(head) < _INDICATOR:
            raise DecodeError(f"{codec_id}: the GRIB message is cut short")
        length = int.from_bytes(head[8:16], "big")
    elif head[7] == 1:
        length = int.from_bytes(head[4:7], "big")
    else:
        raise DecodeError(f"{codec_id}: GRIB edition {head[7]} is not one there is")
    if length > len(data):
        raise DecodeError(f"{codec_id}: a GRIB message of {length} bytes cut short at {len(data)}")
    return length


def _grib(config: Mapping[str, Any]) -> Stage:
    var = config.get("var")
    if not isinstance(var, str) or not _VAR.fullmatch(var):
        raise CodecError(f"grib: var {var!r} is not a variable name")
    dtype = _dtype(config.get("dtype", "float64"))
    needs("eccodes", "grib", "grib")

    def decode(data: Buffer, size: int) -> Buffer:
        import eccodes

        if size % dtype.itemsize:
            raise DecodeError(f"grib: {size} bytes are not whole {dtype} values")
        length = _message_length(data, "grib")
        try:
            message = eccodes.codes_new_from_message(bytes(data[:length]))
        except Exception as exc:
            raise DecodeError(f"grib: ecCodes refuses the message: {exc}") from None
        try:
            values = _read(eccodes, message, var, size // dtype.itemsize)
        except DecodeError:
            raise
        except Exception as exc:
            raise DecodeError(f"grib: ecCodes cannot read {var!r}: {exc}") from None
        finally:
            eccodes.codes_release(message)
        return exact(to_bytes(values.astype(dtype, copy=False)), size, "grib")

    return Stage("grib", decode, unknown_size)


def _read(eccodes: Any, message: int, var: str, count: int) -> np.ndarray:
    """``count`` values of ``var`` from a message."""
    points = eccodes.codes_get_long(message, "numberOfDataPoints")
    if var in ("latitude", "longitude"):
        return _coordinate(eccodes, message, var, count, points)
    names = {_string(eccodes, message, key) for key in ("cfVarName", "shortName")}
    if var in names or (count == points and count > 1):
        held = eccodes.codes_get_size(message, "values")
        if points != count or held != count:
            raise DecodeError(
                f"grib: the message holds {held} values on a grid of {points} points, "
                f"the chunk {count}"
            )
        values = eccodes.codes_get_array(message, "values")
        missing = _string(eccodes, message, "missingValue")
        if missing and values.dtype.kind == "f":
            values[values == float(missing)] = np.nan
        return values
    if count != 1:
        raise DecodeError(f"grib: {var!r} is neither the message's field nor one value")
    return np.array([_scalar(eccodes, message, var)])


def _coordinate(eccodes: Any, message: int, var: str, count: int, points: int) -> np.ndarray:
    if count != points:  # a 1-D coordinate of a regular grid: one column, or one row
        rows, columns = (eccodes.codes_get_long(message, key) for key in ("Nj", "Ni"))
        if rows * columns != points or count != (rows if var == "latitude" else columns):
            raise DecodeError(f"grib: {count} {var}s from a grid of {points} points")
    elif eccodes.codes_get_size(message, var + "s") != count:
        raise DecodeError(f"grib: the message has not {count} {var}s")
    values = eccodes.codes_get_array(message, var + "s")
    if count == points:
        return values
    grid = values.reshape(rows, columns)
    return grid[:, 0].copy() if var == "latitude" else grid[0].copy()


def _scalar(eccodes: Any, message: int, var: str) -> float | int:
    """A rank-0 coordinate of scan_grib's: the key it stands for."""
    if var == _string(eccodes, message, "typeOfLevel"):
        return eccodes.codes_get_double(message, "level")
    if var in ("time", "valid_time"):
        prefix = "data" if var == "time" else "validity"
        date = eccodes.codes_get_long(message, prefix + "Date")
        hhmm = eccodes.codes_get_long(message, prefix + "Time")
        return calendar.timegm(
            (date // 10000, date // 100 % 100, date % 100, hhmm // 100, hhmm % 100, 0)
        )
    if var == "step":
        return eccodes.codes_get_long(message, "step")
    if not eccodes.codes_is_defined(message, var):
        raise DecodeError(f"grib: the message has no key {var!r}")
    return eccodes.codes_get_double(message, var)


def _string(eccodes: Any, message: int, key: str) -> str:
    try:
        return eccodes.codes_get_string(message, key)
    except Exception:  # a key the message does not define
        return ""


def _gribberish(config: Mapping[str, Any]) -> Stage:
    var = config.get("var")
    if var is not None and (not isinstance(var, str) or not _VAR.fullmatch(var)):
        raise CodecError(f"gribberish: var {var!r} is not a variable name")
    wrap, north_up = flag(config, "adjust_longitude_range"), flag(config, "north_up")
    needs("gribberish", "gribberish", "grib")

    def decode(data: Buffer, size: int) -> Buffer:
        import gribberish

        length = _message_length(data, "gribberish")
        message_bytes = bytes(data[:length])
        try:
            if var in ("latitude", "longitude"):
                message = gribberish.parse_grib_message_metadata(message_bytes, 0)
                latitudes, longitudes = message.latlng(wrap, north_up)
                values = latitudes if var == "latitude" else longitudes
            else:
                values = gribberish.parse_grib_array(message_bytes, 0, wrap, north_up)
        except Exception as exc:
            raise DecodeError(f"gribberish: {exc}") from None
        values = np.asarray(values, dtype="<f8")
        return exact(to_bytes(values), size, "gribberish")

    return Stage("gribberish", decode, unknown_size)


BUILDERS: dict[str, Callable[[Mapping[str, Any]], Stage]] = {
    "grib": _grib,
    "gribberish": _gribberish,
}

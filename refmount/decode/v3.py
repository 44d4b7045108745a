"""Zarr v3 node metadata (``zarr.json``) as the Zarr v2 documents readers of v2 read.

A group becomes ``.zgroup`` and ``.zattrs``; an array ``.zarray`` and ``.zattrs``:

- the data type as the v2 dtype with the ``bytes`` codec's byte order (``bool`` as
  ``|b1``, ``complex64`` as ``<c8``, ``numpy.datetime64`` with its unit as ``<M8[s]``,
  ``fixed_length_utf32`` as ``<U<n>``, ``null_terminated_bytes`` as ``|S<n>``);
  variable-length strings and bytes, raw bits and other types are refused;
- the codecs as v2 ``filters`` and ``compressor`` (:mod:`refmount.decode.v3codecs`);
- the fill value as v2 writes it (``"NaN"``, ``"Infinity"``; v3's hex spelling of a
  float's bits as the number);
- ``_ARRAY_DIMENSIONS`` from ``dimension_names``; a dimension without a name gets
  ``_Anonymous_Dim_<size>``, the name netCDF-C gives it;
- a ``_FillValue`` attribute that VirtualiZarr stored base64-encoded (xarray's v3
  encoding of a float fill value: the 8 bytes of a little-endian double) as the number.

What cannot be presented raises :class:`ArrayRefused` with the reason.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from refmount.decode.arrays import ArrayRefused
from refmount.decode.scalars import DIMENSIONS_ATTRIBUTE
from refmount.decode.v3codecs import v2_pipeline

#: netCDF-C's name for a dimension a pure Zarr array does not name.
ANONYMOUS_DIMENSION = "_Anonymous_Dim_{size}"
FILL_VALUE_ATTRIBUTE = "_FillValue"

_FIXED_TYPES = {
    "bool": "b1",
    **{f"int{8 * n}": f"i{n}" for n in (1, 2, 4, 8)},
    **{f"uint{8 * n}": f"u{n}" for n in (1, 2, 4, 8)},
    "float16": "f2",
    "float32": "f4",
    "float64": "f8",
    "complex64": "c8",
    "complex128": "c16",
}
_TIME_TYPES = {"numpy.datetime64": "M8", "numpy.timedelta64": "m8"}
_TIME_UNITS = frozenset(("Y", "M", "W", "D", "h", "m", "s", "ms", "us", "ns", "ps", "fs", "as"))
_HEX_FLOAT = re.compile(r"0x[0-9a-fA-F]+")
_BASE64_DOUBLE = re.compile(r"[A-Za-z0-9+/]{11}=")


@dataclass(frozen=True)
class Group:
    attributes: dict[str, Any]


@dataclass(frozen=True)
class ChunkKeys:
    """How a v3 array names its chunks: ``prefix`` (``c/``, ``c.`` or nothing, for the
    ``default`` and ``v2`` encodings) then the indices joined by ``separator``."""

    prefix: str
    separator: str
    rank: int

    def raw_name(self, name: str) -> str:
        """The v3 chunk key (after the array's path) of the v2 chunk name ``name``,
        which is joined by the same separator."""
        if self.rank == 0:
            return self.prefix.rstrip("/.") or "0"
        return f"{self.prefix}{name}"


@dataclass(frozen=True)
class Array:
    zarray: dict[str, Any]
    attributes: dict[str, Any]
    keys: ChunkKeys


def parse_node(text: bytes) -> Group | Array:
    """A ``zarr.json``'s node, or :class:`ArrayRefused` saying why it is not presented."""
    try:
        meta = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ArrayRefused(f"zarr.json is not JSON (or nested too deep): {exc}") from None
    if not isinstance(meta, dict) or meta.get("zarr_format") != 3:
        raise ArrayRefused("zarr.json is not Zarr v3 metadata")
    attributes = meta.get("attributes") or {}
    if not isinstance(attributes, dict):
        raise ArrayRefused(f"attributes {attributes!r} are not a JSON object")
    if meta.get("node_type") == "group":
        return Group(attributes)
    if meta.get("node_type") != "array":
        raise ArrayRefused(f"node_type {meta.get('node_type')!r} is neither group nor array")
    return _array(meta, attributes)


def _array(meta: dict[str, Any], attributes: dict[str, Any]) -> Array:
    shape = meta.get("shape")
    if not isinstance(shape, list):
        raise ArrayRefused(f"shape {shape!r} is not a list")
    rank = len(shape)
    grid = meta.get("chunk_grid")
    if not isinstance(grid, dict) or grid.get("name") != "regular":
        raise ArrayRefused(f"chunk grid {grid!r} is not a regular grid")
    chunks = (grid.get("configuration") or {}).get("chunk_shape")
    if meta.get("storage_transformers"):
        raise ArrayRefused("storage transformers are not decoded")
    pipeline = v2_pipeline(meta.get("codecs"), rank)
    dtype = _dtype(meta.get("data_type"), pipeline.endian)
    zarray = {
        "zarr_format": 2,
        "shape": shape,
        "chunks": chunks,
        "dtype": dtype.str,
        "compressor": pipeline.compressor,
        "filters": pipeline.filters or None,
        "fill_value": _fill_value(meta.get("fill_value"), dtype),
        "order": pipeline.order,
    }
    keys = _chunk_keys(meta.get("chunk_key_encoding"), rank)
    if rank:
        zarray["dimension_separator"] = keys.separator
    return Array(zarray, _array_attributes(meta, attributes, shape, dtype), keys)


def _dtype(data_type: Any, endian: str | None) -> np.dtype:
    order = endian or "<"
    if isinstance(data_type, str) and data_type in _FIXED_TYPES:
        return np.dtype(order + _FIXED_TYPES[data_type])
    if data_type in ("string", "bytes", "variable_length_bytes"):
        raise ArrayRefused(f"variable-length values ({data_type}) have no fixed-size decoding")
    if isinstance(data_type, dict):
        name, configuration = data_type.get("name"), data_type.get("configuration") or {}
        if name in _TIME_TYPES:
            unit, scale = configuration.get("unit"), configuration.get("scale_factor", 1)
            if unit not in _TIME_UNITS or not isinstance(scale, int) or not 1 <= scale < 1 << 31:
                raise ArrayRefused(f"data type {data_type!r}: unit or scale_factor not decoded")
            return np.dtype(f"{order}{_TIME_TYPES[name]}[{'' if scale == 1 else scale}{unit}]")
        length = configuration.get("length_bytes")
        if isinstance(length, int) and not isinstance(length, bool) and 0 < length < 1 << 30:
            if name == "fixed_length_utf32" and length % 4 == 0:
                return np.dtype(f"{order}U{length // 4}")
            if name == "null_terminated_bytes":
                return np.dtype(f"|S{length}")
    raise ArrayRefused(f"data type {data_type!r} has no Zarr v2 dtype refmount serves")


def _fill_value(value: Any, dtype: np.dtype) -> Any:
    """The v3 fill value as a v2 ``.zarray`` writes it."""
    if value is None:
        return None
    if dtype.kind == "f" and isinstance(value, str):
        if value in ("NaN", "Infinity", "-Infinity"):
            return value
        if _HEX_FLOAT.fullmatch(value):
            bits = int(value, 16).to_bytes(dtype.itemsize, "big")
            number = float(np.frombuffer(bits, dtype=dtype.newbyteorder(">"))[0])
            return number if math.isfinite(number) else _non_finite(number)
    if dtype.kind == "c" and isinstance(value, list) and len(value) == 2:
        return [_fill_value(part, np.dtype(f"<f{dtype.itemsize // 2}")) for part in value]
    if dtype.kind in "SU" and isinstance(value, str):
        return base64.standard_b64encode(value.encode()).decode() if dtype.kind == "S" else value
    return value


def _non_finite(number: float) -> str:
    return "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")


def _chunk_keys(encoding: Any, rank: int) -> ChunkKeys:
    if encoding is None:
        encoding = {"name": "default"}
    if not isinstance(encoding, dict):
        raise ArrayRefused(f"chunk_key_encoding {encoding!r} is not a named encoding")
    name = encoding.get("name")
    configuration = encoding.get("configuration") or {}
    separator = configuration.get("separator", "/" if name == "default" else ".")
    if name not in ("default", "v2") or separator not in ("/", "."):
        raise ArrayRefused(f"chunk_key_encoding {encoding!r} is not decoded")
    return ChunkKeys(f"c{separator}" if name == "default" else "", separator, rank)


def _array_attributes(
    meta: dict[str, Any], attributes: dict[str, Any], shape: list[Any], dtype: np.dtype
) -> dict[str, Any]:
    names = meta.get("dimension_names") or [None] * len(shape)
    if not isinstance(names, list) or len(names) != len(shape):
        raise ArrayRefused(f"dimension_names {names!r} do not match shape {shape!r}")
    dimensions = [
        name if isinstance(name, str) and name else ANONYMOUS_DIMENSION.format(size=size)
        for name, size in zip(names, shape, strict=True)
    ]
    out = {**attributes, DIMENSIONS_ATTRIBUTE: dimensions}
    fill = out.get(FILL_VALUE_ATTRIBUTE)
    if dtype.kind in "fc" and isinstance(fill, str | list):
        out[FILL_VALUE_ATTRIBUTE] = _base64_number(fill)
    return out


def _base64_number(value: str | list[Any]) -> Any:
    """A base64-encoded double as the number (a complex as ``[re, im]``); anything
    else as it is."""
    if isinstance(value, list):
        return [_base64_number(part) if isinstance(part, str) else part for part in value]
    if not _BASE64_DOUBLE.fullmatch(value):
        return value
    try:
        (number,) = struct.unpack("<d", base64.standard_b64decode(value))
    except (binascii.Error, struct.error):
        return value
    return number


__all__ = ["Array", "ChunkKeys", "Group", "parse_node"]

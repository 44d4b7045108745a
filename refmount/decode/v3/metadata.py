"""Zarr v3 node metadata (``zarr.json``) as the Zarr v2 documents readers of v2 read.

A group becomes ``.zgroup`` and ``.zattrs``; an array ``.zarray`` and ``.zattrs``:

- the data type as the v2 dtype of the same bytes, with the ``bytes`` codec's byte
  order (``bool`` ``|b1``, ``complex64`` ``<c8``, ``numpy.datetime64`` with unit ``s``
  ``<M8[s]``, ``fixed_length_utf32`` ``<U<n>``, ``null_terminated_bytes`` ``|S<n>``);
  what the decoded view serves each as (or leaves out) is decided for v2 and v3 sets
  alike, by :mod:`refmount.decode.dtypes`.  Variable-length strings and bytes are left
  out unless ``fixed_strings`` (``--decode-strings fixed``); raw bits and other types
  are left out;
- the codecs as v2 ``filters`` and ``compressor`` (:mod:`refmount.decode.v3.codecs`);
- the fill value as v2 writes it (``"NaN"``, ``"Infinity"``; v3's hex spelling of a
  float's bits as the number);
- ``_ARRAY_DIMENSIONS`` from ``dimension_names``; a dimension without a name gets
  ``_Anonymous_Dim_<size>``, the name netCDF-C gives it;
- a ``_FillValue`` attribute that VirtualiZarr stored base64-encoded (xarray's v3
  encoding of a float fill value: the 8 bytes of a little-endian double) as the number;
  a float array's ``_FillValue`` that is not a finite number (NaN, ``"NaN"``) is left
  out: the ``fill_value`` says it, in the variable's type.

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
from refmount.decode.dtypes import CRASHES_NCDUMP, NAT
from refmount.decode.scalars import DIMENSIONS_ATTRIBUTE
from refmount.decode.v3.codecs import Pipeline, v2_pipeline
from refmount.decode.v3.shards import ShardLayout, shard_layout
from refmount.refs.chunkgrid import GridError, regular_shape

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
}
#: numpy's time units.
_NUMPY_TIME_UNITS = frozenset(
    ("Y", "M", "W", "D", "h", "m", "s", "ms", "us", "ns", "ps", "fs", "as")
)
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

    def raw_key_of(self, index: tuple[int, ...]) -> str:
        """The v3 chunk key (after the array's path) of chunk ``index``."""
        return self.raw_name(self.separator.join(map(str, index)))

    def index_of(self, raw_name: str) -> tuple[int, ...] | None:
        """The chunk index of a v3 chunk key (after the array's path), if it is one."""
        if self.rank == 0:
            return () if raw_name == self.raw_name("0") else None
        if not raw_name.startswith(self.prefix):
            return None
        parts = raw_name[len(self.prefix) :].split(self.separator)
        if len(parts) != self.rank or not all(p.isdigit() for p in parts):
            return None
        return tuple(int(p) for p in parts)


@dataclass(frozen=True)
class Array:
    """``keys``: how the v3 chunks are named; ``shards``: set for a sharded array, whose
    v2 chunks are its inner chunks, named ``i.j`` (``grid``: inner chunks per dimension)."""

    zarray: dict[str, Any]
    attributes: dict[str, Any]
    keys: ChunkKeys
    shards: ShardLayout | None = None
    grid: tuple[int, ...] = ()


def parse_node(text: bytes, *, fixed_strings: bool = False) -> Group | Array:
    """A ``zarr.json``'s node, or :class:`ArrayRefused` saying why it is not presented.
    ``fixed_strings``: present variable-length string arrays (``--decode-strings
    fixed``: the view serves them as fixed-width bytes, for readers other than ncdump
    4.9.0)."""
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
    return _array(meta, attributes, fixed_strings)


def _array(meta: dict[str, Any], attributes: dict[str, Any], fixed_strings: bool) -> Array:
    shape = meta.get("shape")
    if not _sizes(shape, 0):
        raise ArrayRefused(f"shape {shape!r} is not a list of extents")
    chunks = _regular_chunks(meta.get("chunk_grid"), shape)
    rank = len(shape)
    if meta.get("storage_transformers"):
        raise ArrayRefused("storage transformers are not decoded")
    pipeline = v2_pipeline(meta.get("codecs"), rank)
    shards = None
    if pipeline.sharding is not None:
        shards, chunks, inner = _inner(pipeline, chunks, rank)
        pipeline = inner
    dtype = _type(meta.get("data_type"), pipeline.endian, fixed_strings, pipeline.vlen)
    zarray = {
        "zarr_format": 2,
        "shape": shape,
        "chunks": chunks,
        "dtype": dtype.str,
        "compressor": pipeline.compressor,
        "filters": _bound(pipeline.filters, dtype, chunks) or None,
        "fill_value": _fill_value(meta.get("fill_value"), dtype),
        "order": pipeline.order,
    }
    keys = _chunk_keys(meta.get("chunk_key_encoding"), rank)
    if rank:
        zarray["dimension_separator"] = "." if shards else keys.separator
    attributes = _array_attributes(meta, attributes, shape, dtype)
    if shards is None:
        return Array(zarray, attributes, keys)
    grid = tuple(-(-n // c) for n, c in zip(shape, chunks, strict=True))
    return Array(zarray, attributes, keys, shards, grid)


def _regular_chunks(grid: Any, shape: list[int]) -> list[int]:
    """The chunk shape of a regular grid, or of a rectilinear one whose chunks are all
    alike; an irregular grid has no v2 equivalent."""
    try:
        chunks = regular_shape(grid, shape)
    except GridError as exc:
        raise ArrayRefused(f"chunk grid: {exc}") from None
    if chunks is None:
        raise ArrayRefused(
            f"its chunk grid {grid.get('name')!r} is irregular: a Zarr v2 array has one chunk "
            "shape (the raw view serves its chunks)"
        )
    return chunks


def _bound(filters: list[dict[str, Any]], dtype: np.dtype, chunks: list[int]) -> list[Any]:
    """The filters with what refmount's array codecs need of the array: the dtype each
    sees (``cast_value`` changes it, to its ``data_type`` in the same byte order) and,
    for ``transpose``, the chunk shape and value size."""
    out: list[Any] = []
    current = dtype
    for codec in filters:
        name = codec.get("id")
        if name == "scale_offset":
            codec = {**codec, "dtype": current.str}
        elif name == "transpose":
            codec = {**codec, "shape": list(chunks), "itemsize": current.itemsize}
        elif name == "cast_value":
            target = codec.get("data_type")
            if not isinstance(target, str) or target not in _FIXED_TYPES or target == "bool":
                raise ArrayRefused(f"cast_value to {target!r} is not decoded")
            encoded = np.dtype(current.byteorder.replace("=", "<") + _FIXED_TYPES[target])
            codec = {**codec, "decode_dtype": current.str, "encode_dtype": encoded.str}
            current = encoded
        out.append(codec)
    return out


def _sizes(value: Any, least: int) -> bool:
    return isinstance(value, list) and all(
        isinstance(n, int) and not isinstance(n, bool) and least <= n < 1 << 62 for n in value
    )


def _configuration(named: dict[str, Any]) -> dict[str, Any]:
    configuration = named.get("configuration") or {}
    if not isinstance(configuration, dict):
        raise ArrayRefused(f"{named.get('name')!r}: configuration {configuration!r}")
    return configuration


def _inner(pipeline: Pipeline, shard_shape: Any, rank: int) -> tuple[ShardLayout, Any, Pipeline]:
    """A sharded array's layout, inner chunk shape and inner pipeline."""
    assert pipeline.sharding is not None
    if not isinstance(shard_shape, list) or len(shard_shape) != rank or not rank:
        raise ArrayRefused(f"shards {shard_shape!r} of a rank-{rank} array are not decoded")
    layout, inner_shape, inner_codecs = shard_layout(pipeline.sharding, shard_shape)
    inner = v2_pipeline(inner_codecs, rank)
    if inner.sharding is not None or inner.vlen is not None:
        raise ArrayRefused("shards of shards, or of variable-length values, are not decoded")
    return layout, inner_shape, inner


def _type(data_type: Any, endian: str | None, fixed_strings: bool, vlen: str | None) -> np.dtype:
    """The v2 dtype of a v3 data type's bytes (``O`` for variable-length strings)."""
    order = endian or "<"
    if vlen is not None:
        if data_type not in ("string", "bytes", "variable_length_bytes"):
            raise ArrayRefused(f"{vlen} values of data type {data_type!r}")
        if not fixed_strings:
            raise ArrayRefused(
                f"variable-length values ({data_type}): {CRASHES_NCDUMP} "
                "(--decode-strings fixed serves them)"
            )
        return np.dtype("O")
    if isinstance(data_type, str) and data_type in _FIXED_TYPES:
        return np.dtype(order + _FIXED_TYPES[data_type])
    if data_type in ("complex64", "complex128"):
        return np.dtype(order + ("c8" if data_type == "complex64" else "c16"))
    if data_type in ("string", "bytes", "variable_length_bytes"):
        raise ArrayRefused(f"variable-length values ({data_type}) have no fixed-size decoding")
    if isinstance(data_type, dict):
        name, configuration = data_type.get("name"), _configuration(data_type)
        if name in ("numpy.datetime64", "numpy.timedelta64"):
            return _time(data_type, configuration, order)
        length = configuration.get("length_bytes")
        if isinstance(length, int) and not isinstance(length, bool) and 0 < length < 1 << 30:
            if name == "fixed_length_utf32" and length % 4 == 0:
                return np.dtype(f"{order}U{length // 4}")
            if name == "null_terminated_bytes":
                return np.dtype(f"|S{length}")
    raise ArrayRefused(f"data type {data_type!r} has no Zarr v2 dtype refmount serves")


def _time(data_type: Any, configuration: dict[str, Any], order: str) -> np.dtype:
    """A datetime or timedelta as numpy's ``M8[<scale><unit>]`` or ``m8[...]``."""
    unit, scale = configuration.get("unit"), configuration.get("scale_factor", 1)
    if unit not in _NUMPY_TIME_UNITS or not isinstance(scale, int) or not 0 < scale < 1 << 31:
        raise ArrayRefused(f"data type {data_type!r}: not a numpy time unit and scale")
    kind = "M8" if data_type["name"] == "numpy.datetime64" else "m8"
    return np.dtype(f"{order}{kind}[{'' if scale == 1 else scale}{unit}]")


def _fill_value(value: Any, dtype: np.dtype) -> Any:
    """The v3 fill value as a v2 ``.zarray`` writes it."""
    if value is None:
        return None
    if dtype.kind in "mM" and value == "NaT":
        return NAT
    if dtype.kind == "f" and isinstance(value, str):
        if value in ("NaN", "Infinity", "-Infinity"):
            return value
        if _HEX_FLOAT.fullmatch(value) and len(value) == 2 + 2 * dtype.itemsize:
            bits = int(value, 16).to_bytes(dtype.itemsize, "big")
            number = float(np.frombuffer(bits, dtype=dtype.newbyteorder(">"))[0])
            return number if math.isfinite(number) else _non_finite(number)
        raise ArrayRefused(f"fill value {value!r} is not a {dtype} value")
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
    configuration = _configuration(encoding)
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
    if dtype.kind == "f" and isinstance(fill, str):
        fill = out[FILL_VALUE_ATTRIBUTE] = _base64_number(fill)
    if dtype.kind == "f" and FILL_VALUE_ATTRIBUTE in out and not _finite(fill):
        # NaN or an infinity has no JSON number: written as text, netCDF-C would make it
        # a char attribute.  Left to the .zarray's fill_value, which NCZarr turns into a
        # _FillValue of the variable's type.
        del out[FILL_VALUE_ATTRIBUTE]
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _base64_number(value: str) -> Any:
    """A base64-encoded double as the number; anything else as it is."""
    if not _BASE64_DOUBLE.fullmatch(value):
        return value
    try:
        (number,) = struct.unpack("<d", base64.standard_b64decode(value))
    except (binascii.Error, struct.error):
        return value
    return number


__all__ = ["Array", "ChunkKeys", "Group", "parse_node"]

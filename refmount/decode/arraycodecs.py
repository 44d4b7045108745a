"""Zarr v3 array-to-array codecs as decoding stages: ``transpose`` of any order,
``scale_offset`` and ``cast_value`` (zarr-extensions; ESA's EOPF products use both).

A v3 codec list becomes v2 filters (:mod:`refmount.decode.v3.codecs`), and the v3 tree
gives each such filter what its decoding needs that the v3 configuration leaves to the
array: the dtype of the values it sees and, for ``transpose``, the chunk's shape
(:func:`refmount.decode.v3.metadata`).  ``scale_offset`` and ``cast_value`` decode with
zarr's own implementations (``zarr.codecs``; ``cast_value`` through ``cast-value-rs``),
given exactly the bytes of one chunk, and their output is checked to be exactly the
chunk's size, as every stage's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from refmount.decode.stage import (
    Buffer,
    CodecError,
    DecodeError,
    Stage,
    exact,
    needs,
    numeric_dtype,
    same_size,
    to_bytes,
)

#: The most dimensions a transposed chunk may have.
_MAX_RANK = 32


def _transpose(config: Mapping[str, Any]) -> Stage:
    """Bytes of a chunk stored transposed by ``order`` (its ``shape`` the logical
    chunk's, ``itemsize`` bytes a value) back to C order: byte order is kept."""
    order, shape, itemsize = config.get("order"), config.get("shape"), config.get("itemsize")
    if (
        not isinstance(order, list)
        or not isinstance(shape, list)
        or len(order) != len(shape)
        or len(order) > _MAX_RANK
        or sorted(order) != list(range(len(order)))
        or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape)
        or not isinstance(itemsize, int)
        or not 0 < itemsize <= 1 << 16
    ):
        raise CodecError(f"transpose: order {order!r} of shape {shape!r} is not a permutation")
    stored_shape = [shape[axis] for axis in order]
    inverse = list(np.argsort(order))
    item = np.dtype(f"V{itemsize}")
    size = math.prod(shape) * itemsize

    def decode(data: Buffer, wanted: int) -> Buffer:
        exact(data, size, "transpose")
        values = np.frombuffer(data, dtype=item).reshape(stored_shape)
        return exact(to_bytes(values.transpose(inverse)), wanted, "transpose")

    return Stage("transpose", decode, same_size)


def _zarr_spec(dtype: np.dtype, count: int) -> Any:
    """The chunk spec zarr's array codecs are given: ``count`` values of ``dtype``."""
    from zarr.core.array_spec import ArrayConfig, ArraySpec
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.dtype import get_data_type_from_native_dtype

    zdtype = get_data_type_from_native_dtype(dtype)
    return ArraySpec(
        shape=(count,),
        dtype=zdtype,
        fill_value=zdtype.default_scalar(),
        config=ArrayConfig.from_dict({}),
        prototype=default_buffer_prototype(),
    )


def _zarr_decoded(codec: Any, values: np.ndarray, out: np.dtype, codec_id: str) -> Buffer:
    """``values`` decoded by one of zarr's array codecs to ``out`` values."""
    from zarr.core.buffer import default_buffer_prototype

    spec = _zarr_spec(out, values.size)
    buffer = default_buffer_prototype().nd_buffer.from_numpy_array(values)
    try:
        decoded = np.asarray(codec._decode_sync(buffer, spec).as_numpy_array())
    except (ValueError, TypeError, OverflowError, ArithmeticError) as exc:
        raise DecodeError(f"{codec_id}: {exc}") from None
    if decoded.dtype != out or decoded.size != values.size:
        raise DecodeError(f"{codec_id} decoded {decoded.size} {decoded.dtype}, not {out}")
    return to_bytes(decoded)


def _scale_offset(config: Mapping[str, Any]) -> Stage:
    needs("zarr.codecs.scale_offset", "scale_offset", "v3codecs")
    from zarr.codecs import ScaleOffset

    dtype = numeric_dtype(config.get("dtype"), "scale_offset: dtype")
    try:
        codec = ScaleOffset(offset=config.get("offset", 0), scale=config.get("scale", 1))
        codec.validate(shape=(1,), dtype=_zarr_spec(dtype, 1).dtype, chunk_grid=None)
    except (ValueError, TypeError) as exc:
        raise CodecError(f"scale_offset: {exc}") from None

    def decode(data: Buffer, size: int) -> Buffer:
        values = np.frombuffer(exact(data, size, "scale_offset"), dtype=dtype)
        return exact(_zarr_decoded(codec, values, dtype, "scale_offset"), size, "scale_offset")

    return Stage("scale_offset", decode, same_size)


def _cast_value(config: Mapping[str, Any]) -> Stage:
    needs("cast_value_rs", "cast_value", "v3codecs")
    from zarr.codecs import CastValue

    decoded = numeric_dtype(config.get("decode_dtype"), "cast_value: decode_dtype")
    encoded = numeric_dtype(config.get("encode_dtype"), "cast_value: encode_dtype")
    fields = {k: config[k] for k in ("rounding", "out_of_range", "scalar_map") if k in config}
    try:
        codec = CastValue.from_dict({"name": "cast_value", "configuration": {
            "data_type": str(_zarr_spec(encoded, 1).dtype.to_json(zarr_format=3)), **fields,
        }})  # fmt: skip
    except (ValueError, TypeError, KeyError) as exc:
        raise CodecError(f"cast_value: {exc}") from None
    if codec.dtype.to_native_dtype().itemsize != encoded.itemsize:
        raise CodecError(f"cast_value: data_type is not {encoded}")

    def encoded_size(size: int) -> int:
        if size % decoded.itemsize:
            raise CodecError(f"cast_value: chunk size {size} is not whole {decoded} values")
        return size // decoded.itemsize * encoded.itemsize

    def decode(data: Buffer, size: int) -> Buffer:
        exact(data, encoded_size(size), "cast_value")
        values = np.frombuffer(data, dtype=encoded)
        return exact(_zarr_decoded(codec, values, decoded, "cast_value"), size, "cast_value")

    return Stage("cast_value", decode, encoded_size)


BUILDERS = {"transpose": _transpose, "scale_offset": _scale_offset, "cast_value": _cast_value}

"""TIFF tiles and strips: the imagecodecs codecs tifffile's ``write_fsspec`` (and
``kerchunk.tiff``) write, decoded with imagecodecs.

Compressors: ``imagecodecs_lzw``, ``_packbits``, ``_zstd``, ``_deflate``/``_zlib``,
``_jpeg`` and ``_webp`` (deflate itself is usually numcodecs' ``zlib``).  Each is given
an output one byte past the chunk's size, so a stream that decodes to more is caught
without decoding more.  Predictors are filters over the tile's ``shape``:
``imagecodecs_delta`` (horizontal differencing) and ``imagecodecs_floatpred`` (the
floating-point predictor), along ``axis`` with ``dist``; their size is the tile's.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from refmount.decode.stage import (
    Buffer,
    CodecError,
    DecodeError,
    Stage,
    exact,
    integer,
    needs,
    numeric_dtype,
    same_size,
    to_bytes,
    unknown_size,
)

_MAX_RANK = 32


def _imagecodecs(codec_id: str) -> None:
    needs("imagecodecs", codec_id, "tiff")


def _bounded(codec_id: str, function: str, **options: Any) -> Stage:
    """A compressor decoded into at most one byte past the chunk's size."""
    _imagecodecs(codec_id)

    def decode(data: Buffer, size: int) -> Buffer:
        import imagecodecs

        try:
            out = getattr(imagecodecs, function)(bytes(data), out=size + 1, **options)
        except Exception as exc:
            raise DecodeError(f"{codec_id}: {exc}") from None
        return exact(out, size, codec_id)

    return Stage(codec_id, decode, unknown_size)


def _deflate(config: Mapping[str, Any]) -> Stage:
    raw = config.get("raw", False)
    if not isinstance(raw, bool):
        raise CodecError(f"imagecodecs_deflate: raw {raw!r} is not true or false")
    return _bounded("imagecodecs_deflate", "deflate_decode", raw=raw)


def _optional_bytes(config: Mapping[str, Any], name: str) -> bytes | None:
    value = config.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 1 << 20:
        raise CodecError(f"{config['id']}: {name} is not base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        raise CodecError(f"{config['id']}: {name} is not base64 text") from None


_JPEG_COLORSPACES = {None, "GRAYSCALE", "RGB", "YCbCr", "CMYK", "YCCK", "UNKNOWN"}


def _colorspace(config: Mapping[str, Any], name: str) -> str | int | None:
    value = config.get(name)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 16:
        return value
    if value in _JPEG_COLORSPACES:
        return value
    raise CodecError(f"imagecodecs_jpeg: {name} {value!r} is not a colour space")


def _jpeg(config: Mapping[str, Any]) -> Stage:
    tables, header = _optional_bytes(config, "tables"), _optional_bytes(config, "header")
    colorspace = _colorspace(config, "colorspace_jpeg")
    outcolorspace = _colorspace(config, "colorspace_data")
    _imagecodecs("imagecodecs_jpeg")

    def decode(data: Buffer, size: int) -> Buffer:
        import imagecodecs

        stream = bytes(data) if header is None else b"".join((header, data, b"\xff\xd9"))
        try:
            image = imagecodecs.jpeg8_decode(
                stream, tables=tables, colorspace=colorspace, outcolorspace=outcolorspace
            )
        except Exception as exc:
            raise DecodeError(f"imagecodecs_jpeg: {exc}") from None
        return exact(to_bytes(image), size, "imagecodecs_jpeg")

    return Stage("imagecodecs_jpeg", decode, unknown_size)


def _webp(config: Mapping[str, Any]) -> Stage:
    hasalpha = config.get("hasalpha")
    if hasalpha not in (None, True, False):
        raise CodecError(f"imagecodecs_webp: hasalpha {hasalpha!r} is not true or false")
    _imagecodecs("imagecodecs_webp")

    def decode(data: Buffer, size: int) -> Buffer:
        import imagecodecs

        try:
            image = imagecodecs.webp_decode(bytes(data), hasalpha=hasalpha)
        except Exception as exc:
            raise DecodeError(f"imagecodecs_webp: {exc}") from None
        return exact(to_bytes(image), size, "imagecodecs_webp")

    return Stage("imagecodecs_webp", decode, unknown_size)


def _predictor(codec_id: str, function: str, kinds: str) -> Callable[[Mapping[str, Any]], Stage]:
    """``imagecodecs_delta`` / ``imagecodecs_floatpred``: undone over the tile's shape."""

    def build(config: Mapping[str, Any]) -> Stage:
        dtype = numeric_dtype(config.get("dtype"), f"{codec_id}: dtype")
        if dtype.kind not in kinds:
            raise CodecError(f"{codec_id}: dtype {dtype.str} is not one it predicts")
        shape = config.get("shape")
        if (
            not isinstance(shape, list)
            or not 1 <= len(shape) <= _MAX_RANK
            or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape)
        ):
            raise CodecError(f"{codec_id}: shape {shape!r} is not a tile's shape")
        axis = integer(config, "axis", -len(shape), len(shape) - 1, -1)
        dist = integer(config, "dist", 1, 1 << 16, 1)
        nbytes = math.prod(shape) * dtype.itemsize
        _imagecodecs(codec_id)

        def decode(data: Buffer, size: int) -> Buffer:
            import imagecodecs

            if size != nbytes:
                raise DecodeError(f"{codec_id}: a tile of {nbytes} bytes in a chunk of {size}")
            values = np.frombuffer(exact(data, size, codec_id), dtype=dtype).reshape(shape)
            try:
                out = getattr(imagecodecs, function)(values, axis=axis, dist=dist)
            except Exception as exc:
                raise DecodeError(f"{codec_id}: {exc}") from None
            return exact(to_bytes(out), size, codec_id)

        return Stage(codec_id, decode, same_size)

    return build


BUILDERS: dict[str, Callable[[Mapping[str, Any]], Stage]] = {
    "imagecodecs_lzw": lambda config: _bounded("imagecodecs_lzw", "lzw_decode"),
    "imagecodecs_packbits": lambda config: _bounded("imagecodecs_packbits", "packbits_decode"),
    "imagecodecs_zstd": lambda config: _bounded("imagecodecs_zstd", "zstd_decode"),
    "imagecodecs_zlib": lambda config: _bounded("imagecodecs_zlib", "zlib_decode"),
    "imagecodecs_deflate": _deflate,
    "imagecodecs_jpeg": _jpeg,
    "imagecodecs_webp": _webp,
    "imagecodecs_delta": _predictor("imagecodecs_delta", "delta_decode", "iuf"),
    "imagecodecs_floatpred": _predictor("imagecodecs_floatpred", "floatpred_decode", "f"),
}

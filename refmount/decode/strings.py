"""Variable-length string arrays as fixed-width bytes (``--decode-strings fixed``).

A ``vlen-utf8`` or ``vlen-bytes`` chunk (numcodecs' format: a little-endian uint32 count,
then per value a uint32 length and the bytes) has no fixed size, and Debian's netCDF-C
4.9.0 dies on a tree holding a string array, so the decoded view leaves such arrays out
by default.  Readers that read strings (GDAL, zarr, newer netCDF-C) read fixed-width
bytes, ``|S<n>``: with ``--decode-strings fixed`` an array is served as ``|S<n>``, ``n``
the longest value in the array (its UTF-8 bytes, as stored), each value padded with NUL.

``n`` is known only from every chunk: the view measures each string array once, when
the set is first used (:meth:`refmount.decode.view.DecodedRefSet.measure_strings`).
Bounds: a chunk decompresses to at most :data:`MAX_VLEN_CHUNK` bytes while measured,
and once ``n`` is known to at most the most its values can take, ``4 + count * (4 + n)``;
a value longer than ``n`` (the chunk changed since) or a malformed chunk is a
:class:`DecodeError`.

Both run in the daemon's worker processes, as the jobs ``decode-strings`` and
``measure-strings`` (:mod:`refmount.decode.chunkjob`): their parameters are the
``.zarray`` fields :func:`vlen_codecs` reads (:func:`vlen_meta`), checked again there.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass
from typing import Any

from refmount.decode.codecs import Buffer, CodecError, DecodeError, Stage, build_stage

VLEN_IDS = frozenset(("vlen-utf8", "vlen-bytes"))
#: The most bytes a variable-length chunk may decompress to.
MAX_VLEN_CHUNK = 64 << 20
#: The widest value served (bytes).
MAX_WIDTH = 1 << 20
_COUNT = struct.Struct("<I")


def vlen_codecs(meta: dict[str, Any]) -> tuple[str, dict[str, Any] | None] | None:
    """``(vlen codec id, compressor)`` of a ``.zarray`` of variable-length strings, or
    ``None`` when it is not one (other filters, not ``|O``)."""
    filters = meta.get("filters")
    if meta.get("dtype") != "|O" or not isinstance(filters, list) or len(filters) != 1:
        return None
    first = filters[0]
    if not isinstance(first, dict) or first.get("id") not in VLEN_IDS:
        return None
    compressor = meta.get("compressor")
    return first["id"], compressor if isinstance(compressor, dict) else None


def values(data: Buffer, count: int) -> list[memoryview]:
    """The ``count`` values of a variable-length chunk, or :class:`DecodeError`."""
    view = memoryview(data).cast("B")
    if len(view) < 4 or _COUNT.unpack_from(view)[0] != count:
        raise DecodeError(f"a variable-length chunk without its {count} values")
    found, at = [], 4
    for _ in range(count):
        if at + 4 > len(view):
            raise DecodeError("a variable-length chunk ends inside a value's length")
        (length,) = _COUNT.unpack_from(view, at)
        at += 4
        if at + length > len(view):
            raise DecodeError("a variable-length chunk ends inside a value")
        found.append(view[at : at + length])
        at += length
    if at != len(view):
        raise DecodeError(f"{len(view) - at} bytes after a variable-length chunk's values")
    return found


def _decompressor(compressor: dict[str, Any] | None) -> Stage | None:
    if compressor is None:
        return None
    stage = build_stage(compressor)
    if stage.at_most is None:
        raise CodecError(f"{stage.codec_id} before variable-length values is not decoded")
    return stage


def _unpacked(stage: Stage | None, raw: Buffer, bound: int) -> Buffer:
    if stage is None:
        if len(raw) > bound:
            raise DecodeError(f"a variable-length chunk of {len(raw)} bytes, over {bound}")
        return raw
    assert stage.at_most is not None
    return stage.at_most(raw, bound)


def vlen_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """The fields of a string array's ``.zarray`` its decoding depends on (a job's
    parameters)."""
    return {name: meta.get(name) for name in ("dtype", "filters", "compressor", "chunks")}


def checked_vlen_meta(meta: Any) -> dict[str, Any]:
    """``meta`` (a job's parameters) if it is a string array's, else :class:`CodecError`."""
    chunks = meta.get("chunks") if isinstance(meta, dict) else None
    if (
        not isinstance(chunks, list)
        or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in chunks)
        or vlen_codecs(meta) is None
    ):
        raise CodecError(f"not the .zarray of a variable-length string array: {meta!r:.200}")
    return meta


@dataclass(frozen=True)
class StringMeasure:
    """Measuring an array's values: :meth:`longest` of one raw chunk."""

    count: int
    stage: Stage | None
    #: The parameters of a ``measure-strings`` job.
    spec: dict[str, Any]

    def longest(self, raw: Buffer) -> int:
        data = _unpacked(self.stage, raw, MAX_VLEN_CHUNK)
        return max((len(value) for value in values(data, self.count)), default=0)


def string_measure(meta: dict[str, Any]) -> StringMeasure:
    """How to measure the values of a ``.zarray`` :func:`vlen_codecs` accepts."""
    codecs = vlen_codecs(meta)
    assert codecs is not None
    return StringMeasure(
        math.prod(meta["chunks"]), _decompressor(codecs[1]), {"meta": vlen_meta(meta)}
    )


@dataclass(frozen=True)
class StringDecoder:
    """A variable-length chunk to ``count`` values of ``width`` bytes, NUL padded (a
    :class:`refmount.decode.codecs.ChunkDecoding`)."""

    key: str
    size: int
    chunks: tuple[int, ...]
    width: int
    stage: Stage | None
    error: str | None = None
    #: The parameters of a ``decode-strings`` job.
    spec: dict[str, Any] | None = None

    @property
    def job(self) -> tuple[str, dict[str, Any]] | None:
        return None if self.spec is None else ("decode-strings", self.spec)

    @property
    def count(self) -> int:
        return math.prod(self.chunks)

    @property
    def max_raw_size(self) -> int:
        return self.bound + self.bound // 8 + (1 << 16)

    @property
    def bound(self) -> int:
        return 4 + self.count * (4 + self.width)

    def decode(self, raw: Buffer) -> bytes:
        if self.error is not None:
            raise DecodeError(self.error)
        out = bytearray(self.size)
        for i, value in enumerate(values(_unpacked(self.stage, raw, self.bound), self.count)):
            if len(value) > self.width:
                raise DecodeError(f"a value of {len(value)} bytes, wider than {self.width}")
            out[i * self.width : i * self.width + len(value)] = value
        return bytes(out)


def string_decoder(meta: dict[str, Any], width: int) -> StringDecoder:
    """The decoder of a ``.zarray`` of variable-length strings served as ``|S<width>``."""
    codecs = vlen_codecs(meta)
    assert codecs is not None
    chunks = tuple(meta["chunks"])
    size = math.prod(chunks) * width
    identity = json.dumps([codecs, chunks, width], sort_keys=True, default=str)
    key = hashlib.sha256(identity.encode()).hexdigest()[:32]
    try:
        stage = _decompressor(codecs[1])
    except CodecError as exc:
        return StringDecoder(key, size, chunks, width, None, str(exc))
    spec = {"meta": vlen_meta(meta), "width": width}
    return StringDecoder(key, size, chunks, width, stage, spec=spec)

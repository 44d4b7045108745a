"""One Zarr v2 array as the decoded view presents it: its ``.zarray`` checked, the
decoding of its chunks, and its rewritten ``.zarray``.

What a decoded chunk is: the chunk's values, the ``.zarray``'s ``compressor`` and
``filters`` undone in Zarr's order (the compressor, then the filters last to first),
little-endian, C order, exactly ``prod(chunks) * itemsize`` bytes.  The rewritten
``.zarray`` says so: ``compressor`` and ``filters`` null, the dtype's byte order ``<``
(``|`` for one-byte types), ``order`` C; a rank-0 array's shape and chunks are ``[1]``
(:mod:`refmount.decode.scalars`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from refmount.decode.codecs import Buffer, CodecError, DecodeError, Stage, build_stage
from refmount.decode.dtypes import DtypeRefused, Served, served, utf8_fixed
from refmount.decode.jsontext import dump_json, repair_document, repair_fill_value
from refmount.decode.scalars import as_one_element
from refmount.decode.stage import record_dtype
from refmount.decode.strings import MAX_WIDTH, StringDecoder, string_decoder, vlen_codecs

#: The largest decoded chunk served (bytes): more is refused, not allocated.
MAX_CHUNK_BYTES = 1 << 30
#: Dimensions an array may have.
MAX_RANK = 32
#: dtypes a ``.zarray`` may name: booleans, numbers, complex, datetimes, fixed-width
#: strings; and records of plain fields (:func:`refmount.decode.stage.record_dtype`).
#: What each is served as: :mod:`refmount.decode.dtypes`.
_DTYPE = re.compile(r"[<>|=](b1|[iu][1248]|f[248]|c(8|16)|[mM]8(\[\d*[a-zA-Z]+\])?|S\d+|U\d+)")


class ArrayRefused(Exception):
    """An array the decoded view leaves out; the message says why."""


@dataclass(frozen=True)
class ChunkDecoder:
    """The decoding of one array's chunks: raw chunk bytes to decoded chunk bytes.

    ``key`` names the decoding (codecs, dtype, chunk shape, order): two arrays with the
    same key decode the same bytes alike, so the cache shares their chunks.  ``error``
    set: the array's chunks are not decoded (an unknown codec), each read fails with it.
    """

    key: str
    size: int
    chunks: tuple[int, ...]
    dtype: np.dtype
    order: str
    stages: tuple[Stage, ...]  # in decoding order
    sizes: tuple[int | None, ...]  # each stage's output size (None: input less overhead)
    error: str | None = None
    #: What :func:`chunk_decoder` builds this from: the parameters of a decode job.
    spec: dict[str, Any] | None = None
    #: Set: the stored ``<U<n>`` values re-encoded to ``|S<4n>`` UTF-8 (``n``).
    utf8_chars: int | None = None
    #: Set: the values served as this wider dtype (half precision as ``<f4``).
    widened: np.dtype | None = None

    @property
    def served_dtype(self) -> np.dtype:
        return self.dtype if self.widened is None else self.widened

    @property
    def job(self) -> tuple[str, dict[str, Any]] | None:
        """The worker job that decodes a chunk (``None``: the bytes are stored as they
        are served, checked here)."""
        if self.spec is None or not (self.stages or self.utf8_chars or self.widened):
            return None
        return "decode", self.spec

    @property
    def max_raw_size(self) -> int:
        """The most raw bytes a chunk may have: the input of an exact first stage, else
        room for incompressible data plus framing."""
        return self.size + self.size // 8 + (1 << 16)

    def decode(self, raw: Buffer) -> bytes:
        """The decoded chunk, or :class:`DecodeError`.  Runs in a worker thread."""
        if self.error is not None:
            raise DecodeError(self.error)
        data: Buffer = raw
        stored = math.prod(self.chunks) * self.dtype.itemsize
        if not self.stages and len(data) != stored:
            raise DecodeError(f"an uncompressed chunk of {len(data)} bytes, not {stored}")
        for stage, known in zip(self.stages, self.sizes, strict=True):
            size = len(data) - (stage.overhead or 0) if known is None else known
            if size < 0:
                raise DecodeError(f"{stage.codec_id}: {len(data)} bytes hold no checksum")
            data = stage.decode(data, size)
            if len(data) != size:
                raise DecodeError(f"{stage.codec_id} decoded {len(data)} bytes, not {size}")
        data = self._normalised(data)
        if self.widened is not None:
            values = np.frombuffer(data, dtype=little_endian(self.dtype))
            return values.astype(self.widened).tobytes()
        return data if self.utf8_chars is None else utf8_fixed(data, self.utf8_chars)

    def _normalised(self, data: Buffer) -> bytes:
        """Little-endian, C order."""
        little = little_endian(self.dtype)
        if little == self.dtype and self.order == "C":
            return data if type(data) is bytes else bytes(data)
        values = np.frombuffer(data, dtype=self.dtype).reshape(self.chunks, order=self.order)
        return np.ascontiguousarray(values.astype(little, copy=False)).tobytes()


@dataclass(frozen=True)
class Array:
    """A checked ``.zarray``: its decoding, its rewritten text, its chunk-key rules."""

    meta: dict[str, Any]
    decoder: ChunkDecoder | StringDecoder  # StringDecoder: --decode-strings fixed
    separator: str
    text: bytes  # the rewritten .zarray
    #: What the served dtype adds to the array's ``.zattrs`` (CF time units).
    attributes: dict[str, Any] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        """The rank in the set's ``.zarray`` (the view presents rank 0 as rank 1)."""
        return len(self.decoder.chunks)

    @property
    def scalar(self) -> bool:
        """Rank 0 in the set: presented as one element along ``_scalar_``."""
        return self.rank == 0

    def is_chunk_name(self, name: str) -> bool:
        """Whether ``name`` (the part of a key after the array's path) is a chunk key."""
        if self.rank == 0:
            return name == "0"
        parts = name.split(self.separator)
        return len(parts) == self.rank and all(p.isdigit() for p in parts)

    def rewritten(self) -> bytes:
        return self.text


def _rewrite(meta: dict[str, Any], serving: Served) -> bytes:
    meta = as_one_element(meta) if meta["shape"] == [] else dict(meta)
    dtype = serving.dtype
    fill_value = serving.fill_value(meta.get("fill_value"))
    if dtype.names is not None:
        fill_value = _little_record_fill(fill_value, dtype)
    meta.update(
        dtype=dtype_json(little_endian(dtype)),
        order="C",
        compressor=None,
        filters=None,
        fill_value=repair_fill_value(fill_value),
    )
    return dump_json(repair_document(meta, ".zarray"))


def little_endian(dtype: np.dtype) -> np.dtype:
    """``dtype`` with every big-endian part little-endian (records field by field)."""
    if dtype.names is not None:
        return np.dtype([(name, little_endian(dtype[name])) for name in dtype.names])
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        return np.dtype((little_endian(base), shape))
    return dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype


def dtype_json(dtype: np.dtype) -> str | list[list[Any]]:
    """A dtype as a ``.zarray`` writes it: its string, or a record's list of fields."""
    if dtype.names is None:
        return dtype.str
    return [
        [name, *map(_field_json, dtype[name].subdtype or (dtype[name],))] for name in dtype.names
    ]


def _field_json(part: Any) -> Any:
    return part.str if isinstance(part, np.dtype) else list(part)


def _little_record_fill(value: Any, dtype: np.dtype) -> Any:
    """A record's fill value (base64 of its bytes) in the little-endian layout."""
    if not isinstance(value, str):
        return value
    try:
        raw = base64.b64decode(value, validate=True)
    except binascii.Error:
        return None
    if len(raw) != dtype.itemsize:
        return None
    record = np.frombuffer(raw, dtype=dtype).astype(little_endian(dtype))
    return base64.b64encode(record.tobytes()).decode()


def parse_zarray(
    text: bytes, *, string_width: int | None = None, fixed_strings: bool = False
) -> Array:
    """A ``.zarray``'s array, or :class:`ArrayRefused` saying why it is left out.  An
    array whose codecs refmount does not decode is not refused: its decoder carries the
    error, so its chunks fail to read (EIO) rather than vanish.  ``string_width``: a
    variable-length string array's longest value, to serve it as ``|S<width>``
    (:mod:`refmount.decode.strings`); without it such an array is refused.
    ``fixed_strings``: serve fixed-width string arrays (:mod:`refmount.decode.dtypes`)."""
    try:
        meta = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ArrayRefused(f".zarray is not JSON (or nested too deep): {exc}") from None
    if not isinstance(meta, dict) or meta.get("zarr_format") != 2:
        raise ArrayRefused(".zarray is not Zarr v2 array metadata")
    shape, chunks = meta.get("shape"), meta.get("chunks")
    if not (_dims(shape) and _dims(chunks)) or len(shape) != len(chunks):
        raise ArrayRefused(f"shape {shape!r} and chunks {chunks!r} are not dimensions alike")
    if len(chunks) > MAX_RANK or any(c <= 0 for c in chunks):
        raise ArrayRefused(f"chunks {chunks!r} are not positive sizes of at most {MAX_RANK} dims")
    if string_width is not None and vlen_codecs(meta) is not None:
        return _strings(meta, string_width)
    dtype = _dtype(meta.get("dtype"))
    try:
        serving = served(dtype, fixed_strings=fixed_strings)
    except DtypeRefused as exc:
        raise ArrayRefused(str(exc)) from None
    size = math.prod(chunks) * dtype.itemsize
    if size > MAX_CHUNK_BYTES:
        raise ArrayRefused(f"a chunk of {chunks} {dtype.str} is {size} bytes, over the bound")
    order = meta.get("order", "C")
    if order not in ("C", "F"):
        raise ArrayRefused(f"order {order!r} is neither C nor F")
    separator = meta.get("dimension_separator", ".")
    if separator not in (".", "/"):
        raise ArrayRefused(f"dimension_separator {separator!r} is neither '.' nor '/'")
    try:
        decoder = _decoder(meta, tuple(chunks), serving, order)
        rewritten = _rewrite(meta, serving)
    except RecursionError:
        raise ArrayRefused(".zarray is nested too deep") from None
    return Array(meta, decoder, separator, rewritten, serving.attributes)


def _strings(meta: dict[str, Any], width: int) -> Array:
    if not 0 < width <= MAX_WIDTH:
        raise ArrayRefused(f"strings of {width} bytes, wider than {MAX_WIDTH}")
    chunks = meta["chunks"]
    if meta.get("order", "C") != "C" and len(chunks) > 1:
        raise ArrayRefused("variable-length values in F order are not decoded")
    if math.prod(chunks) * width > MAX_CHUNK_BYTES:
        raise ArrayRefused(f"a chunk of {chunks} strings of {width} bytes is over the bound")
    separator = meta.get("dimension_separator", ".")
    if separator not in (".", "/"):
        raise ArrayRefused(f"dimension_separator {separator!r} is neither '.' nor '/'")
    shown = as_one_element(meta) if meta["shape"] == [] else dict(meta)
    shown.update(dtype=f"|S{width}", order="C", compressor=None, filters=None, fill_value="")
    text = dump_json(repair_document(shown, ".zarray"))
    return Array(meta, string_decoder(meta, width), separator, text)


def _dims(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 62 for n in value
    )


def _dtype(value: Any) -> np.dtype:
    if isinstance(value, list):  # a record: fields of plain types (FITS tables)
        try:
            return record_dtype(value, "dtype")
        except CodecError as exc:
            raise ArrayRefused(str(exc)) from None
    if value == "|O":
        raise ArrayRefused("variable-length values (dtype |O) have no fixed-size decoding")
    if not isinstance(value, str) or not _DTYPE.fullmatch(value):
        raise ArrayRefused(f"dtype {value!r} is not a plain fixed-size dtype")
    dtype = np.dtype(value)
    if dtype.itemsize == 0:
        raise ArrayRefused(f"dtype {value!r} has no size")
    return dtype


def _decoder(
    meta: Mapping[str, Any], chunks: tuple[int, ...], serving: Served, order: str
) -> ChunkDecoder:
    spec = {
        "compressor": meta.get("compressor"),
        "filters": meta.get("filters") or [],
        "dtype": dtype_json(serving.stored),
        "chunks": list(chunks),
        "order": order,
    }
    if serving.utf8_chars is not None:
        spec["utf8_chars"] = serving.utf8_chars
    if serving.dtype.itemsize != serving.stored.itemsize:
        spec["widened"] = little_endian(serving.dtype).str
    return chunk_decoder(spec)


def chunk_decoder(spec: Mapping[str, Any]) -> ChunkDecoder:
    """The decoding a spec names (``compressor``, ``filters``, the stored ``dtype``,
    ``chunks``, ``order``, and ``utf8_chars`` for ``<U<n>`` served as UTF-8, as checked
    by :func:`parse_zarray`): how the daemon makes it, and how a worker process makes it
    again from a decode job's parameters."""
    compressor, filters = spec["compressor"], spec["filters"]
    chunks, order = tuple(spec["chunks"]), spec["order"]
    listed, utf8, widened = spec["dtype"], spec.get("utf8_chars"), spec.get("widened")
    dtype = record_dtype(listed, "dtype") if isinstance(listed, list) else np.dtype(listed)
    stored = math.prod(chunks) * dtype.itemsize
    served = None if widened is None else np.dtype("<f4")
    size = stored if served is None else math.prod(chunks) * served.itemsize
    identity = json.dumps(
        [compressor, filters, dtype_json(dtype), chunks, order, utf8, widened],
        sort_keys=True, default=str,
    )  # fmt: skip
    key = hashlib.sha256(identity.encode()).hexdigest()[:32]
    plain = dict(spec)
    if utf8 is not None and (dtype.kind != "U" or utf8 != dtype.itemsize // 4):
        return ChunkDecoder(key, size, chunks, dtype, order, (), (), f"utf8_chars {utf8!r}")
    if widened is not None and (widened != "<f4" or dtype.kind != "f" or dtype.itemsize != 2):
        return ChunkDecoder(key, size, chunks, dtype, order, (), (), f"widened {widened!r}")
    if not isinstance(filters, list):
        return ChunkDecoder(key, size, chunks, dtype, order, (), (), f"filters {filters!r}")
    configs = [*([compressor] if compressor is not None else []), *reversed(filters)]
    try:
        stages = tuple(build_stage(config) for config in configs)
        sizes = _stage_sizes(stages, stored)
    except CodecError as exc:
        return ChunkDecoder(key, size, chunks, dtype, order, (), (), str(exc))
    return ChunkDecoder(
        key, size, chunks, dtype, order, stages, sizes, spec=plain, utf8_chars=utf8, widened=served
    )


def _stage_sizes(stages: tuple[Stage, ...], size: int) -> tuple[int | None, ...]:
    """Each stage's exact output size, the last stage's being the chunk's.  ``None``: a
    checksum's output before a compressor, its input less the checksum (the input's
    size is bounded by :attr:`ChunkDecoder.max_raw_size`)."""
    if not stages:
        return ()
    sizes = [size]
    for at in range(len(stages) - 1, 0, -1):
        before = stages[at].encoded_size(sizes[0])
        if before is None:
            unchecked = [s.codec_id for s in stages[:at] if s.overhead is None]
            if unchecked:
                raise CodecError(f"{stages[at].codec_id} after {unchecked[-1]} is not decoded")
            return (*[None] * at, *sizes)
        sizes.insert(0, before)
    return tuple(sizes)


__all__ = ["Array", "ArrayRefused", "ChunkDecoder", "DecodeError", "chunk_decoder", "parse_zarray"]

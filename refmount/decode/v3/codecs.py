"""A Zarr v3 codec pipeline as the Zarr v2 codecs that decode the same bytes.

A v3 array lists its codecs in encoding order: array-to-array codecs (``transpose``,
``numcodecs.delta`` ...), one array-to-bytes codec (``bytes``, with the byte order), then
bytes-to-bytes codecs (``gzip``, ``zstd``, ``blosc``, ``crc32c``, ``numcodecs.zlib`` ...).
A v2 ``.zarray`` says the same with ``order``, the dtype's byte order, ``filters`` (in
encoding order) and a ``compressor`` (last).  Translated so, a v3 chunk is decoded by the
v2 decoding (:mod:`refmount.decode.arrays`): the same allowlist, bounds and workers
(:mod:`refmount.decode.codecs`), no second decoder to trust.

A codec refmount does not know keeps its v3 name as the v2 id, which no builder has:
the array stays in the view and its chunks read as EIO naming the codec, as for v2.
A ``transpose`` to C or F order is the ``.zarray``'s ``order``; any other permutation,
``scale_offset`` and ``cast_value`` are filters of refmount's own
(:mod:`refmount.decode.arraycodecs`).  What cannot be said in v2 terms at all is
:class:`ArrayRefused` (the array is left out): array-to-array codecs over big-endian
bytes or beside a ``transpose`` to F order, codecs around ``sharding_indexed`` (whose own inner
codecs are translated alike: :mod:`refmount.decode.v3.shards`).  Variable-length values
(``vlen-utf8``, ``vlen-bytes``) are the v2 filter of the same id, dtype ``|O``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from refmount.decode.arrays import ArrayRefused
from refmount.decode.codecs import BUILDERS

#: v3 codecs of zarr-python's own that have a v2 numcodecs id decoding the same bytes.
CORE_BYTES_CODECS = {"gzip": "gzip", "zstd": "zstd", "blosc": "blosc", "crc32c": "crc32c"}
#: numcodecs codecs that work on arrays (zarr-python's ``numcodecs.zarr3`` wrappers).
ARRAY_TO_ARRAY = frozenset(
    ("delta", "fixedscaleoffset", "quantize", "bitround", "astype", "packbits")
)
#: zarr-extensions array codecs, decoded by zarr's own implementations
#: (:mod:`refmount.decode.arraycodecs`); the v3 tree gives them their dtypes.
VALUE_CODECS = frozenset(("scale_offset", "cast_value"))
NUMCODECS_PREFIX = "numcodecs."
_ENDIAN = {"little": "<", "big": ">"}


@dataclass
class Pipeline:
    """What a v3 codec list means in v2 terms.  ``endian`` is ``<``, ``>`` or ``None``
    (no ``bytes`` codec: one-byte values, or a codec refmount does not know)."""

    order: str = "C"
    endian: str | None = None
    vlen: str | None = None  # vlen-utf8 or vlen-bytes: variable-length values
    sharding: dict[str, Any] | None = None  # sharding_indexed's configuration
    filters: list[dict[str, Any]] = field(default_factory=list)
    compressor: dict[str, Any] | None = None


def _named(codec: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(codec, str):
        return codec, {}
    if isinstance(codec, dict) and isinstance(codec.get("name"), str):
        configuration = codec.get("configuration") or {}
        if isinstance(configuration, dict):
            return codec["name"], configuration
    raise ArrayRefused(f"codec {codec!r} is not a named codec")


def _v2_codec(name: str, configuration: dict[str, Any]) -> dict[str, Any]:
    """The v2 configuration of a bytes or array codec; an unknown name kept as the id."""
    if name in CORE_BYTES_CODECS:
        return {"id": CORE_BYTES_CODECS[name]}
    short = name.removeprefix(NUMCODECS_PREFIX)
    if name.startswith(NUMCODECS_PREFIX) and short in BUILDERS:
        return {**configuration, "id": short}
    return {"id": name}


def _transpose(configuration: dict[str, Any], rank: int) -> str | dict[str, Any]:
    """C or F (the orders a v2 ``.zarray`` says), or any other permutation as a
    ``transpose`` filter (its chunk shape and value size given by the v3 tree)."""
    order = configuration.get("order")
    if order == list(range(rank)):
        return "C"
    if order == list(reversed(range(rank))):
        return "F"
    if not isinstance(order, list) or sorted(order) != list(range(rank)):
        raise ArrayRefused(f"transpose order {order!r} is not a permutation of {rank} axes")
    return {"id": "transpose", "order": order}


def v2_pipeline(codecs: Any, rank: int) -> Pipeline:
    """The v2 equivalent of the v3 ``codecs`` of an array of ``rank`` dimensions."""
    if not isinstance(codecs, list) or not codecs:
        raise ArrayRefused(f"codecs {codecs!r} is not a list of codecs")
    pipeline = Pipeline()
    named = [_named(codec) for codec in codecs]
    array_codecs: list[dict[str, Any]] = []
    at = 0
    while at < len(named):  # array-to-array codecs, up to the array-to-bytes one
        name, configuration = named[at]
        short = name.removeprefix(NUMCODECS_PREFIX)
        if name == "transpose":
            order = _transpose(configuration, rank)
            if isinstance(order, dict):
                array_codecs.append(order)
            elif order != "C":
                pipeline.order = order
        elif name.startswith(NUMCODECS_PREFIX) and short in ARRAY_TO_ARRAY:
            array_codecs.append(_v2_codec(name, configuration))
        elif name in VALUE_CODECS:
            array_codecs.append({**configuration, "id": name})
        else:
            break
        at += 1
    if array_codecs and pipeline.order != "C":
        raise ArrayRefused("array codecs beside a transpose to F order are not decoded")
    if at < len(named):
        name, configuration = named[at]
        if name == "bytes":
            endian = configuration.get("endian")
            if endian is not None and endian not in _ENDIAN:
                raise ArrayRefused(f"bytes codec endian {endian!r}")
            pipeline.endian = _ENDIAN.get(endian) if endian else None
            at += 1
        elif name == "sharding_indexed":
            if at + 1 < len(named) or array_codecs or pipeline.order != "C":
                raise ArrayRefused("codecs around sharding_indexed are not decoded")
            pipeline.sharding = configuration
            return pipeline
        elif name in ("vlen-utf8", "vlen-bytes"):
            pipeline.vlen = name
            at += 1
    if any(c["id"] != "transpose" for c in array_codecs) and pipeline.endian == ">":
        raise ArrayRefused("array codecs over big-endian bytes are not decoded")
    bytes_codecs = [_v2_codec(name, configuration) for name, configuration in named[at:]]
    vlen = [{"id": pipeline.vlen}] if pipeline.vlen else []
    pipeline.filters = [*array_codecs, *vlen, *bytes_codecs[:-1]]
    pipeline.compressor = bytes_codecs[-1] if bytes_codecs else None
    return pipeline

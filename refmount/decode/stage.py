"""What every codec family's decoding is built from: a :class:`Stage`, the errors, and
the checks of parameters and sizes they share."""

from __future__ import annotations

import importlib.util
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

Buffer = bytes | bytearray | memoryview


class CodecError(Exception):
    """A codec configuration refmount does not decode (unknown id, bad parameters, a
    library not installed)."""


class DecodeError(Exception):
    """A chunk that does not decode to exactly the bytes it must."""


@dataclass(frozen=True)
class Stage:
    """One codec's decoding.  ``decode(data, size)`` returns exactly ``size`` bytes or
    raises :class:`DecodeError`; ``encoded_size(size)`` is the exact size of the input
    that decodes to ``size`` bytes, or ``None`` where only the data says (compressors).
    ``overhead``: the bytes a checksum adds, set for stages whose output is their input
    less that many bytes, so they may run before a compressor (Zarr v3 ``crc32c`` last).
    ``at_most(data, bound)``: a compressor's output of any size up to ``bound`` (what a
    variable-length chunk decompresses to is known only so far), or ``None``."""

    codec_id: str
    decode: Callable[[Buffer, int], Buffer]
    encoded_size: Callable[[int], int | None]
    overhead: int | None = None
    at_most: Callable[[Buffer, int], Buffer] | None = None


#: Plain numeric dtypes a filter may name: bool, integers, floats, any byte order.
_NUMERIC_DTYPE = re.compile(r"[<>|=]?(b1|[iu][1248]|f[248])")


def numeric_dtype(value: Any, what: str) -> np.dtype:
    if not isinstance(value, str) or not _NUMERIC_DTYPE.fullmatch(value):
        raise CodecError(f"{what} {value!r} is not a plain numeric dtype")
    return np.dtype(value)


def integer(config: Mapping[str, Any], name: str, low: int, high: int, default: int | None) -> int:
    value = config.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CodecError(f"{config['id']}: {name} {value!r} is not an integer in [{low}, {high}]")
    return value


def flag(config: Mapping[str, Any], name: str) -> bool:
    value = config.get(name, False)
    if not isinstance(value, bool):
        raise CodecError(f"{config['id']}: {name} {value!r} is not true or false")
    return value


def exact(data: Buffer, size: int, codec_id: str) -> Buffer:
    if len(data) != size:
        raise DecodeError(f"{codec_id} decoded {len(data)} bytes where the chunk has {size}")
    return data


def to_bytes(values: Any) -> Buffer:
    array = np.ascontiguousarray(values)
    return memoryview(array).cast("B") if array.ndim else array.tobytes()


def unknown_size(size: int) -> int | None:
    return None


def same_size(size: int) -> int | None:
    return size


_missing_logged: set[str] = set()


def needs(module: str, codec_id: str, extra: str) -> None:
    """:class:`CodecError` naming what to install when ``module`` is not installed
    (logged once per module)."""
    try:
        if importlib.util.find_spec(module) is not None:
            return
    except (ImportError, ValueError):  # blocked (sys.modules[module] = None) or broken
        pass
    message = f"codec {codec_id!r} needs {module}: pip install 'refmount[{extra}]'"
    if module not in _missing_logged:
        _missing_logged.add(module)
        log.warning("%s", message)
    raise CodecError(message)


#: A field's type in a record dtype: plain numbers or fixed-width text.
_FIELD_DTYPE = re.compile(r"[<>|=]?(b1|[iu][1248]|f[248]|c(8|16)|S\d{1,6}|a\d{1,6})")
_MAX_FIELDS = 4096


def record_dtype(value: Any, what: str) -> np.dtype:
    """A record dtype from its JSON: ``[[name, dtype], [name, dtype, shape], ...]``."""
    if not isinstance(value, list) or not 1 <= len(value) <= _MAX_FIELDS:
        raise CodecError(f"{what} is not a list of fields")
    fields: list[tuple[Any, ...]] = []
    for entry in value:
        if not isinstance(entry, list | tuple) or len(entry) not in (2, 3):
            raise CodecError(f"{what}: field {entry!r} is not [name, dtype(, shape)]")
        name, kind = entry[0], entry[1]
        if not isinstance(name, str) or not name or len(name) > 256:
            raise CodecError(f"{what}: field name {name!r}")
        if not isinstance(kind, str) or not _FIELD_DTYPE.fullmatch(kind):
            raise CodecError(f"{what}: field {name!r} has dtype {kind!r}, not a plain one")
        kind = kind.replace("a", "S")
        if len(entry) == 3:
            shape = entry[2]
            if not isinstance(shape, list | tuple) or not all(
                isinstance(n, int) and not isinstance(n, bool) and 0 < n < 1 << 20 for n in shape
            ):
                raise CodecError(f"{what}: field {name!r} has shape {shape!r}")
            fields.append((name, kind, tuple(shape)))
        else:
            fields.append((name, kind))
    try:
        dtype = np.dtype(fields)
    except (ValueError, TypeError) as exc:
        raise CodecError(f"{what}: {exc}") from None
    if dtype.itemsize == 0 or dtype.itemsize > 1 << 24:
        raise CodecError(f"{what}: records of {dtype.itemsize} bytes")
    return dtype

"""Arrow arrays built from, and read as, raw buffers.

``pa.array``, ``pa.table`` of a dict, ``Array.to_numpy`` and Python scalars in compute
calls all import pandas when it is installed: half a second of CPU and tens of MB resident,
for nothing.  The reference set code builds and reads its arrays through these helpers
instead, which copy little or nothing.
"""

from __future__ import annotations

from array import array
from itertools import accumulate

import numpy as np
import pyarrow as pa

from refmount.refs.rows import Texts, encode_texts

#: The pool for the arrays of a JSON set: glibc's heap, which reuses the pages the parse
#: has just freed.  Arrow's default (mimalloc) maps fresh memory, and first touching it
#: made indexing a million keys twice as slow on a VM (where a new page costs the most).
POOL = pa.system_memory_pool()


def numbers(values: array | np.ndarray, kind: pa.DataType) -> pa.Array:
    """A null-free integer array over the buffer of ``values`` (of ``kind``'s width)."""
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])


def view(column: pa.Array | pa.ChunkedArray, dtype: type[np.generic]) -> np.ndarray:
    """The values of a null-free integer column as a NumPy array (no copy for one chunk)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    values = np.frombuffer(column.buffers()[1], dtype) if len(column) else np.empty(0, dtype)
    return values[column.offset : column.offset + len(column)]


def offsets(column: pa.Array) -> np.ndarray:
    """The ``n + 1`` value offsets of a large_string or large_binary array."""
    buffer = column.buffers()[1]
    values = np.frombuffer(buffer, np.int64) if buffer is not None else np.zeros(1, np.int64)
    return values[column.offset : column.offset + len(column) + 1]


def mask(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A null-free boolean column as a NumPy bool array."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    buffer = column.buffers()[1]
    if buffer is None:
        return np.zeros(0, bool)
    bits = np.unpackbits(np.frombuffer(buffer, np.uint8), bitorder="little")
    return bits[column.offset : column.offset + len(column)].astype(bool)


def from_texts(texts: Texts) -> pa.Array:
    """The large_string array of ``texts``.  Lone surrogates (JSON allows ``"\\ud800"``)
    are not UTF-8: they become U+FFFD, which the path check refuses."""
    data, bounds = texts.data, texts.bounds
    if bounds is None:  # NUL-joined: the NULs mark the bounds, and go
        ends = np.flatnonzero(np.frombuffer(data, np.uint8) == 0)
        bounds = np.empty(texts.count + 1, np.int64)
        bounds[0] = 0
        bounds[1:-1] = ends - np.arange(len(ends))
        bounds[-1] = len(data) - len(ends)
        data = data.replace(b"\0", b"")
    result = pa.Array.from_buffers(
        pa.large_string(), texts.count, [None, pa.py_buffer(bounds), pa.py_buffer(data)]
    )
    if texts.ascii:
        return result
    try:
        result.validate(full=True)
        return result
    except pa.ArrowInvalid:
        return strings([t.decode("utf-8", "replace") for t in texts.items()])


def strings(values: list[str]) -> pa.Array:
    return from_texts(encode_texts(values))


def binaries(values: list[bytes | None]) -> pa.Array:
    """A large_binary array of ``values``, ``None`` being null."""
    present = np.fromiter((v is not None for v in values), bool, len(values))
    sizes = (0 if v is None else len(v) for v in values)
    return pa.Array.from_buffers(
        pa.large_binary(),
        len(values),
        [
            pa.py_buffer(np.packbits(present, bitorder="little")),
            pa.py_buffer(array("q", accumulate(sizes, initial=0))),
            pa.py_buffer(b"".join(filter(None, values))),
        ],
    )

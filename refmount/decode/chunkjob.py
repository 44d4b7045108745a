"""The ``decode`` job: one raw chunk to its decoded bytes, run in a worker process
(:mod:`refmount.workers`) so that the C libraries parsing it cannot take the mount down.

Its parameters are the decoder's spec (:func:`refmount.decode.arrays.chunk_decoder`):
the worker builds the same allowlisted stages from it, checking every parameter again.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from refmount.decode.arrays import ChunkDecoder, chunk_decoder
from refmount.decode.codecs import Buffer, DecodeError

#: The decoder libraries a worker loads before its first job, where installed: loading
#: ecCodes or imagecodecs takes long enough to count against a job's deadline.
LIBRARIES = (
    "eccodes",
    "gribberish",
    "imagecodecs",
    "zstandard",
    "numcodecs.blosc",
    "numcodecs.lz4",
)


def prepare() -> None:
    """Load the installed decoder libraries (a worker calls this once, at its start)."""
    for name in LIBRARIES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


@lru_cache(maxsize=64)
def _decoder(spec_text: str) -> ChunkDecoder:
    return chunk_decoder(json.loads(spec_text))


def decode_chunk(params: Mapping[str, Any], payload: memoryview, size: int) -> Buffer:
    decoder = _decoder(json.dumps(params, sort_keys=True))
    if decoder.size != size:
        raise DecodeError(f"a decoder of {decoder.size}-byte chunks asked for {size} bytes")
    return decoder.decode(payload)

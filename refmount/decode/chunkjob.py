"""The decoding jobs, run in a worker process (:mod:`refmount.workers`) so that the C
libraries parsing a reference set's bytes cannot take the mount down:

- ``decode``: one raw chunk to its decoded bytes.  Its parameters are the decoder's
  spec (:func:`refmount.decode.arrays.chunk_decoder`): the worker builds the same
  allowlisted stages from it, checking every parameter again;
- ``decode-run``: several raw chunks of one decoder lying in one payload (a run of a
  shard's inner chunks, :mod:`refmount.decode.v3.shards`) to their decoded bytes, one
  after another (parameters ``decoder``, a spec, and ``spans``, each chunk's
  ``[offset, length]`` in the payload): one job instead of one per chunk;
- ``decode-strings``: a variable-length string chunk to fixed-width values
  (:class:`refmount.decode.strings.StringDecoder`; parameters ``meta`` and ``width``);
- ``measure-strings``: the longest value of a variable-length string chunk, as 8
  little-endian bytes (parameters: ``meta``).
"""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from refmount.decode.arrays import ChunkDecoder, chunk_decoder
from refmount.decode.codecs import Buffer, CodecError, DecodeError
from refmount.decode.strings import (
    MAX_WIDTH,
    StringDecoder,
    checked_vlen_meta,
    string_decoder,
    string_measure,
)

#: The size of a ``measure-strings`` job's output.
MEASURE_SIZE = 8

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


def decode_run(params: Mapping[str, Any], payload: memoryview, size: int) -> Buffer:
    decoder = _decoder(json.dumps(params.get("decoder"), sort_keys=True))
    spans = params.get("spans")
    if not isinstance(spans, list) or len(spans) * decoder.size != size:
        raise DecodeError(f"a run of {decoder.size}-byte chunks asked for {size} bytes")
    out = bytearray(size)
    for i, span in enumerate(spans):
        if not (
            isinstance(span, list)
            and len(span) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in span)
            and span[0] + span[1] <= len(payload)
        ):
            raise DecodeError(f"span {span!r} is not within the run's {len(payload)} bytes")
        chunk = decoder.decode(payload[span[0] : span[0] + span[1]])
        if len(chunk) != decoder.size:
            raise DecodeError(f"a chunk decoded to {len(chunk)} bytes, not {decoder.size}")
        out[i * decoder.size : (i + 1) * decoder.size] = chunk
    return out


@lru_cache(maxsize=64)
def _string_decoder(meta_text: str, width: int) -> StringDecoder:
    if isinstance(width, bool) or not 0 < width <= MAX_WIDTH:
        raise CodecError(f"strings of width {width!r}")
    return string_decoder(checked_vlen_meta(json.loads(meta_text)), width)


def decode_strings(params: Mapping[str, Any], payload: memoryview, size: int) -> Buffer:
    width = params.get("width")
    if not isinstance(width, int):
        raise CodecError(f"strings of width {width!r}")
    decoder = _string_decoder(json.dumps(params.get("meta"), sort_keys=True), width)
    if decoder.size != size:
        raise DecodeError(f"a decoder of {decoder.size}-byte chunks asked for {size} bytes")
    return decoder.decode(payload)


def measure_strings(params: Mapping[str, Any], payload: memoryview, size: int) -> Buffer:
    if size != MEASURE_SIZE:
        raise DecodeError(f"a measure is {MEASURE_SIZE} bytes, not {size}")
    measure = string_measure(checked_vlen_meta(params.get("meta")))
    return measure.longest(payload).to_bytes(MEASURE_SIZE, "little")

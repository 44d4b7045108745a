"""The data of ``throughput.py``'s decoded workload (W3z): a Zarr v2 array whose chunks are
zlib-compressed, back to back in one remote file, and its reference set.

The array is ``field``: float32, shape ``(chunks, 256, 256)``, chunks ``(1, 256, 256)``
(64 Ki values, 256 KiB decoded), ``"compressor": {"id": "zlib", "level": 4}``.  Each
chunk is a smooth field (two waves drifting from chunk to chunk, around 280) plus
Gaussian noise (sigma 0.3), stored to 1/64 (as bit-rounded model output is): zlib
keeps about 46 % of it (ratio ~2.2), where random bytes would not shrink and zeros
would vanish.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np

ARRAY = "field"
SIDE = 256
DECODED = SIDE * SIDE * 4
LEVEL = 4
ZARRAY: dict[str, Any] = {
    "zarr_format": 2,
    "chunks": [1, SIDE, SIDE],
    "dtype": "<f4",
    "compressor": {"id": "zlib", "level": LEVEL},
    "filters": None,
    "fill_value": "NaN",
    "order": "C",
}
ZATTRS = {"_ARRAY_DIMENSIONS": ["time", "y", "x"], "units": "K"}


def chunk_values(index: int, rng: np.random.Generator) -> bytes:
    """Chunk ``index``'s decoded bytes."""
    y, x = np.mgrid[0:SIDE, 0:SIDE].astype(np.float64) / SIDE
    drift = index / 400
    field = (
        280.0
        + 12.0 * np.sin(2 * np.pi * (x + drift)) * np.cos(2 * np.pi * y)
        + 4.0 * np.sin(6 * np.pi * (x + y) + index / 30)
        + rng.normal(0.0, 0.3, (SIDE, SIDE))
    )
    return (np.round(field * 64) / 64).astype("<f4").tobytes()


def write_chunks(data: Path, chunks: int) -> list[tuple[int, int]]:
    """``zarr.bin`` (every chunk compressed, back to back) in ``data``, built once; the
    (offset, length) of each chunk."""
    blob, index = data / "zarr.bin", data / f"zarr-{chunks}.json"
    if index.exists() and blob.exists():
        extents = [tuple(pair) for pair in json.loads(index.read_text())]
        if len(extents) == chunks and blob.stat().st_size == sum(n for _, n in extents):
            return extents  # type: ignore[return-value]
    rng = np.random.default_rng(22)
    extents, offset = [], 0
    with open(blob, "wb") as out:
        for k in range(chunks):
            compressed = zlib.compress(chunk_values(k, rng), LEVEL)
            out.write(compressed)
            extents.append((offset, len(compressed)))
            offset += len(compressed)
    index.write_text(json.dumps(extents))
    return extents


def write_refs(path: Path, url: str, extents: list[tuple[int, int]]) -> list[str]:
    """The reference set at ``path``: ``.zgroup``, the array's ``.zarray`` and ``.zattrs``
    and one key per chunk of ``url``/zarr.bin; returns the chunk keys, in chunk order."""
    keys = [f"{ARRAY}/{k}.0.0" for k in range(len(extents))]
    refs: dict[str, Any] = {
        ".zgroup": json.dumps({"zarr_format": 2}),
        f"{ARRAY}/.zarray": json.dumps({**ZARRAY, "shape": [len(extents), SIDE, SIDE]}),
        f"{ARRAY}/.zattrs": json.dumps(ZATTRS),
    }
    for key, (offset, length) in zip(keys, extents, strict=True):
        refs[key] = [f"{url}/zarr.bin", offset, length]
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return keys

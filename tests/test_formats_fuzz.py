"""Each decoder entry point fed truncated, bit-flipped, oversized and random chunks
(seeded, bounded in count) through real worker processes: every job returns exactly its
chunk's bytes or fails with a message, and the pool then decodes a good chunk right."""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Iterator

import numpy as np
import pytest
import trio

from refmount.decode.arrays import parse_zarray
from refmount.workers import JobFailed, PoolConfig, WorkerPool
from tests.format_builders import GRID, field, grib_message, message_values

imagecodecs = pytest.importorskip("imagecodecs")
pytest.importorskip("eccodes")

MUTATIONS_PER_CODEC = 24


def spec(shape: list[int], dtype: str, compressor: dict | None, filters: list | None = None):
    meta = {
        "zarr_format": 2,
        "shape": shape,
        "chunks": shape,
        "dtype": dtype,
        "compressor": compressor,
        "filters": filters,
        "fill_value": None,
        "order": "C",
    }
    decoder = parse_zarray(json.dumps(meta).encode()).decoder
    assert decoder.error is None, decoder.error
    return decoder.spec, decoder.size


def samples() -> dict[str, tuple[dict, int, bytes, bytes]]:
    """codec -> (spec, size, a good raw chunk, its decoded bytes)."""
    values = field(1)
    message = grib_message("t", "isobaricInhPa", 500, "grid_complex", values)
    values = message_values(message)
    counts = np.arange(4096, dtype="<u2") % 251
    tile = np.random.default_rng(3).integers(0, 255, (16, 16, 3), dtype=np.uint8)
    floats = np.linspace(0, 1, 32 * 32, dtype="<f4").reshape(32, 32)
    grid = [*GRID]
    out = {
        "grib": (
            *spec(grid, "<f8", None, [{"id": "grib", "var": "t", "dtype": "float64"}]),
            message,
            values.tobytes(),
        ),
        "gribberish": (
            *spec(grid, "<f8", None, [{"id": "gribberish", "var": "t"}]),
            message,
            values.tobytes(),
        ),
    }
    for codec, encode in (
        ("imagecodecs_lzw", imagecodecs.lzw_encode),
        ("imagecodecs_packbits", imagecodecs.packbits_encode),
        ("imagecodecs_zstd", imagecodecs.zstd_encode),
        ("imagecodecs_zlib", imagecodecs.zlib_encode),
        ("imagecodecs_deflate", imagecodecs.deflate_encode),
        ("zlib", zlib.compress),
    ):
        out[codec] = (
            *spec([4096], "<u2", {"id": codec}),
            encode(counts.tobytes()),
            counts.tobytes(),
        )
    out["imagecodecs_jpeg"] = (
        *spec([16, 16, 3], "|u1", {"id": "imagecodecs_jpeg"}),
        imagecodecs.jpeg8_encode(tile, level=95),
        imagecodecs.jpeg8_decode(imagecodecs.jpeg8_encode(tile, level=95)).tobytes(),
    )
    out["imagecodecs_webp"] = (
        *spec([16, 16, 3], "|u1", {"id": "imagecodecs_webp"}),
        imagecodecs.webp_encode(tile, lossless=True),
        tile.tobytes(),
    )
    predicted = {"shape": [32, 32], "dtype": "<f4", "axis": -1}
    out["imagecodecs_floatpred"] = (
        *spec([32, 32], "<f4", {"id": "zlib"}, [{"id": "imagecodecs_floatpred", **predicted}]),
        zlib.compress(imagecodecs.floatpred_encode(floats, axis=-1).tobytes()),
        floats.tobytes(),
    )
    ramp = (np.arange(32 * 32, dtype="<u2") * 3).reshape(32, 32)
    out["imagecodecs_delta"] = (
        *spec(
            [32, 32],
            "<u2",
            {"id": "imagecodecs_lzw"},
            [{"id": "imagecodecs_delta", **predicted, "dtype": "<u2"}],
        ),
        imagecodecs.lzw_encode(imagecodecs.delta_encode(ramp, axis=-1).tobytes()),
        ramp.tobytes(),
    )
    record = [["x", "<f8"], ["n", "<i4"]]
    records = np.array([(1.5, 3), (2.5, -4), (9.0, 7)], dtype=[("x", "<f8"), ("n", "<i4")])
    out["record_member"] = (
        *spec([3], "<i4", None, [{"id": "record_member", "member": "n", "dtype": record}]),
        records.tobytes(),
        records["n"].tobytes(),
    )
    return out


def mutations(raw: bytes, rng: random.Random) -> Iterator[bytes]:
    for _ in range(MUTATIONS_PER_CODEC // 4):
        yield raw[: rng.randrange(len(raw))]  # truncated
        flipped = bytearray(raw)
        for _ in range(rng.randint(1, 8)):
            flipped[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        yield bytes(flipped)  # bit-flipped
        yield raw + rng.randbytes(rng.randint(1, 4096))  # oversized
        yield rng.randbytes(rng.randint(1, 2 * len(raw)))  # random


@pytest.mark.parametrize("codec", sorted(samples()))
def test_a_decoder_fed_broken_chunks_answers_exactly_or_fails_and_goes_on(codec: str) -> None:
    spec_, size, raw, expected = samples()[codec]
    rng = random.Random(f"refmount-{codec}")
    pool = WorkerPool(PoolConfig(workers=1, deadline=60.0, memory_limit=2 << 30))

    async def fuzz() -> tuple[int, int]:
        assert bytes(await pool.submit("decode", spec_, raw, size)) == expected
        decoded = failed = 0
        for broken in mutations(raw, rng):
            try:
                out = await pool.submit("decode", spec_, broken, size)
            except JobFailed as exc:
                assert str(exc), codec
                failed += 1
            else:
                assert len(out) == size
                decoded += 1
        assert bytes(await pool.submit("decode", spec_, raw, size)) == expected
        return decoded, failed

    try:
        decoded, failed = trio.run(fuzz)
    finally:
        pool.close()
    assert decoded + failed == MUTATIONS_PER_CODEC
    assert failed > 0

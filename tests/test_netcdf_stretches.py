"""A variable chunked along its last axis, ``(N, M)`` chunked ``(N, 1)``, larger than a
quarter of the memory budget (issue 40, item 8): read in file order, its chunks are
decoded once per stretch of rows, not once per read; through a mount, ``cp`` of the
file equals its values."""

from __future__ import annotations

import base64
import json
import subprocess
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import trio

from refmount.cache import BlockCache
from refmount.decode.reads import DecodedReads
from refmount.fetch import Fetcher
from refmount.netcdf.reads import NetcdfReads
from refmount.refs import open_refset
from refmount.workers import InProcessRunner
from tests.support.mounting import REFMOUNT, Mounted, child_env

ROWS, COLUMNS = 64, 2048  # float64: 1 MiB, a chunk per column of 512 bytes


def columns_set(directory: Path) -> tuple[Path, np.ndarray]:
    values = np.arange(ROWS * COLUMNS, dtype="<f8").reshape(ROWS, COLUMNS) * 0.5
    meta = {
        "zarr_format": 2, "shape": [ROWS, COLUMNS], "chunks": [ROWS, 1], "dtype": "<f8",
        "compressor": {"id": "zlib", "level": 1}, "filters": None, "order": "C",
        "fill_value": None,
    }  # fmt: skip
    refs = {
        ".zgroup": '{"zarr_format": 2}',
        "v/.zarray": json.dumps(meta),
        "v/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["row", "column"]}),
    }
    for column in range(COLUMNS):
        if column == 7:
            continue  # an absent chunk: netCDF's default fill value
        data = zlib.compress(np.ascontiguousarray(values[:, column]).tobytes(), 1)
        refs[f"v/0.{column}"] = "base64:" + base64.b64encode(data).decode()
    values[:, 7] = 9.969209968386869e36
    path = directory / "columns.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path, values


def test_a_sequential_read_decodes_each_chunk_once_per_stretch(tmp_path: Path) -> None:
    refs, values = columns_set(tmp_path)
    blocks = BlockCache(Fetcher(), budget=512 << 10)  # half the variable
    reads = NetcdfReads(DecodedReads(blocks, InProcessRunner(2)), "auto")
    view = reads.view(open_refset(str(refs)), "columns")

    async def main() -> bytes:
        file_id = await view.find_file("columns.nc")
        assert file_id is not None
        ref = view.ref(file_id)
        assert ref.url is not None and ref.length is not None
        parts = []
        for start in range(0, ref.length, 128 << 10):  # as the kernel reads: 128 KiB
            end = min(ref.length, start + (128 << 10))
            parts.append(bytes(await reads.read_buffer(ref.url, start, end)))
        return b"".join(parts)

    whole = trio.run(main)
    assert whole[-values.nbytes :] == values.astype(">f8").tobytes()
    stats = reads.stats()
    assert stats["decoded_chunks"] == COLUMNS - 1  # each chunk once (one absent)
    assert stats.get("netcdf_stretches") == 1  # 1 MiB: one stretch


def test_cp_of_a_column_chunked_variable_equals_its_values(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    refs, values = columns_set(tmp_path)
    mounted = mount(refs, "--netcdf", "--cache-size", "1M")
    copy = tmp_path / "copy.nc"
    subprocess.run(["cp", str(mounted.mountpoint / "columns.nc"), str(copy)], check=True)
    data = copy.read_bytes()
    assert data[-values.nbytes :] == values.astype(">f8").tobytes()


def test_check_netcdf_names_a_variable_read_at_a_cost(tmp_path: Path) -> None:
    """``(65536, 128)`` doubles chunked ``(65536, 1)``: a 32 MiB stretch holds half a
    chunk's rows, so a read in file order decodes each chunk twice."""
    meta = {
        "zarr_format": 2, "shape": [65536, 128], "chunks": [65536, 1], "dtype": "<f8",
        "compressor": {"id": "zlib", "level": 1}, "filters": None, "order": "C",
        "fill_value": None,
    }  # fmt: skip
    refs: dict[str, object] = {".zgroup": '{"zarr_format": 2}', "v/.zarray": json.dumps(meta)}
    for column in range(128):  # metadata is all check reads
        refs[f"v/0.{column}"] = [str(tmp_path / "chunks.bin"), column * 1000, 1000]
    path = tmp_path / "tall.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    done = subprocess.run(
        [*REFMOUNT, "check", "--netcdf", "--allow-local", str(path)],
        capture_output=True, text=True, timeout=120, env=child_env(),
    )  # fmt: skip
    assert "v  " in done.stdout, done.stdout + done.stderr
    line = next(line for line in done.stdout.splitlines() if line.strip().startswith("v "))
    assert "meets 64M of chunks" in line and "decodes each chunk 2 times (128M)" in line

"""A Parquet reference set read over HTTP: found without directory listings, and a
stalled record file fails only the keys it holds, within the deadline."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import kerchunk.df

CHUNK = 1000


def build(root: Path, name: str, data_url: str) -> dict:
    """A 1-D array of 6 chunks in records of 2, its data in ``data.bin``."""
    refs = {
        ".zgroup": json.dumps({"zarr_format": 2}),
        "x/.zarray": json.dumps({
            "shape": [6 * CHUNK], "chunks": [CHUNK], "dtype": "|u1", "compressor": None,
            "fill_value": 0, "filters": None, "order": "C", "zarr_format": 2,
        }),
        "x/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["i"]}),
    }  # fmt: skip
    for i in range(6):
        refs[f"x/{i}"] = [data_url, i * CHUNK, CHUNK]
    kerchunk.df.refs_to_dataframe({"version": 1, "refs": refs}, str(root / name), record_size=2)
    return refs


def test_parquet_over_http_and_a_stalled_record(http, http_root: Path, mount) -> None:
    data = bytes(range(256)) * (6 * CHUNK // 256 + 1)
    (http_root / "pq-data.bin").write_bytes(data)
    build(http_root, "pq.parq", f"{http.url}/pq-data.bin")
    mounted = mount(f"{http.url}/pq.parq", "--timeout", "2", "--retries", "0")
    root = mounted.mountpoint
    assert sorted(p.name for p in (root / "x").iterdir()) == [
        ".zarray", ".zattrs", "0", "1", "2", "3", "4", "5",
    ]  # fmt: skip
    # (listing loaded every record; a fresh mount shows a stall on first use)
    mounted.stop()
    http.fault("/pq.parq/x/refs.1.parq", "stall", count=-1)
    root = mount(f"{http.url}/pq.parq", "--timeout", "2", "--retries", "0").mountpoint
    assert (root / "x" / "0").read_bytes() == data[:CHUNK]  # record 0 answers
    started = time.monotonic()
    result = subprocess.run(["stat", str(root / "x" / "2")], capture_output=True, text=True)
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert "Input/output error" in result.stderr
    assert elapsed < 10, f"a stalled record held stat for {elapsed:.1f} s"
    assert (root / "x" / "5").read_bytes() == data[5 * CHUNK : 6 * CHUNK]  # record 2

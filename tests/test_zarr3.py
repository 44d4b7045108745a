"""zarr 3 through the mount: a chunk whose target is gone is an error, never fill values.

zarr 3's LocalStore reads a chunk file and takes ``FileNotFoundError`` to mean "this chunk
was never written", so it returns the array's fill value for it.  A key that is in the
reference set must therefore never answer ENOENT: a target that answers 404 over HTTP, or a
local target deleted after mounting, is an I/O error (EIO) and zarr raises.  A key that is
not in the reference set at all is a chunk that was never written: ENOENT, and zarr fills.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zarr

from tests.conftest import Mounted
from tests.support.servers import RangeServer

CHUNK = 25
FILL = -9.5
VALUES = np.arange(4 * CHUNK, dtype="<f8") * 1.25 + 0.5  # no value equals FILL


def zarray() -> str:
    return json.dumps(
        {
            "zarr_format": 2,
            "shape": [4 * CHUNK],
            "chunks": [CHUNK],
            "dtype": "<f8",
            "compressor": None,
            "filters": None,
            "fill_value": FILL,
            "order": "C",
        }
    )


def chunk_bytes(i: int) -> bytes:
    return VALUES[i * CHUNK : (i + 1) * CHUNK].tobytes()


def write_chunk(directory: Path, name: str, i: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(b"head" + chunk_bytes(i))  # an offset, as real references have
    return path


def range_ref(url: str, i: int) -> list:
    return [url, 4, len(chunk_bytes(i))]


@pytest.fixture
def broken_set(http: RangeServer, http_root: Path, tmp_path: Path) -> tuple[Path, Path]:
    """Chunks 0 and 3 readable (local, HTTP); chunk 1 a local file deleted after the set is
    written; chunk 2 a URL the HTTP server has never had (404)."""
    local = tmp_path / "targets"
    served = http_root / "zarr3"
    c0 = write_chunk(local, "c0.bin", 0)
    c1 = write_chunk(local, "c1.bin", 1)
    write_chunk(served, "c3.bin", 3)
    refs = {
        "version": 1,
        "refs": {
            ".zgroup": '{"zarr_format":2}',
            "a/.zarray": zarray(),
            "a/.zattrs": '{"_ARRAY_DIMENSIONS":["x"]}',
            "a/0": range_ref(c0.as_uri(), 0),
            "a/1": range_ref(c1.as_uri(), 1),
            "a/2": range_ref(f"{http.url}/zarr3/never-there.bin", 2),
            "a/3": range_ref(f"{http.url}/zarr3/c3.bin", 3),
        },
    }
    path = tmp_path / "refs.json"
    path.write_text(json.dumps(refs))
    return path, c1


def test_missing_targets_raise_through_zarr3(
    mount: Callable[..., Mounted], broken_set: tuple[Path, Path]
) -> None:
    refs, deleted = broken_set
    m = mount(refs)
    deleted.unlink()
    array_path = str(m.mountpoint / "a")

    # The readable chunks read right, so the set and the mount are sound.
    array = zarr.open_array(array_path, mode="r")
    np.testing.assert_array_equal(array[:CHUNK], VALUES[:CHUNK])
    np.testing.assert_array_equal(array[3 * CHUNK :], VALUES[3 * CHUNK :])

    # Each gone target, alone and within a whole read, is an error: never FILL.
    outcomes = {}
    for case, selection in [
        ("chunk 1 (deleted local file)", slice(CHUNK, 2 * CHUNK)),
        ("chunk 2 (HTTP 404)", slice(2 * CHUNK, 3 * CHUNK)),
        ("whole array", slice(None)),
    ]:
        try:
            values = zarr.open_array(array_path, mode="r")[selection]
        except OSError as error:
            outcomes[case] = errno.errorcode.get(error.errno or 0, repr(error))
        else:
            outcomes[case] = f"{np.count_nonzero(values == FILL)} fill values, no error"
    assert outcomes == dict.fromkeys(outcomes, "EIO")

    # The keys are there, whatever their targets: stat answers, a read is EIO.
    for key in ("a/1", "a/2"):
        assert os.stat(m.mountpoint / key).st_size == CHUNK * 8
        with open(m.mountpoint / key, "rb") as f, pytest.raises(OSError) as raised:
            f.read()
        assert raised.value.errno == errno.EIO, key


def test_key_absent_from_the_set_reads_as_fill_value(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    targets = tmp_path / "targets"
    refs: dict = {
        ".zgroup": '{"zarr_format":2}',
        "a/.zarray": zarray(),
        **{
            f"a/{i}": range_ref(write_chunk(targets, f"c{i}.bin", i).as_uri(), i) for i in (0, 1, 3)
        },
    }  # no "a/2": that chunk was never written
    path = tmp_path / "refs.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    m = mount(path)

    with pytest.raises(FileNotFoundError):
        os.stat(m.mountpoint / "a" / "2")
    values = zarr.open_array(str(m.mountpoint / "a"), mode="r")[:]
    expected = VALUES.copy()
    expected[2 * CHUNK : 3 * CHUNK] = FILL
    np.testing.assert_array_equal(values, expected)

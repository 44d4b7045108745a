"""``--decode-strings fixed``: variable-length string arrays served as fixed-width ``|S<n>``
(NUL padded, ``n`` the longest value), for kerchunk sets and Zarr v3 trees alike, and
which readers read them: zarr and Debian's GDAL 3.6 read the values; the rasterio wheel's
GDAL 3.12 raster API refuses any non-numeric array; Debian's ncdump 4.9.0 dies (SIGSEGV)
on a tree holding a string array, which is why the default leaves them out.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path

import kerchunk.hdf
import numpy as np
import pytest
import zarr

from refmount.decode import ArrayRefused, DecodeError, parse_zarray
from refmount.decode.strings import StringDecoder
from tests.conftest import Mounted
from tests.support import reader_runs
from tests.support.mounting import REFMOUNT, child_env
from tests.support.reader_datasets import STATIONS, Dataset, write_cf_netcdf4
from tests.support.v3_sets import icechunk_refs, store_refs, write_refs


def vlen_chunk(values: list[bytes]) -> bytes:
    return struct.pack("<I", len(values)) + b"".join(struct.pack("<I", len(v)) + v for v in values)


def string_zarray(**fields: object) -> bytes:
    meta = {
        "zarr_format": 2, "shape": [5], "chunks": [3], "dtype": "|O", "fill_value": None,
        "order": "C", "filters": [{"id": "vlen-utf8"}], "compressor": None,
    }  # fmt: skip
    return json.dumps({**meta, **fields}).encode()


def test_values_are_nul_padded_to_the_width() -> None:
    array = parse_zarray(string_zarray(), string_width=6)
    assert json.loads(array.rewritten())["dtype"] == "|S6"
    assert isinstance(array.decoder, StringDecoder) and array.decoder.size == 18
    got = array.decoder.decode(vlen_chunk(["Ås".encode(), b"", b"abcdef"]))
    assert got == "Ås".encode() + b"\0\0\0" + b"\0" * 6 + b"abcdef"


@pytest.mark.parametrize(
    ("chunk", "error"),
    [
        (vlen_chunk([b"a", b"b"]), "without its 3 values"),
        (vlen_chunk([b"a", b"b", b"c"]) + b"x", "1 bytes after"),
        (vlen_chunk([b"a", b"b", b"c"])[:-1], "ends inside a value"),
        (vlen_chunk([b"a", b"b", b"toolong"]), "wider than 6"),
        (b"\x03\0\0", "without its 3 values"),
    ],
)
def test_a_malformed_or_changed_chunk_is_an_error(chunk: bytes, error: str) -> None:
    decoder = parse_zarray(string_zarray(), string_width=6).decoder
    with pytest.raises(DecodeError, match=error):
        decoder.decode(chunk)


def test_a_compressed_chunk_decompresses_only_as_far_as_its_values_can_take() -> None:
    zlib_array = parse_zarray(string_zarray(compressor={"id": "zlib"}), string_width=2)
    assert zlib_array.decoder.decode(zlib.compress(vlen_chunk([b"a", b"bc", b""]))) == (
        b"a\0bc\0\0"
    )
    bomb = zlib.compress(vlen_chunk([b"a", b"b", b"c" * 100000]))
    with pytest.raises(DecodeError, match="more than"):
        zlib_array.decoder.decode(bomb)


def test_without_a_width_a_string_array_is_left_out() -> None:
    with pytest.raises(ArrayRefused, match="variable-length"):
        parse_zarray(string_zarray())


# -- through mounts -------------------------------------------------------------------------


def readers(mnt: Path, name: str, values: np.ndarray) -> dict[str, str]:
    texts = [v.decode() if isinstance(v, bytes) else str(v) for v in values]
    expected = np.array(texts, dtype=object)
    return {
        "zarr": str(reader_runs.zarr3(mnt, name, expected)),
        "gdalmdiminfo": str(reader_runs.gdalmdiminfo(mnt, name, expected)),
        "ncdump": str(reader_runs.ncdump(mnt, name, expected, None)),
    }


READ = {"zarr": "equal", "gdalmdiminfo": "equal", "ncdump": "crash: signal 11"}


def test_a_kerchunk_string_variable_as_fixed_width_bytes(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    path = write_cf_netcdf4(tmp_path / "cf.nc")
    with warnings.catch_warnings(), path.open("rb") as f:
        warnings.simplefilter("ignore")
        refs = kerchunk.hdf.SingleHdf5ToZarr(f, path.as_uri(), inline_threshold=100).translate()
    refs_path = write_refs(refs, tmp_path / "refs.json")
    mounted = mount(refs_path, "--decode", "--decode-strings", "fixed")
    root = mounted.mountpoint
    width = max(len(s.encode()) for s in STATIONS)
    assert json.loads((root / "station_name" / ".zarray").read_text())["dtype"] == f"|S{width}"
    assert (root / "station_name" / "0").read_bytes() == b"".join(
        s.encode().ljust(width, b"\0") for s in STATIONS
    )
    assert readers(root, "station_name", np.array(STATIONS, dtype=object)) == READ
    outcome = reader_runs.rasterio_gdal(root, {"station_name": np.array(STATIONS)}, tmp_path)
    assert str(outcome["station_name"]) == (
        "refused: Only arrays with numeric data types can be exposed as classic GDALDataset"
    )
    default = mount(refs_path, "--decode")
    assert "station_name" not in os.listdir(default.mountpoint)


@pytest.mark.filterwarnings("ignore::zarr.errors.UnstableSpecificationWarning")
def test_v3_strings_fixed_and_variable(mount: Callable[..., Mounted], tmp_path: Path) -> None:
    """zarr 3's ``string`` (vlen-utf8 + zstd), ``fixed_length_utf32`` and
    ``null_terminated_bytes`` arrays, with edge chunks."""
    store = tmp_path / "s.zarr"
    group = zarr.open_group(store, mode="w")
    values = {
        "names": np.array(["Zürich", "Ås", "", "Genève"], dtype="U6"),
        "codes": np.array([b"AB", b"C", b"", b"DEF"], dtype="S3"),
        "text": np.array(["a", "bc", "Zürich", "x"], dtype=object),
    }
    for name, data in values.items():
        dtype = str if data.dtype == object else data.dtype
        group.create_array(name, shape=(4,), chunks=(3,), dtype=dtype, dimension_names=["n"])
        group[name][...] = data
    refs = write_refs(store_refs(store), tmp_path / "refs.json")
    mounted = mount(refs, "--decode", "--decode-strings", "fixed")
    root = mounted.mountpoint
    assert sorted(os.listdir(root)) == [".zattrs", ".zgroup", ".zmetadata", *sorted(values)]
    assert json.loads((root / "text" / ".zarray").read_text())["dtype"] == "|S7"
    assert (root / "text" / "1").read_bytes() == b"x" + b"\0" * 20  # an edge chunk
    consolidated = json.loads((root / ".zmetadata").read_text())["metadata"]
    assert consolidated["text/.zarray"]["dtype"] == "|S7"
    for name, data in values.items():
        assert readers(root, name, data) == READ, name
    done = subprocess.run(
        [*REFMOUNT, "check", "--decode", "--decode-strings", "fixed", str(refs)],
        capture_output=True, text=True, timeout=120, env=child_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout
    assert sorted(os.listdir(mount(refs, "--decode").mountpoint)) == [
        ".zattrs", ".zgroup", ".zmetadata"
    ]  # fmt: skip


def test_a_string_variable_of_an_icechunk_repository(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    """VirtualiZarr's ``string`` array (one inline chunk) of a mounted Icechunk repository."""
    dataset = Dataset("cf", write_cf_netcdf4(tmp_path / "cf.nc"), "netcdf4")
    icechunk_refs(dataset, tmp_path / "repo")
    mounted = mount(tmp_path / "repo", "--decode", "--decode-strings", "fixed")
    root = mounted.mountpoint
    assert json.loads((root / "station_name" / ".zarray").read_text())["dtype"] == "|S7"
    assert readers(root, "station_name", np.array(STATIONS, dtype=object)) == READ

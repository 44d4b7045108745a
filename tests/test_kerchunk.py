"""Acceptance: a reference set made by kerchunk from a real netCDF4 file mounts and reads
byte for byte the same as fsspec's ReferenceFileSystem serves it, over file:// and http://.

The netCDF4 library writes the file and kerchunk scans it (tests/data_builders.py); fsspec's
``ReferenceFileSystem.cat`` gives the expected bytes of every key.  Readers are separate
processes where it matters (``cat``, ``find``, ``ls``, ``ncdump``) and this process
otherwise, never the daemon itself.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import zarr

from tests.conftest import Mounted
from tests.data_builders import (
    AIR_LONG_NAME,
    TITLE,
    dump_refs,
    kerchunk_refs,
    netcdf_arrays,
    ref_map,
    write_netcdf,
)
from tests.support.servers import RangeServer

HTTP_DIR = "kerchunk"  # under the session's http_root


@pytest.fixture(scope="module")
def netcdf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_netcdf(tmp_path_factory.mktemp("netcdf") / "data.nc")


@pytest.fixture(scope="module")
def expected_arrays(netcdf_file: Path) -> dict[str, np.ndarray]:
    return netcdf_arrays(netcdf_file)


@pytest.fixture(scope="module")
def served_netcdf(http_root: Path, netcdf_file: Path) -> str:
    """The netCDF file's path on the test HTTP server."""
    (http_root / HTTP_DIR).mkdir(exist_ok=True)
    shutil.copyfile(netcdf_file, http_root / HTTP_DIR / "data.nc")
    return f"/{HTTP_DIR}/data.nc"


def check_refs_shape(refs: dict, url: str) -> dict[str, Any]:
    """The key map, after checking it has what the test relies on (so it tests something)."""
    keys = ref_map(refs)
    targets = {v[0] for v in keys.values() if isinstance(v, list)}
    assert targets == {url}
    inline = [v for v in keys.values() if isinstance(v, str) and not v.startswith("{")]
    assert any(v.startswith("base64:") for v in inline), "no base64 chunk: nothing tested"
    assert any(not v.startswith("base64:") for v in inline), "no plain-text chunk"
    assert any(isinstance(v, list) and len(v) == 3 for v in keys.values())
    assert sum(len(v) == 3 and v[2] for v in keys.values() if isinstance(v, list)) > 3_000_000
    return keys


def fsspec_bytes(refs: dict) -> dict[str, bytes]:
    """What fsspec's ReferenceFileSystem serves for every key."""
    fs = fsspec.filesystem("reference", fo=refs)
    return {key: fs.cat(key) for key in ref_map(refs)}


def directories_of(keys: list[str]) -> set[str]:
    return {"/".join(k.split("/")[:i]) for k in keys for i in range(1, k.count("/") + 1)}


def ls_sizes(directory: Path) -> dict[str, tuple[str, int]]:
    """``ls -lAn`` of one directory, as {name: (type letter, size)}."""
    out = subprocess.run(
        ["ls", "-lAn", "--time-style=+%s", str(directory)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    entries = {}
    for line in out.splitlines()[1:]:  # the first line is "total N"
        mode, _links, _uid, _gid, size, _mtime, name = line.split(maxsplit=6)
        entries[name] = (mode[0], int(size))
    return entries


def assert_tree_matches_fsspec(mnt: Path, refs: dict) -> None:
    """Every key's size and bytes through the mount equal what fsspec serves."""
    expected = fsspec_bytes(refs)
    keys = sorted(expected)

    # Sizes: stat(2) in this process, then ls -l in another.
    for key in keys:
        st = os.stat(mnt / key)
        assert st.st_size == len(expected[key]), key
        assert st.st_mode & 0o170000 == 0o100000, key  # a regular file
    for directory in {"", *directories_of(keys)}:
        listed = ls_sizes(mnt / directory)
        children = {
            k[len(directory) :].lstrip("/").split("/")[0]
            for k in keys
            if not directory or k.startswith(directory + "/")
        }
        assert set(listed) == children, directory
        for name, (kind, size) in listed.items():
            path = f"{directory}/{name}".lstrip("/")
            if path in expected:
                assert (kind, size) == ("-", len(expected[path])), path
            else:
                assert kind == "d", path

    # The tree: exactly the keys, and the directories their paths imply.
    files = subprocess.run(
        ["find", str(mnt), "-type", "f", "-printf", "%P\\n"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert sorted(files) == keys
    dirs = subprocess.run(
        ["find", str(mnt), "-mindepth", "1", "-type", "d", "-printf", "%P\\n"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert set(dirs) == directories_of(keys)

    # Bytes: every key whole, in this process.
    for key in keys:
        with open(mnt / key, "rb") as f:
            assert f.read() == expected[key], key

    # A separate process (cat) for every inlined key and a spread of the others.
    values = ref_map(refs)
    sample = [k for i, k in enumerate(keys) if not isinstance(values[k], list) or i % 5 == 0]
    for key in sample:
        out = subprocess.run(["cat", str(mnt / key)], capture_output=True, check=True).stdout
        assert out == expected[key], key

    # Reads that start and end anywhere, including past the end of the file.
    big = max(keys, key=lambda k: len(expected[k]))
    fd = os.open(mnt / big, os.O_RDONLY)
    try:
        data = expected[big]
        for offset, length in [(0, 1), (1, 4095), (4095, 8193), (len(data) - 7, 100)]:
            assert os.pread(fd, length, offset) == data[offset : offset + length]
        assert os.pread(fd, 10, len(data)) == b""
    finally:
        os.close(fd)


@pytest.mark.parametrize("style", ["file-url", "bare-path"])
def test_file_references_read_like_fsspec(
    mount: Callable[..., Mounted], netcdf_file: Path, tmp_path: Path, style: str
) -> None:
    url = netcdf_file.as_uri() if style == "file-url" else str(netcdf_file)
    refs = kerchunk_refs(netcdf_file, url)
    check_refs_shape(refs, url)
    m = mount(dump_refs(refs, tmp_path / "refs.json"))
    assert_tree_matches_fsspec(m.mountpoint, refs)


def test_http_references_read_like_fsspec(
    mount: Callable[..., Mounted], http: RangeServer, served_netcdf: str, tmp_path: Path
) -> None:
    url = http.url + served_netcdf
    refs = kerchunk_refs(url, url)  # kerchunk scans the file over HTTP, as users do
    check_refs_shape(refs, url)
    m = mount(dump_refs(refs, tmp_path / "refs.json"))
    http.reset_stats()
    assert_tree_matches_fsspec(m.mountpoint, refs)
    stats = http.stats()
    # The mount asked only for byte ranges of the referenced file (fsspec asks too).
    assert {path for path, _start, _end in stats["ranges"]} == {served_netcdf}


@pytest.mark.parametrize("transport", ["file", "http"])
def test_zarr_through_the_mount_reads_what_netcdf_reads(
    mount: Callable[..., Mounted],
    http: RangeServer,
    served_netcdf: str,
    netcdf_file: Path,
    expected_arrays: dict[str, np.ndarray],
    tmp_path: Path,
    transport: str,
) -> None:
    url = netcdf_file.as_uri() if transport == "file" else http.url + served_netcdf
    m = mount(dump_refs(kerchunk_refs(netcdf_file, url), tmp_path / "refs.json"))
    group = zarr.open_group(str(m.mountpoint), mode="r")
    assert set(group.array_keys()) == set(expected_arrays)
    for name, values in expected_arrays.items():
        array = group[name]
        assert array.dtype == values.dtype, name
        assert array.shape == values.shape, name
        np.testing.assert_array_equal(array[...], values, err_msg=name)
    assert group.attrs["title"] == TITLE
    assert group["air"].attrs["long_name"] == AIR_LONG_NAME
    assert group["air"].attrs["_ARRAY_DIMENSIONS"] == ["time", "lat", "lon"]
    assert group["time"].attrs["units"] == "hours since 2000-01-01 00:00:00"
    assert group["scalar"][()] == 3.5


# -- ncdump (netCDF-C's NCZarr) on the mounted tree ----------------------------------------

#: Variables Debian 12's netCDF-C 4.9.0 reads correctly from a kerchunk tree.  Not ``air``:
#: it ignores the Zarr "filters" (kerchunk's shuffle+zlib) and prints the compressed bytes as
#: floats; not ``scalar``: reading a rank-0 Zarr array's data crashes ncdump (SIGSEGV).  Both
#: happen the same on a plain directory copy of the tree, so they are netCDF-C's, not ours.
NCDUMP_VARIABLES = ["time", "level", "lat", "lon", "raw", "cont", "tiny", "small"]


def ncdump(*args: str) -> str:
    ncdump_path = shutil.which("ncdump")
    assert ncdump_path, "ncdump is needed: apt-get install netcdf-bin"
    result = subprocess.run([ncdump_path, *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def header_facts(header: str) -> tuple[dict[str, int], set[str], set[str]]:
    """(dimension sizes, variable declarations, ASCII attribute lines) of ``ncdump -h``."""
    dims = {}
    for name, size, current in re.findall(
        r"^\t(\w+) = (?:(\d+) ;|UNLIMITED ; // \((\d+) currently\))$", header, re.M
    ):
        dims[name] = int(size or current)
    declarations = set(
        re.findall(r"^\t(?:float|double|int|short|byte|char) \w+.* ;$", header, re.M)
    )
    attributes = {line for line in re.findall(r"^\t\t.*$", header, re.M) if line.isascii()}
    return dims, declarations, attributes


def data_blocks(dump: str) -> dict[str, str]:
    """{variable: its printed values} from the ``data:`` section of an ncdump."""
    data = dump.split("\ndata:\n", 1)[1]
    return dict(re.findall(r"^ (\w+) =\s*(.*?) ;$", data, re.M | re.S))


def test_ncdump_reads_the_mounted_tree(
    mount: Callable[..., Mounted], netcdf_file: Path, tmp_path: Path
) -> None:
    m = mount(dump_refs(kerchunk_refs(netcdf_file, netcdf_file.as_uri()), tmp_path / "refs.json"))
    nczarr = f"file://{m.mountpoint}#mode=zarr,file"

    mounted_dims, mounted_decls, mounted_attrs = header_facts(ncdump("-h", nczarr))
    nc_dims, nc_decls, nc_attrs = header_facts(ncdump("-h", str(netcdf_file)))
    assert mounted_dims == nc_dims == {"time": 24, "level": 4, "lat": 80, "lon": 120}
    assert mounted_decls == nc_decls
    assert "\tfloat air(time, lat, lon) ;" in mounted_decls
    assert "\tint raw(time, level, lat, lon) ;" in mounted_decls
    assert "\tdouble scalar ;" in mounted_decls
    # Every ASCII attribute of the file is in the Zarr tree's header (netCDF-C adds none).
    assert nc_attrs <= mounted_attrs
    assert '\t\ttime:units = "hours since 2000-01-01 00:00:00" ;' in mounted_attrs

    selection = ",".join(NCDUMP_VARIABLES)
    mounted_data = data_blocks(ncdump("-v", selection, nczarr))
    nc_data = data_blocks(ncdump("-v", selection, str(netcdf_file)))
    assert set(mounted_data) == set(NCDUMP_VARIABLES)
    assert mounted_data == nc_data
    assert mounted_data["level"] == "1000, 850, 500, 250"


# -- the bundled example --------------------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "air"


def test_bundled_example_mounts_with_nothing_to_configure(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    refs = json.loads((EXAMPLE / "refs.json").read_text())
    keys = ref_map(refs)
    assert {v[0] for v in keys.values() if isinstance(v, list)} == {"air.nc"}  # relative
    m = mount(EXAMPLE / "refs.json")
    # fsspec resolves a protocol-less URL against the working directory, refmount against
    # the refs file's directory: give fsspec the absolute path to compare bytes.
    absolute = {
        k: [str(EXAMPLE / v[0]), *v[1:]] if isinstance(v, list) else v for k, v in keys.items()
    }
    assert_tree_matches_fsspec(m.mountpoint, {"version": 1, "refs": absolute})
    group = zarr.open_group(str(m.mountpoint), mode="r")
    arrays = netcdf_arrays(EXAMPLE / "air.nc")
    assert set(group.array_keys()) == set(arrays) == {"air", "time", "lat", "lon"}
    for name, values in arrays.items():
        np.testing.assert_array_equal(group[name][...], values, err_msg=name)
    assert group["air"].attrs["units"] == "K"

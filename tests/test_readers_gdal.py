"""Readers that are not Python, through the mount: GDAL (the rasterio wheel's, and Debian's
gdal-bin) and netCDF-C's ncdump, each compared with the original file.

Each reader decodes what its version can, and the rest is refused with a message that the
docs/views.md quotes ("Reading from other languages").  A variable a reader
decodes must equal the original; a variable it refuses must be refused for the known
reason, so a new limit, or a lifted one, shows up here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import rasterio

from tests.conftest import Mounted
from tests.data_builders import (
    kerchunk_refs,
    netcdf_arrays,
    write_readers_netcdf3,
    write_readers_netcdf4,
)
from tests.support.reader_runs import RASTERIO_CHILD
from tests.test_kerchunk import data_blocks

#: Why GDAL's Zarr driver before 3.11 (Debian's 3.6, the rasterio 1.4 wheel's 3.10) refuses a
#: variable of the netCDF4 file.
GDAL_REFUSALS = {
    "temp": "Filter shuffle not handled",  # kerchunk writes HDF5's shuffle as a Zarr filter
    "packed": "Filter shuffle not handled",
    "scalar": "Unsupported number of dimensions",  # rank 0: not a raster
    "station_name": "Invalid or unsupported format for dtype: |O",  # variable-length strings
}
#: GDAL 3.11 added the shuffle filter: from then on it refuses only these two.
GDAL_3_11_REFUSALS = {k: GDAL_REFUSALS[k] for k in ("scalar", "station_name")}


def gdal_refusals(version: str) -> dict[str, str]:
    """What GDAL ``version``'s Zarr driver refuses of the netCDF4 set, and why."""
    major, minor = (int(p) for p in version.split(".")[:2])
    return GDAL_REFUSALS if (major, minor) < (3, 11) else GDAL_3_11_REFUSALS


@pytest.fixture(scope="module")
def nc4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_readers_netcdf4(tmp_path_factory.mktemp("gdal-data") / "data4.nc")


def mounted_set(source: Path, directory: Path, refs: dict) -> Mounted:
    (directory / "refs.json").write_text(json.dumps(refs))
    (directory / "mnt").mkdir()
    return Mounted(directory / "refs.json", directory / "mnt", [], directory / "refmount.log")


@pytest.fixture(scope="module")
def nc4_mount(nc4: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("gdal-nc4")
    m = mounted_set(nc4, directory, kerchunk_refs(nc4, nc4.as_uri(), inline_threshold=100))
    try:
        yield m.mountpoint
    finally:
        m.stop()


def test_rasterio_gdal_decodes_what_it_can(nc4: Path, nc4_mount: Path, tmp_path: Path) -> None:
    expected = netcdf_arrays(nc4)
    child = subprocess.run(
        [sys.executable, "-c", RASTERIO_CHILD, str(nc4_mount), str(tmp_path), *expected],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout)
    assert result["gdal"] == rasterio.__gdal_version__
    refusals = gdal_refusals(result["gdal"])
    assert set(result["refused"]) == set(refusals)
    assert set(result["read"]) == set(expected) - set(refusals)
    for name, reason in result["refused"].items():
        assert refusals[name] in reason, (name, reason)
    for name, npy in result["read"].items():
        values = np.load(npy)  # (bands, rows, columns); a 1-D array is one row
        np.testing.assert_array_equal(values.reshape(expected[name].shape), expected[name])


def debian_gdal(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    path = shutil.which(tool)
    assert path, f"{tool} is needed: apt-get install gdal-bin"
    return subprocess.run([path, *args], capture_output=True, text=True, timeout=120)


def test_debian_gdal_translates_what_it_can(nc4: Path, nc4_mount: Path, tmp_path: Path) -> None:
    version = debian_gdal("gdalinfo", "--version").stdout
    assert version.startswith("GDAL 3."), version
    refusals = gdal_refusals(version.split()[1].rstrip(","))
    expected = netcdf_arrays(nc4)
    for name in sorted(set(expected) - set(refusals)):
        out = tmp_path / f"{name}.bin"
        source = f'ZARR:"{nc4_mount}":/{name}'
        done = debian_gdal("gdal_translate", "-q", "-of", "ENVI", source, str(out))
        assert done.returncode == 0, (name, done.stderr)
        values = np.frombuffer(out.read_bytes(), dtype=expected[name].dtype.newbyteorder("="))
        np.testing.assert_array_equal(values.reshape(expected[name].shape), expected[name])
    for name, reason in refusals.items():
        info = debian_gdal("gdalinfo", f'ZARR:"{nc4_mount}":/{name}')
        assert info.returncode != 0 and reason in info.stderr, (name, info.stderr)


# -- netCDF-C ---------------------------------------------------------------------------------

#: Variables of the netCDF4 set that netCDF-C 4.9.0 decodes: those without Zarr filters
#: (it ignores them and prints compressed bytes as numbers).
NCDUMP_DECODES = ["time", "y", "x"]


def ncdump(*args: str) -> subprocess.CompletedProcess[str]:
    path = shutil.which("ncdump")
    assert path, "ncdump is needed: apt-get install netcdf-bin"
    return subprocess.run([path, *args], capture_output=True, text=True, timeout=60)


def nczarr(directory: Path) -> str:
    return f"file://{directory}#mode=zarr,file"


def mount_and_copy(
    refs: dict, source: Path, directory: Path, *args: str
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str], str]:
    """``ncdump ARGS`` of the mounted set, of a plain directory copy of the same tree (what
    netCDF-C makes of these files wherever they are), and of the original file."""
    m = mounted_set(source, directory, refs)
    try:
        shutil.copytree(m.mountpoint, directory / "copy")
        mounted = ncdump(*args, nczarr(m.mountpoint))
    finally:
        m.stop()
    copied = ncdump(*args, nczarr(directory / "copy"))
    direct = ncdump(*args, str(source))
    assert direct.returncode == 0, direct.stderr
    return mounted, copied, direct.stdout


def without_strings(refs: dict) -> dict:
    """The set less its variable-length string variable: ncdump 4.9.0 crashes (SIGSEGV) on
    one, even for ``-h``."""
    kept = {k: v for k, v in refs["refs"].items() if not k.startswith("station_name/")}
    return {**refs, "refs": kept}


def test_ncdump_reads_a_netcdf4_set(nc4: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The header is the directory copy's; the variables without filters read as the original
    (reading ``scalar``'s data crashes ncdump 4.9.0: tests/test_kerchunk.py)."""
    refs = without_strings(kerchunk_refs(nc4, nc4.as_uri(), inline_threshold=100))
    header, copied, _ = mount_and_copy(refs, nc4, tmp_path_factory.mktemp("ncdump4"), "-h")
    assert header.returncode == 0, header.stderr
    assert header.stdout.replace("mnt", "copy", 1) == copied.stdout
    # Attributes: ASCII ones as in the file; JSON's \u escapes are shown without the "\".
    assert '\t\ttime:units = "days since 2001-01-01 00:00:00" ;' in header.stdout
    assert ':title = "Ru00e9seau' in header.stdout
    selection = ("-v", ",".join(NCDUMP_DECODES))
    data, _, direct = mount_and_copy(refs, nc4, tmp_path_factory.mktemp("ncdump4v"), *selection)
    assert data.returncode == 0, data.stderr
    blocks = data_blocks(data.stdout)
    assert set(blocks) == set(NCDUMP_DECODES)
    assert blocks == data_blocks(direct)


def test_ncdump_reads_a_netcdf3_set_as_a_copy_of_its_tree(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """netCDF-C 4.9.0 reads a netCDF3 set's big-endian arrays in the wrong byte order (and
    kerchunk's blosc-compressed inlined coordinates as raw bytes), on the mount exactly as
    on a directory copy: every line of the dump is the copy's."""
    import kerchunk.netCDF3

    directory = tmp_path_factory.mktemp("ncdump3")
    nc3 = write_readers_netcdf3(directory / "data3.nc")
    refs = kerchunk.netCDF3.NetCDF3ToZarr(str(nc3), inline_threshold=100).translate()
    mounted, copied, direct = mount_and_copy(refs, nc3, directory)
    assert mounted.returncode == 0, mounted.stderr
    assert mounted.stdout.replace("mnt", "copy", 1) == copied.stdout
    assert "\tdouble height(y, x) ;" in mounted.stdout
    assert data_blocks(mounted.stdout)["height"] != data_blocks(direct)["height"]  # the limit


# -- GDAL's own reference readers (GDAL >= 3.11) --------------------------------------------

VSIKERCHUNK_CHILD = r"""
import json, sys
import numpy as np
import rasterio
sources, out = json.loads(sys.argv[1]), sys.argv[2]
with rasterio.Env() as env:
    parquet = "Parquet" in env.drivers()
result = {"gdal": rasterio.__gdal_version__, "parquet_driver": parquet, "read": {}, "refused": {}}
for label, source in sources.items():
    try:
        with rasterio.open(source) as ds:
            np.save(f"{out}/{label}.npy", ds.read())
        result["read"][label] = f"{out}/{label}.npy"
    except rasterio.errors.RasterioIOError as e:
        result["refused"][label] = str(e.__cause__ or e)
print(json.dumps(result))
"""


def test_rasterio_gdal_reads_as_its_own_vsikerchunk(
    nc4: Path, nc4_mount: Path, tmp_path: Path
) -> None:
    """The rasterio wheel's GDAL reads the same values through the mount as through its own
    ``/vsikerchunk_json_ref/``; its ``/vsikerchunk_parquet_ref/`` needs GDAL's Parquet
    driver to open a set's ``refs.N.parq`` files, which the rasterio 1.5 wheels are built
    without (arrays held inline in ``.zmetadata``, here ``time``, ``x``, ``y``, still read)."""
    import kerchunk.df

    refs = kerchunk_refs(nc4, nc4.as_uri(), inline_threshold=100)
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    kerchunk.df.refs_to_dataframe(refs, str(tmp_path / "refs.parq"), record_size=10)
    names = sorted(set(netcdf_arrays(nc4)) - set(GDAL_3_11_REFUSALS))
    sources = {}
    for name in names:
        sources[f"mount-{name}"] = f'ZARR:"{nc4_mount}":/{name}'
        sources[f"json-{name}"] = f'ZARR:"/vsikerchunk_json_ref/{{{tmp_path}/refs.json}}":/{name}'
        parquet = f"/vsikerchunk_parquet_ref/{{{tmp_path}/refs.parq}}"
        sources[f"parquet-{name}"] = f'ZARR:"{parquet}":/{name}'
    child = subprocess.run(
        [sys.executable, "-c", VSIKERCHUNK_CHILD, json.dumps(sources), str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout)
    assert gdal_refusals(result["gdal"]) is GDAL_3_11_REFUSALS, "needs GDAL >= 3.11"
    expected = netcdf_arrays(nc4)
    for name in names:
        mounted = np.load(result["read"][f"mount-{name}"])
        own = np.load(result["read"][f"json-{name}"])
        np.testing.assert_array_equal(mounted, own, err_msg=name)
        np.testing.assert_array_equal(own.reshape(expected[name].shape), expected[name])
        if f"parquet-{name}" in result["read"]:
            np.testing.assert_array_equal(np.load(result["read"][f"parquet-{name}"]), own)
        else:
            why = result["refused"][f"parquet-{name}"]
            assert "refs.0.parq' not recognized as being in a supported file format" in why
    unread = {label.split("-", 1)[1] for label in result["refused"]}
    assert result["parquet_driver"] or unread, result  # without the driver, some fail
    assert set(result["refused"]) == {f"parquet-{name}" for name in unread}

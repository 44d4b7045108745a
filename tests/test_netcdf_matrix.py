"""The reader matrix's datasets (tests/test_decode_readers.py: netCDF4 with CF attributes,
a scalar and a string variable; netCDF3 classic with record variables; HDF5 with blosc
and zstd), referenced by kerchunk and by VirtualiZarr, each mounted with ``--netcdf``:
every variable read through the ``.nc`` by netCDF4-python, scipy.io.netcdf_file and
Debian's ncdump equals netCDF4 reading the original file; a copy of the file reads alike.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import scipy.io

from bench import netcdf_matrix
from tests.support.mounting import Mounted
from tests.test_decode_readers import RefSet, datasets, refset  # noqa: F401 - fixtures


@pytest.fixture(scope="module")
def served(refset: RefSet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:  # noqa: F811
    directory = tmp_path_factory.mktemp("mnt-netcdf")
    (directory / "mnt").mkdir()
    m = Mounted(refset.path, directory / "mnt", ["--netcdf"], directory / "refmount.log")
    try:
        yield m.mountpoint / "refs.nc"
    finally:
        m.stop()


def same(got: np.ndarray, expected: np.ndarray) -> bool:
    if expected.dtype == object:  # variable-length strings: chars with _Encoding, read as text
        return got.tolist() == expected.tolist()
    return got.shape == expected.shape and np.array_equal(got, expected, equal_nan=True)


def test_netcdf4_reads_every_variable_as_the_original(served: Path, refset: RefSet) -> None:  # noqa: F811
    with netCDF4.Dataset(served) as ds:
        ds.set_auto_maskandscale(False)
        assert sorted(ds.variables) == sorted(refset.expected)
        for name, expected in refset.expected.items():
            got = ds[name][...]
            if expected.dtype.kind in "iuf":
                got = got.astype(expected.dtype)  # unsigned as _Unsigned, in its own type
            assert same(np.asarray(got), expected), name


def test_scipy_reads_every_numeric_variable(served: Path, refset: RefSet) -> None:  # noqa: F811
    with scipy.io.netcdf_file(served, mmap=False) as f:
        for name, expected in refset.expected.items():
            if expected.dtype == object:
                continue
            got = f.variables[name][...]
            assert np.array_equal(got.astype(expected.dtype), expected, equal_nan=True), name


def test_a_copy_dumps_as_the_mounted_file(served: Path, tmp_path: Path) -> None:
    copy = tmp_path / "refs.nc"
    shutil.copyfile(served, copy)
    dump = ["ncdump", "-p", "9,17"]
    through = subprocess.run([*dump, str(served)], capture_output=True, timeout=300, check=True)
    copied = subprocess.run([*dump, str(copy)], capture_output=True, timeout=300, check=True)
    assert copied.stdout == through.stdout and b"data:" in through.stdout
    subprocess.run(["nccopy", "-k", "nc4", str(served), str(tmp_path / "4.nc")], check=True)


def test_no_reader_reads_a_wrong_value_and_each_as_many_as_from_a_classic_copy(
    tmp_path: Path,
) -> None:
    """Issue 37's bar, by bench/netcdf_matrix.py: nine readers (netCDF4, scipy, ncdump,
    ncks, GDAL, CDO, Octave, R, xarray) on every variable of every set's ``.nc``: none
    reads a value other than the original's without an error, and each reads exactly at
    least as many variables as from ``nccopy``'s classic copy of the original."""
    counts, cells = netcdf_matrix.measure(tmp_path, set())
    assert not [cell for cell in cells if " view " in cell and ": WRONG" in cell], cells
    for reader in netcdf_matrix.READERS:
        view, classic = counts[(reader, "view", "exact")], counts[(reader, "classic", "exact")]
        assert view >= classic > 0, reader

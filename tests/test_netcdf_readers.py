"""Readers outside Python open the netCDF view's file by its path: Debian's NCO (``ncks``),
CDO, Octave's ``ncread`` (octave-netcdf) and R's ncdf4, each reading every variable of
the bundled example equal to netCDF4-python reading examples/air/air.nc.

Octave and R write what they read as little-endian doubles (their column-major arrays
hold the values in the file's C order); NCO and CDO copy the file to netCDF-4, read back
here."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from tests.support.mounting import REPO, Mounted

AIR = REPO / "examples" / "air"
VARIABLES = ("air", "lat", "lon", "time")


@pytest.fixture
def served(mount: Callable[..., Mounted]) -> Path:
    mounted = mount(AIR / "refs.json", "--netcdf", "--netcdf-name", "air")
    return mounted.mountpoint / "air.nc"


def original() -> dict[str, np.ndarray]:
    with netCDF4.Dataset(AIR / "air.nc") as ds:
        return {name: np.asarray(ds[name][:], "f8").ravel() for name in VARIABLES}


def run(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def copied(path: Path) -> dict[str, np.ndarray]:
    with netCDF4.Dataset(path) as ds:
        return {name: np.asarray(ds[name][:], "f8").ravel() for name in VARIABLES}


def test_ncks_copies_every_variable(served: Path, tmp_path: Path) -> None:
    out = tmp_path / "ncks.nc"
    run("ncks", "-O", "-4", str(served), str(out))
    got, expected = copied(out), original()
    for name in VARIABLES:
        assert np.array_equal(got[name], expected[name]), name


def test_cdo_copies_the_field_and_its_coordinates(served: Path, tmp_path: Path) -> None:
    out = tmp_path / "cdo.nc"
    run("cdo", "-s", "-f", "nc4", "copy", str(served), str(out))
    got, expected = copied(out), original()
    for name in VARIABLES:
        assert np.array_equal(got[name], expected[name]), name


def test_octave_ncread_reads_every_variable(served: Path, tmp_path: Path) -> None:
    expected = original()
    for name in VARIABLES:
        out = tmp_path / f"{name}.f8"
        script = (
            f"pkg load netcdf; v = ncread('{served}', '{name}'); "
            f"f = fopen('{out}', 'w'); fwrite(f, double(v(:)), 'double', 0, 'ieee-le'); fclose(f);"
        )
        run("octave", "--no-gui", "--no-window-system", "-q", "--eval", script)
        assert np.array_equal(np.fromfile(out, "<f8"), expected[name]), name


def test_r_ncdf4_reads_every_variable(served: Path, tmp_path: Path) -> None:
    expected = original()
    for name in VARIABLES:
        out = tmp_path / f"{name}.f8"
        script = (
            f'library(ncdf4); f <- nc_open("{served}"); v <- ncvar_get(f, "{name}"); '
            f'writeBin(as.double(v), "{out}", size = 8, endian = "little")'
        )
        run("Rscript", "-e", script)
        assert np.array_equal(np.fromfile(out, "<f8"), expected[name]), name


def test_gdal_translates_every_band_of_air(mount: Callable[..., Mounted], tmp_path: Path) -> None:
    mounted = mount(AIR / "refs.json", "-o", "netcdf,netcdf_name=air")  # as fstab says it
    out = tmp_path / "air.envi"  # raw little-endian float32, band after band
    source = f'NETCDF:"{mounted.mountpoint}/air.nc":air'
    run("gdal_translate", "-q", "-of", "ENVI", source, str(out))
    assert np.array_equal(np.fromfile(out, "<f4").astype("f8"), original()["air"])

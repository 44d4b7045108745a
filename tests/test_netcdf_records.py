"""The record dimension of the netCDF view, through real mounts: a CF time axis first in
every variable using it is UNLIMITED, its variables stored record by record; read by
ncrcat, ncks, CDO, GDAL, netCDF4-python and xarray, equal to what ``nccopy`` writes from
the source; ``--netcdf-record-dim`` chooses."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import netCDF4
import numpy as np
import xarray

from tests.support.mounting import REFMOUNT, Mounted, child_env
from tests.support.nginx import NginxServer
from tests.test_netcdf import chunk, data_section, ncdump, zarray
from tests.test_netcdf_catalog import STEPS, time_slices
from tests.test_netcdf_reading import small_chunks

VARIABLES = ("time", "lat", "lon", "temp")


def run(*args: str) -> str:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=True).stdout


def values(path: Path) -> dict[str, np.ndarray]:
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        return {name: ds[name][:] for name in VARIABLES}


def test_a_time_axis_is_the_record_dimension_and_ncrcat_gives_the_series(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    catalog, sources = time_slices(tmp_path)
    root = mount(catalog, "--netcdf", "--allow-local", "--xattrs").mountpoint
    served = root / "run02.nc"
    header = ncdump("-h", str(served))
    assert f"time = UNLIMITED ; // ({STEPS} currently)" in header
    # what nccopy writes from the source as a classic file: the same values, byte for
    # byte as ncdump prints them, and the same records
    classic = tmp_path / "classic.nc"
    run("nccopy", "-k", "64-bit offset", str(sources[1]), str(classic))
    for name in VARIABLES:  # the view lists variables by name: compared one by one
        printed = [
            data_section(ncdump("-v", name, str(p))).split(f" {name} =", 1)[1]
            for p in (served, classic)
        ]
        assert printed[0] == printed[1], name
    expected = values(classic)
    for name, array in values(served).items():
        np.testing.assert_array_equal(array, expected[name], err_msg=name)
    # ncks, CDO and GDAL read the record variable as they read nccopy's file
    assert run("ncks", "--trd", "-H", "-C", "-v", "temp", str(served)) == run(
        "ncks", "--trd", "-H", "-C", "-v", "temp", str(classic)
    )
    cdo = {}
    for name, path in (("served", served), ("classic", classic)):
        out = tmp_path / f"cdo_{name}.nc"
        run("cdo", "-s", "copy", str(path), str(out))
        cdo[name] = values(out)
    for name in VARIABLES:
        np.testing.assert_array_equal(cdo["served"][name], cdo["classic"][name], err_msg=name)
    grids = [
        run("gdal_translate", "-q", "-of", "AAIGrid", "-b", "3", f"NETCDF:{p}:temp", "/vsistdout/")
        for p in (served, classic)
    ]
    assert grids[0] == grids[1] and grids[0].count("\n") > 3
    with xarray.open_dataset(served) as ds, xarray.open_dataset(classic) as original:
        assert ds["time"].values.tolist() == original["time"].values.tolist()
        np.testing.assert_array_equal(ds["temp"].values, original["temp"].values)
    # refmount check shows the record dimension the mount makes, or none when asked
    for args, expected_dim in (([], "time"), (["--netcdf-record-dim", "none"], None)):
        done = subprocess.run(
            [*REFMOUNT, "check", "--netcdf", "--json", *args, str(catalog / "run02.json")],
            capture_output=True, text=True, timeout=120, env=child_env(),
        )  # fmt: skip
        (made,) = json.loads(done.stdout)["netcdf"]["files"]
        assert made["record_dimension"] == expected_dim, done.stdout
    # ncrcat concatenates the catalog's files along the record dimension: the series
    series = tmp_path / "series.nc"
    run("ncrcat", "-O", *sorted(str(p) for p in root.glob("run*.nc")), str(series))
    whole = values(series)
    assert whole["time"].tolist() == list(range(len(sources) * STEPS))
    parts = [values(source) for source in sources]
    np.testing.assert_array_equal(whole["temp"], np.concatenate([p["temp"] for p in parts]))


def test_records_are_read_ahead_in_record_order_and_record_dim_none_keeps_fixed(
    mount: Callable[..., Mounted], nginx: NginxServer, tmp_path: Path
) -> None:
    root = nginx.root / "records"
    root.mkdir()
    refs, expected = small_chunks(root, f"{nginx.url}/records", 20000)
    document = json.loads(refs.read_text())
    document["refs"]["time/.zarray"] = zarray([20000], [5000], "<f8")  # a second variable
    document["refs"]["time/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": ["time"]})
    for k in range(4):
        times = np.arange(5000 * k, 5000 * (k + 1), dtype="<f8")
        document["refs"][f"time/{k}"] = chunk(times)
    refs.write_text(json.dumps(document))
    mounted = mount(refs, "--netcdf", "--xattrs", "--netcdf-record-dim", "time")
    path = mounted.mountpoint / "small.nc"
    assert "time = UNLIMITED ; // (20000 currently)" in ncdump("-h", str(path))
    copy = tmp_path / "copy.nc"
    run("cp", str(path), str(copy))
    stats = json.loads(os.getxattr(mounted.mountpoint, "user.refmount.stats"))
    assert stats["netcdf_read_ahead"] > 0
    assert stats["decoded_chunks"] == 20004  # each once: read ahead record by record
    with netCDF4.Dataset(copy) as ds:
        assert ds.dimensions["time"].isunlimited()
        np.testing.assert_array_equal(ds["field"][:], expected)
        assert ds["time"][:].tolist() == list(range(20000))
    fixed = mount(refs, "--netcdf", "--netcdf-record-dim", "none")
    header = ncdump("-h", str(fixed.mountpoint / "small.nc"))
    assert "time = 20000 ;" in header and "UNLIMITED" not in header
    chosen = mount(refs, "--netcdf", "--netcdf-record-dim", "x")
    header = ncdump("-h", str(chosen.mountpoint / "small.nc"))
    assert "UNLIMITED" not in header  # x is not field's first dimension: logged
    assert "dimension 'x' is not made the record dimension" in chosen.log()


def test_a_single_short_record_variable_has_no_padding_between_records(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    """netCDF's special case: one record variable of 2-byte values, 3 per record (6
    bytes), records back to back; and a fixed variable beside it."""
    shorts = np.arange(15, dtype="<i2").reshape(5, 3) - 7
    refs = {
        ".zgroup": '{"zarr_format": 2}',
        "s/.zarray": zarray([5, 3], [2, 3], "<i2"),
        "s/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["n", "three"]}),
        **{f"s/{k}.0": chunk(np.resize(shorts[2 * k : 2 * k + 2], (2, 3))) for k in range(3)},
        "f/.zarray": zarray([3], [3], "<f8"),
        "f/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["three"]}),
        "f/0": chunk(np.array([0.5, 1.5, 2.5], "<f8")),
    }
    source = tmp_path / "single.json"
    source.write_text(json.dumps({"version": 1, "refs": refs}))
    path = mount(source, "--netcdf", "--netcdf-record-dim", "n").mountpoint / "single.nc"
    assert "n = UNLIMITED ; // (5 currently)" in ncdump("-h", str(path))
    data = path.read_bytes()
    with netCDF4.Dataset(path) as ds:
        assert ds["s"][:].tolist() == shorts.tolist()
        assert ds["f"][:].tolist() == [0.5, 1.5, 2.5]
    # the records are the file's last 30 bytes, back to back, big-endian
    assert data[-30:] == shorts.astype(">i2").tobytes()
    with xarray.open_dataset(path) as ds:
        assert ds["s"].values.tolist() == shorts.tolist()

"""The netCDF view on what real sets hold, through real mounts: a variable that cannot be
served fails no other variable's reads (the kernel's read-ahead on), 0-length arrays,
times and 64-bit integers; read by ncdump, netCDF4-python and xarray."""

from __future__ import annotations

import errno
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import scipy.io
import xarray

from tests.support.mounting import REFMOUNT, Mounted, child_env
from tests.test_netcdf import chunk, data_section, ncdump, zarray

BIG = (1 << 53) + 1  # an int64 no double holds
#: Times at millisecond resolution, stored in nanoseconds as zarr and VirtualiZarr do.
TIMES = np.array(
    ["2020-01-01T00:00:00.001", "2021-06-30T12:34:56.789", "2024-02-29T23:59:59.999"],
    "<M8[ms]",
).astype("<M8[ns]")
#: A float variable larger than a page, so that its bytes and its neighbours' share
#: the kernel's reads ahead.
V = np.arange(3000, dtype="<f4") / 4


def issue_set(directory: Path) -> Path:
    """The issue's set: a ``<M8[ns]`` time at millisecond resolution, an int64 counter
    holding 2**53 + 1, a float variable after it and one before."""
    counter = np.array([1, 2, BIG], "<i8")
    refs = {
        ".zgroup": '{"zarr_format": 2}',
        "before/.zarray": zarray([3], [3], "<f4"),
        "before/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["time"]}),
        "before/0": chunk(np.array([1.5, 2.5, 3.5], "<f4")),
        "time/.zarray": zarray([3], [3], "<M8[ns]"),
        "time/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["time"], "standard_name": "time"}),
        "time/0": chunk(TIMES),
        "counter/.zarray": zarray([3], [3], "<i8"),
        "counter/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["time"]}),
        "counter/0": chunk(counter),
        "v/.zarray": zarray([3000], [1000], "<f4"),
        "v/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["x"], "units": "K"}),
        **{f"v/{i}": chunk(V[i * 1000 : (i + 1) * 1000]) for i in range(3)},
    }
    path = directory / "issue.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path


def ncdump_values(path: Path, name: str) -> list[float]:
    text = data_section(ncdump("-v", name, str(path))).split(f" {name} =", 1)[1]
    return [float(v) for v in text.split(";", 1)[0].replace("\n", " ").split(",")]


def test_a_value_that_cannot_be_served_fails_no_other_variable(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    """With the format asked for (CDF-2), the counter is doubles and its value 2**53 + 1
    fails its read; every other variable reads, whole-file readers included."""
    mounted = mount(issue_set(tmp_path), "--netcdf", "--netcdf-format", "64bit-offset")
    path = mounted.mountpoint / "issue.nc"
    assert ncdump_values(path, "v") == V.tolist()
    assert ncdump_values(path, "before") == [1.5, 2.5, 3.5]
    failed = subprocess.run(["ncdump", "-v", "counter", str(path)], capture_output=True)
    assert failed.returncode != 0
    assert f"the integer {BIG} has no exact double" in mounted.log()
    with netCDF4.Dataset(path) as ds:  # one open, every other variable read through it
        assert ds["v"][:].tolist() == V.tolist()
        assert ds["before"][:].tolist() == [1.5, 2.5, 3.5]
        with pytest.raises(RuntimeError):
            ds["counter"][:]
        assert ds["v"][:].tolist() == V.tolist()
    # A sequential reader (read-ahead earned) meets the EIO at the counter's block only.
    with open(path, "rb") as f:
        with pytest.raises(OSError) as caught:
            while f.read(4096):
                pass
        assert caught.value.errno == errno.EIO


def test_auto_makes_the_issue_set_cdf5_and_xarray_reads_its_datetimes(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    """Times at millisecond resolution are no ``int`` in any CF unit: CDF-5, the times
    int64 milliseconds, and the counter int64."""
    mounted = mount(issue_set(tmp_path), "--netcdf")
    path = mounted.mountpoint / "issue.nc"
    with netCDF4.Dataset(path) as ds:
        assert ds.file_format == "NETCDF3_64BIT_DATA"
        assert ds["time"].units == "milliseconds since 1970-01-01T00:00:00"
        assert ds["time"].dtype == np.int64 and ds["time"]._FillValue == -(1 << 63)  # NaT
        assert ds["counter"][:].tolist() == [1, 2, BIG]
    assert "the file is CDF-5, the times int64" in mounted.log()
    with xarray.open_dataset(path) as ds:
        assert ds["time"].values.tolist() == TIMES.tolist()
        assert ds["v"].values.tolist() == V.tolist()
        assert ds["counter"].values.tolist() == [1, 2, BIG]
    assert ncdump_values(path, "v") == V.tolist()


def hourly_set(directory: Path) -> tuple[Path, np.ndarray]:
    """Hourly times stored in nanoseconds (NaT among them), beside an int64 counter
    holding 2**53 + 1 and an exact one."""
    when = np.array(["2020-01-01T00", "NaT", "2100-12-31T23"], "<M8[h]").astype("<M8[ns]")
    refs = {
        ".zgroup": '{"zarr_format": 2}',
        "time/.zarray": zarray([3], [2], "<M8[ns]", "NaT"),
        "time/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["time"], "axis": "T"}),
        "time/0": chunk(when[:2]),
        "time/1": chunk(np.concatenate([when[2:], when[2:]])),
        "counter/.zarray": zarray([3], [3], "<i8"),
        "counter/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["time"]}),
        "counter/0": chunk(np.array([1, 2, BIG], "<i8")),
        "exact/.zarray": zarray([3], [3], "<u8"),
        "exact/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["time"]}),
        "exact/0": chunk(np.array([0, 1 << 60, 5], "<u8")),
    }
    path = directory / "hourly.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path, when


def test_auto_writes_hourly_times_as_int_hours_and_leaves_the_inexact_counter_out(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    refs, when = hourly_set(tmp_path)
    mounted = mount(refs, "--netcdf")
    path = mounted.mountpoint / "hourly.nc"
    with netCDF4.Dataset(path) as ds:
        assert ds.file_format == "NETCDF3_64BIT_OFFSET"
        assert sorted(ds.variables) == ["exact", "time"]
        assert ds["time"].units == "hours since 1970-01-01T00:00:00"
        assert ds["time"].dtype == np.int32 and ds["time"]._FillValue == -2147483647
        ds.set_auto_maskandscale(False)
        hours = when.astype("<M8[h]").astype("<i8")
        assert ds["time"][:].tolist() == [hours[0], -2147483647, hours[2]]
        assert ds["exact"][:].tolist() == [0.0, float(1 << 60), 5.0]
    assert "array 'counter' is left out" in mounted.log()
    with xarray.open_dataset(path) as ds:
        assert ds["time"].values.tolist() == when.tolist()  # NaT included
    with scipy.io.netcdf_file(path, mmap=False) as f:
        assert f.variables["time"][:].tolist()[0] == hours[0]
    # refmount check reads no values: it names the arrays the mount decides by them
    done = subprocess.run(
        [*REFMOUNT, "check", "--netcdf", "--json", str(refs)],
        capture_output=True, text=True, timeout=120, env=child_env(),
    )  # fmt: skip
    assert json.loads(done.stdout)["netcdf"]["by_values"] == ["counter", "exact", "time"]
    # the choice is the values': the same after a reload
    mounted.process.send_signal(1)
    with netCDF4.Dataset(path) as ds:
        assert ds["time"].units == "hours since 1970-01-01T00:00:00"
    # the format asked for keeps the counter as doubles, its inexact value failing alone
    two = mount(refs, "--netcdf", "--netcdf-format", "64bit-offset").mountpoint / "hourly.nc"
    with netCDF4.Dataset(two) as ds:
        assert ds["time"].dtype == np.int32 and ds["counter"].dtype == np.float64
        assert ds["exact"][:].tolist() == [0.0, float(1 << 60), 5.0]
        with pytest.raises(RuntimeError):
            ds["counter"][:]


def empty_set(directory: Path) -> Path:
    """The issue's group: a ``(0,)`` array named before the others, a ``(3, 0)`` one, a
    ``|S0`` one, another 0-length first dimension, and values beside them."""
    refs = {
        ".zgroup": '{"zarr_format": 2}',
        "g/.zgroup": '{"zarr_format": 2}',
        "g/aaa/.zarray": zarray([0], [1], "<f4"),
        "g/aaa/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["obs"]}),
        "g/flat/.zarray": zarray([3, 0], [3, 1], "<f8"),
        "g/flat/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["x", "y"]}),
        "g/more/.zarray": zarray([0, 2], [1, 2], "<i4"),
        "g/more/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["obs", "two"]}),
        "g/other/.zarray": zarray([0], [1], "<f4"),
        "g/other/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["station"]}),
        "g/nothing/.zarray": zarray([2], [2], "|S0"),
        "g/nothing/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["x2"]}),
        "g/x/.zarray": zarray([3], [3], "<f8"),
        "g/x/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["x"]}),
        "g/x/0": chunk(np.array([10.0, 20.0, 30.0], "<f8")),
    }
    path = directory / "empty.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path


def test_zero_length_arrays_are_the_record_dimension_or_left_out_named(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    refs = empty_set(tmp_path)
    mounted = mount(refs, "--netcdf")
    path = mounted.mountpoint / "empty.g.nc"
    header = ncdump("-h", str(path))
    assert "obs = UNLIMITED ; // (0 currently)" in header
    assert "float aaa(obs) ;" in header and "int more(obs, two) ;" in header
    assert ncdump_values(path, "x") == [10.0, 20.0, 30.0]
    with netCDF4.Dataset(path) as ds:
        assert sorted(ds.variables) == ["aaa", "more", "x"]
        assert ds.dimensions["obs"].isunlimited() and len(ds.dimensions["obs"]) == 0
        assert ds["aaa"][:].shape == (0,) and ds["more"][:].shape == (0, 2)
    with xarray.open_dataset(path) as ds:
        assert ds["x"].values.tolist() == [10.0, 20.0, 30.0]
        assert ds["aaa"].shape == (0,)
    log = mounted.log()
    for name in ("g/flat", "g/other", "g/nothing"):
        assert f"array {name!r} is left out" in log, name
    done = subprocess.run(
        [*REFMOUNT, "check", "--netcdf", "--json", str(refs)],
        capture_output=True, text=True, timeout=120, env=child_env(),
    )  # fmt: skip
    left_out = json.loads(done.stdout)["netcdf"]["left_out"]
    assert sorted(left_out) == ["g/flat", "g/nothing", "g/other"], done.stdout
    assert "other than the first" in left_out["g/flat"]
    assert "a second dimension of length 0" in left_out["g/other"]
    assert "has no size" in left_out["g/nothing"]  # |S0

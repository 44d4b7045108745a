"""The netCDF view (``--netcdf``) through real mounts, read by real readers: Debian's
ncdump, nccopy and GDAL, netCDF4-python, scipy.io.netcdf_file, cp and cmp.

Datasets: the bundled example (examples/air, compared with examples/air/air.nc), and a
set written here whose arrays take every mapping of :mod:`refmount.netcdf.types`
(int64 and datetimes, unsigned, bool, fixed strings, a scalar, a chunk absent, a
chunk of an edge), compared with the values it was written from.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import random
import shutil
import subprocess
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import scipy.io

from tests.support.mounting import REFMOUNT, REPO, Mounted, child_env

AIR = REPO / "examples" / "air"
VARIABLES = ("air", "lat", "lon", "time")


def ncdump(*args: str) -> str:
    return subprocess.run(
        ["ncdump", *args], capture_output=True, text=True, timeout=120, check=True
    ).stdout


def data_section(text: str) -> str:
    """What ncdump prints after ``data:`` (the values)."""
    return text.split("data:", 1)[1]


def mount_air(mount: Callable[..., Mounted], *args: str) -> Path:
    mounted = mount(AIR / "refs.json", "--netcdf", "--netcdf-name", "air", *args)
    return mounted.mountpoint / "air.nc"


def test_air_is_one_netcdf_file_whose_values_equal_the_original(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    path = mount_air(mount)
    assert sorted(os.listdir(path.parent)) == ["air.nc"]
    size = path.stat().st_size
    with open(path, "rb") as f:
        assert f.read(4) == b"CDF\x02"
    # ncdump's values, variable by variable, equal the original file's
    for name in VARIABLES:
        assert (
            data_section(ncdump("-v", name, str(path))).split(f" {name} =", 1)[1]
            == (data_section(ncdump("-v", name, str(AIR / "air.nc"))).split(f" {name} =", 1)[1])
        )
    header = ncdump("-h", str(path))
    assert "float air(time, lat, lon) ;" in header
    assert "time = UNLIMITED ; // (124 currently)" in header  # as in the original
    assert 'air:units = "K" ;' in header and "air:least_significant_digit = 2 ;" in header
    # netCDF4-python and scipy read every value and attribute as the original holds them
    with netCDF4.Dataset(AIR / "air.nc") as original, netCDF4.Dataset(path) as served:
        assert served.file_format == "NETCDF3_64BIT_OFFSET"
        assert served.ncattrs() and {a: served.getncattr(a) for a in served.ncattrs()} == {
            a: original.getncattr(a) for a in original.ncattrs()
        }
        for name in VARIABLES:
            assert np.array_equal(served[name][:], original[name][:])
            assert served[name].dimensions == original[name].dimensions
            assert served[name].units == original[name].units
        expected = {name: original[name][:] for name in VARIABLES}
    with scipy.io.netcdf_file(path, mmap=False) as f:
        assert f.version_byte == 2
        for name in VARIABLES:
            assert np.array_equal(f.variables[name][:], expected[name])
    # a copy is the same file; ncdump of the copy equals ncdump through the mount
    copy = tmp_path / "copy.nc"
    shutil.copyfile(path, copy)
    assert copy.stat().st_size == size
    assert ncdump(str(copy)).replace("copy", "air", 1) == ncdump(str(path))
    subprocess.run(["cmp", str(copy), str(path)], check=True)
    # nccopy to netCDF-4, and GDAL's netCDF driver
    nc4 = tmp_path / "air4.nc"
    subprocess.run(["nccopy", "-k", "nc4", str(path), str(nc4)], check=True, timeout=120)
    with netCDF4.Dataset(nc4) as converted:
        assert np.array_equal(converted["air"][:], expected["air"])
    info = subprocess.run(
        ["gdalinfo", str(path)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "netCDF/Network Common Data Format" in info and "Size is 53, 25" in info


def test_random_unaligned_reads_equal_the_same_bytes_of_the_whole_file(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    whole = mount_air(mount).read_bytes()
    fresh = mount_air(mount)  # a second mount: its page cache is empty
    rng = random.Random(30)
    with open(fresh, "rb", buffering=0) as f:
        for _ in range(200):
            start = rng.randrange(len(whole))
            length = rng.choice([1, 3, 7, 4093, 70001, 300000])
            f.seek(start)
            assert f.read(length) == whole[start : start + length], (start, length)
        # past the end: nothing
        f.seek(len(whole) + 5)
        assert f.read(10) == b""


# -- every type mapping -------------------------------------------------------------------

BIG = (1 << 53) + 1  # an int64 no double holds


def zarray(shape: list[int], chunks: list[int], dtype: str, fill: object = None) -> str:
    meta = {
        "zarr_format": 2, "shape": shape, "chunks": chunks, "dtype": dtype,
        "compressor": {"id": "zlib", "level": 1}, "filters": None, "order": "C",
        "fill_value": fill,
    }  # fmt: skip
    return json.dumps(meta)


def chunk(values: np.ndarray) -> str:
    return "base64:" + base64.b64encode(zlib.compress(values.tobytes())).decode()


def typed_set(directory: Path, *, inexact: bool = False) -> tuple[Path, dict[str, np.ndarray]]:
    """A set of arrays of every kind, and the values a reader must see."""
    counts = np.array([0, -5, 1 << 40, BIG if inexact else 7], "<i8")
    when = np.array(["2020-01-01T00:00:00", "2020-01-02T12:00:00", "NaT"], "<M8[s]")
    level = np.array([0, 1, 65535, 40000], "<u2")
    flag = np.array([True, False, True], "|b1")
    code = np.array([b"ab", b"cdefg", b""], "|S5")
    sparse = np.arange(6, dtype="<f4").reshape(2, 3)
    refs = {
        ".zgroup": '{"zarr_format": 2}',
        ".zattrs": json.dumps({"title": "types", "answer": 42, "ratios": [0.5, 2]}),
        "count/.zarray": zarray([4], [2], "<i8"),
        "count/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["n"]}),
        "count/0": chunk(counts[:2]),
        "count/1": chunk(counts[2:]),
        "when/.zarray": zarray([3], [3], "<M8[s]"),
        "when/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["m"]}),
        "when/0": chunk(when),
        "level/.zarray": zarray([4], [4], "<u2", 65535),
        "level/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["n"], "_FillValue": 65535}),
        "level/0": chunk(level),
        "flag/.zarray": zarray([3], [3], "|b1"),
        "flag/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["m"]}),
        "flag/0": chunk(flag),
        "code/.zarray": zarray([3], [2], "|S5"),
        "code/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["m"]}),
        "code/0": chunk(code[:2]),
        "code/1": chunk(np.array([b"", b""], "|S5")),  # the edge chunk, padded
        "crs/.zarray": zarray([], [], "<i4"),
        "crs/.zattrs": json.dumps({"grid_mapping_name": "latitude_longitude"}),
        "crs/0": chunk(np.array(7, "<i4")),
        "sparse/.zarray": zarray([2, 3], [1, 2], "<f4", -1.0),
        "sparse/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["row", "m"]}),
        "sparse/0.0": chunk(np.array([0, 1], "<f4")),
        "sparse/0.1": chunk(np.array([2, 0], "<f4")),
        "sparse/1.1": chunk(np.array([5, 0], "<f4")),  # 1.0 absent: the fill value
        "cplx/.zarray": zarray([2], [2], "<c8"),  # no netCDF type: left out, named
        "cplx/0": chunk(np.array([1 + 2j, 3], "<c8")),
    }
    path = directory / "types.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    sparse[1, :2] = -1.0
    expected = {
        "count": counts,
        "when": when.astype("<i8"),
        "level": level,
        "flag": flag.astype("i1"),
        "code": code,
        "crs": np.array(7, "<i4"),
        "sparse": sparse,
    }
    return path, expected


def test_every_type_reads_as_written_in_cdf2_and_cdf5(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    refs, expected = typed_set(tmp_path)
    mounted = mount(refs, "--netcdf")
    two = mounted.mountpoint / "types.nc"
    five = mount(refs, "--netcdf", "--netcdf-format", "cdf5").mountpoint / "types.nc"
    with netCDF4.Dataset(two) as ds:
        ds.set_auto_maskandscale(False)
        assert ds.file_format == "NETCDF3_64BIT_OFFSET"
        assert (ds.title, ds.answer, list(ds.ratios)) == ("types", 42, [0.5, 2.0])
        assert ds["count"].dtype == np.float64 and ds["when"].dtype == np.int32
        assert np.array_equal(ds["count"][:], expected["count"].astype("f8"))
        # times in the coarsest unit holding every value (netcdf/wide.py), NaT int's fill
        assert ds["when"][:].tolist() == [438288, 438324, -2147483647]
        assert ds["when"].units == "hours since 1970-01-01T00:00:00"
        # unsigned in the wider type that holds its values (no _Unsigned: Octave, R
        # and CDO's fill value read that as signed)
        assert ds["level"].dtype == np.int32 and "_Unsigned" not in ds["level"].ncattrs()
        assert np.array_equal(ds["level"][:], expected["level"])
        assert ds["level"]._FillValue == 65535
        assert np.array_equal(ds["flag"][:], expected["flag"])
        assert ds["code"].dimensions == ("m", "strlen5")
        assert list(netCDF4.chartostring(ds["code"][:])) == ["ab", "cdefg", ""]
        assert ds["crs"].dimensions == () and ds["crs"][...] == 7
        assert ds["crs"].grid_mapping_name == "latitude_longitude"
        assert np.array_equal(ds["sparse"][:], expected["sparse"])
        assert sorted(ds.variables) == sorted(expected)  # cplx left out
    assert "array 'cplx' is left out" in mounted.log()
    with netCDF4.Dataset(two) as ds:  # 65535 masked
        unpacked = np.where(expected["level"] == 65535, 0, expected["level"])
        assert np.array_equal(ds["level"][:].filled(0), unpacked)
    with scipy.io.netcdf_file(two, mmap=False) as f:
        assert np.array_equal(f.variables["sparse"][:], expected["sparse"])
        assert np.array_equal(f.variables["count"][:], expected["count"].astype("f8"))
    with netCDF4.Dataset(five) as ds:
        ds.set_auto_maskandscale(False)
        assert ds.file_format == "NETCDF3_64BIT_DATA"
        assert ds["count"].dtype == np.int64 and ds["level"].dtype == np.uint16
        for name in ("count", "level", "flag", "sparse"):
            assert np.array_equal(ds[name][:], expected[name]), name
        assert ds["when"][:].tolist() == [438288, 438324, expected["when"][2]]
    assert "int64 count(n)" in ncdump("-h", str(five))


def test_an_integer_no_double_holds_is_left_out_or_fails_its_read_or_reads_in_cdf5(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    refs, _ = typed_set(tmp_path, inexact=True)
    auto = mount(refs, "--netcdf")
    with netCDF4.Dataset(auto.mountpoint / "types.nc") as ds:  # auto leaves it out, named
        assert "count" not in ds.variables and ds.file_format == "NETCDF3_64BIT_OFFSET"
    assert "array 'count' is left out" in auto.log()
    mounted = mount(refs, "--netcdf", "--netcdf-format", "64bit-offset")
    two = mounted.mountpoint / "types.nc"
    assert two.stat().st_size > 0  # the header is made from the metadata alone
    with open(two, "rb") as f, pytest.raises(OSError) as failed:
        f.read()  # the whole file holds the inexact value
    assert failed.value.errno == errno.EIO
    assert f"the integer {BIG} has no exact double" in mounted.log()
    five = mount(refs, "--netcdf", "--netcdf-format", "cdf5").mountpoint / "types.nc"
    with netCDF4.Dataset(five) as ds:
        assert ds["count"][3] == BIG


def test_a_chunk_that_fails_mid_copy_is_eio_never_zeros(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    refs = json.loads((AIR / "refs.json").read_text())
    entry = refs["refs"]["air/2.0.0"]
    entry[1] += 100  # inside the chunk: not zlib
    for value in refs["refs"].values():
        if isinstance(value, list):
            value[0] = str(AIR / "air.nc")
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(refs))
    path = mount(broken, "--netcdf", "--allow-local").mountpoint / "broken.nc"
    with open(path, "rb") as f:
        with pytest.raises(OSError) as failed:
            while f.read(1 << 20):
                pass
        assert failed.value.errno == errno.EIO
    copy = tmp_path / "copy.nc"
    result = subprocess.run(["cp", str(path), str(copy)], capture_output=True, text=True)
    assert result.returncode != 0 and "Input/output error" in result.stderr


def test_netcdf_format_classic_and_a_name(mount: Callable[..., Mounted]) -> None:
    path = mount_air(mount, "--netcdf-format", "classic")
    with open(path, "rb") as f:
        assert f.read(4) == b"CDF\x01"
    with scipy.io.netcdf_file(path, mmap=False) as f, netCDF4.Dataset(AIR / "air.nc") as o:
        assert f.version_byte == 1
        assert np.array_equal(f.variables["air"][:], o["air"][:])


def test_check_netcdf_names_what_is_left_out(tmp_path: Path) -> None:
    refs, _ = typed_set(tmp_path)
    done = subprocess.run(
        [*REFMOUNT, "check", "--netcdf", "--json", str(refs)],
        capture_output=True, text=True, timeout=120, env=child_env(),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    (made,) = report["netcdf"]["files"]
    assert made["name"] == "types.nc" and made["format"] == "64bit-offset"
    assert sorted(made["variables"]) == ["code", "count", "crs", "flag", "level", "sparse", "when"]
    assert list(report["netcdf"]["left_out"]) == ["cplx"]
    assert [p["kind"] for p in report["problems"]] == ["netcdf"]
    assert "cplx: left out of the file: complex values" in report["problems"][0]["message"]
    five = subprocess.run(
        [*REFMOUNT, "check", "--netcdf", "--netcdf-format", "cdf5", str(refs)],
        capture_output=True, text=True, timeout=120, env=child_env(),
    )  # fmt: skip
    assert "types.nc" in five.stdout and "cdf5: " in five.stdout


def test_a_reload_swaps_the_file_and_an_open_file_keeps_its_bytes(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    refs, _ = typed_set(tmp_path)
    mounted = mount(refs, "--netcdf")
    path = mounted.mountpoint / "types.nc"
    with open(path, "rb") as opened:
        before = opened.read()
        document = json.loads(refs.read_text())
        document["refs"]["crs/0"] = chunk(np.array(8, "<i4"))
        document["refs"]["note/.zarray"] = zarray([2], [2], "<f8")
        document["refs"]["note/0"] = chunk(np.array([1.5, 2.5], "<f8"))
        refs.write_text(json.dumps(document))
        mounted.process.send_signal(1)  # SIGHUP: reload
        deadline = time.monotonic() + 60
        while path.stat().st_size == len(before):
            assert time.monotonic() < deadline, mounted.log()
            time.sleep(0.1)
        opened.seek(0)
        assert opened.read() == before  # the file it opened
    with netCDF4.Dataset(path) as ds:
        assert ds["crs"][...] == 8 and list(ds["note"][:]) == [1.5, 2.5]


def test_unsigned_arrays_over_many_chunks_read_whole_and_at_any_offset(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    """Unsigned values are wider in a CDF-2 file than served (uint8 as short, uint16 as
    int, uint32 as double): every chunk's values land at their place, edge chunks, a
    missing chunk (the fill value) and the padding of an odd count of shorts included,
    through ``cp`` (the kernel's read-ahead) and through reads at random offsets."""
    rng = np.random.default_rng(37)
    arrays = {
        "u1": (rng.integers(0, 256, (301, 257), dtype="u1"), [64, 100], 255),
        "u2": (rng.integers(0, 65536, (37, 41), dtype="<u2"), [10, 10], 65535),
        "u4": (rng.integers(0, 2**32, (33,), dtype="<u4"), [10], None),
    }
    refs: dict[str, str] = {".zgroup": '{"zarr_format": 2}'}
    for name, (values, chunks, fill) in arrays.items():
        refs[f"{name}/.zarray"] = zarray(list(values.shape), chunks, values.dtype.str, fill)
        dims = [f"{name}_{i}" for i in range(values.ndim)]
        refs[f"{name}/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": dims})
        grid = [range(-(-n // c)) for n, c in zip(values.shape, chunks, strict=True)]
        for index in np.ndindex(*(len(g) for g in grid)):
            part = np.zeros(chunks, values.dtype) + (fill or 0)
            box = tuple(slice(i * c, (i + 1) * c) for i, c in zip(index, chunks, strict=True))
            inside = values[box]
            part[tuple(slice(0, n) for n in inside.shape)] = inside
            refs[f"{name}/{'.'.join(map(str, index))}"] = chunk(part)
    del refs["u1/1.1"]  # absent: its fill value, 255
    arrays["u1"][0][64:128, 100:200] = 255
    path = tmp_path / "unsigned.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    served = mount(path, "--netcdf").mountpoint / "unsigned.nc"
    copy = tmp_path / "copy.nc"
    shutil.copyfile(served, copy)
    whole = copy.read_bytes()
    with netCDF4.Dataset(copy) as ds:
        ds.set_auto_maskandscale(False)
        assert [ds[n].dtype for n in arrays] == [np.int16, np.int32, np.float64]
        for name, (values, _, _) in arrays.items():
            assert np.array_equal(ds[name][:], values), name
    draw = random.Random(37)
    with open(served, "rb", buffering=0) as f:
        for _ in range(200):
            start, length = draw.randrange(len(whole)), draw.randrange(1, 5000)
            f.seek(start)
            assert f.read(length) == whole[start : start + length], (start, length)

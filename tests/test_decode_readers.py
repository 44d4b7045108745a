"""The reader matrix of issue #14: every reader, every variable, through the raw view and
through ``--decode``, compared with netCDF4-python reading the original file.

The files (tests/support/reader_datasets.py) are what people reference: netCDF4 with zlib
+ shuffle, CF attributes and fill values, packed int16, uncompressed and contiguous
variables, fletcher32, a scalar ``crs`` and a string variable; netCDF3 classic with a record
dimension (big-endian); HDF5 with blosc-lz4 and zstd (hdf5plugin).  Each is referenced by
kerchunk and by VirtualiZarr, mounted, and read by ncdump (Debian's netCDF-C), Debian's GDAL
(``gdalmdiminfo -detailed``, ``gdal_translate``), the rasterio wheel's GDAL, zarr 3 and
xarray (tests/support/reader_runs.py).

Each variable's outcome is asserted exactly, per reader and view, from the tables below:

* ``--decode``: every variable equal, except the refusals listed (a reader's own clear
  message, or a variable the decoded view leaves out, which ``refmount check --decode``
  then names).  Never "wrong", never a crash.  The scalar ``crs`` is served as one element
  along ``_scalar_``: every reader reads it, ncdump 4.9.0 and GDAL's raster API included.
* raw view: the limits users meet today (the reason for ``--decode``), where a reader
  reads compressed bytes as numbers ("wrong") or dies.

What each scanner leaves out is the scanner's: kerchunk does not reference a fletcher32
variable (``Hdf5FeatureNotSupported``, warned and skipped).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import kerchunk.hdf
import kerchunk.netCDF3
import numpy as np
import pytest
import xarray as xr
import zarr
from obspec_utils.registry import ObjectStoreRegistry
from obstore.store import LocalStore
from virtualizarr import open_virtual_dataset
from virtualizarr.parsers import HDFParser, NetCDF3Parser

from refmount.decode.scalars import SCALAR_DIMENSION
from tests.support import reader_runs
from tests.support.mounting import Mounted
from tests.support.reader_datasets import Dataset, fill_values, stored_values, write_datasets
from tests.support.reader_runs import EQUAL, Outcome

#: What a scanner does not reference at all (so no reader can read it through any view).
SCANNER_LEAVES_OUT = {("kerchunk", "cf"): {"checked"}}


@dataclass
class RefSet:
    name: str  # maker-dataset
    path: Path
    dataset: Dataset
    expected: dict[str, np.ndarray]
    fills: dict[str, object]  # what ncdump's "_" stands for, per variable


def kerchunk_set(dataset: Dataset) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "exception was caught and quashed": fletcher32
        if dataset.kind == "netcdf3":
            return kerchunk.netCDF3.NetCDF3ToZarr(
                str(dataset.path), inline_threshold=100
            ).translate()
        with open(dataset.path, "rb") as f:
            return kerchunk.hdf.SingleHdf5ToZarr(
                f, dataset.path.as_uri(), inline_threshold=100
            ).translate()


def virtualizarr_set(dataset: Dataset, directory: Path) -> dict:
    registry = ObjectStoreRegistry({"file://": LocalStore()})
    parser = NetCDF3Parser() if dataset.kind == "netcdf3" else HDFParser()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vds = open_virtual_dataset(dataset.path.as_uri(), registry=registry, parser=parser)
        vds.vz.to_kerchunk(str(directory / "vz.json"), format="json")
    return json.loads((directory / "vz.json").read_text())


MAKERS: dict[str, Callable[[Dataset, Path], dict]] = {
    "kerchunk": lambda dataset, _directory: kerchunk_set(dataset),
    "virtualizarr": virtualizarr_set,
}
DATASETS = ("cf", "classic", "plugins")
SETS = [f"{maker}-{dataset}" for maker in MAKERS for dataset in DATASETS]
#: The sets of cf.nc, the one file with CF attributes and a rank-0 variable.
CF_SETS = [name for name in SETS if name.endswith("-cf")]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Dataset]:
    return {d.name: d for d in write_datasets(tmp_path_factory.mktemp("matrix-data"))}


@pytest.fixture(scope="module", params=SETS)
def refset(
    request: pytest.FixtureRequest,
    datasets: dict[str, Dataset],
    tmp_path_factory: pytest.TempPathFactory,
) -> RefSet:
    maker, name = request.param.split("-")
    dataset = datasets[name]
    directory = tmp_path_factory.mktemp(request.param)
    refs = MAKERS[maker](dataset, directory)
    path = directory / "refs.json"
    path.write_text(json.dumps(refs))
    left_out = SCANNER_LEAVES_OUT.get((maker, name), set())
    keys = refs.get("refs", refs)
    assert not [k for k in keys if k.split("/")[0] in left_out], "the scanner now has them"
    expected = {k: v for k, v in stored_values(dataset.path).items() if k not in left_out}
    return RefSet(request.param, path, dataset, expected, fill_values(dataset.path))


VIEWS = ["raw", "decode"]


@pytest.fixture(scope="module", params=VIEWS)
def view(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def mounted(refset: RefSet, view: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp(f"mnt-{view}")
    (directory / "mnt").mkdir()
    args = ["--decode"] if view == "decode" else []
    m = Mounted(refset.path, directory / "mnt", args, directory / "refmount.log")
    try:
        yield m.mountpoint
    finally:
        m.stop()


# -- what each reader must give --------------------------------------------------------------

RANK0 = Outcome("refused", "Unsupported number of dimensions")
VLEN = Outcome("refused", "Invalid or unsupported format for dtype: |O")
SHUFFLE = Outcome("refused", "Filter shuffle not handled")  # GDAL < 3.11
FLETCHER32 = Outcome("refused", "Filter fletcher32 not handled")
#: GDAL 3.12.2 fails a ``zlib`` filter (not compressor) whose compressed chunk is larger
#: than the decoded one (``Filter zlib for tile ... failed``): ``packed``'s and ``nanfill``'s
#: 120-byte chunks of random values are stored in 131.
ZLIB_3_12 = Outcome("refused", "Filter zlib for tile")
WRONG = Outcome("wrong")
CRASH = Outcome("crash", "signal 11")

CF = ("time", "y", "x", "crs", "temp", "packed", "plain", "cont", "nanfill", "checked")
CF_ALL = (*CF, "station_name")
CLASSIC = ("time", "temp", "packed", "height", "nanfill")
PLUGINS = ("lz4", "zstd")

#: Raw view: where readers fail today (found by running this matrix; the same happens on a
#: plain directory copy of the tree: tests/test_readers_gdal.py).  Keyed by reader, then
#: "maker-dataset"; variables not named read equal.
#:
#: * ncdump 4.9.0 dies on any variable of a tree holding a variable-length string array,
#:   ignores Zarr filters (compressed bytes printed as numbers) and reads big-endian data
#:   in native order;
#: * GDAL 3.6 refuses shuffle, fletcher32, rank 0 (raster API) and ``|O``; 3.12 refuses
#:   fletcher32, rank 0 and ``|O``, and fails a zlib filter's chunk stored larger than decoded;
#: (VirtualiZarr writes a rank-0 array's chunk key as ``crs/``, which no reader asks for:
#: refmount serves it as ``crs/0``, so every reader that reads ``crs`` reads its value.)
RAW_LIMITS: dict[str, dict[str, dict[str, Outcome]]] = {
    "ncdump": {
        "kerchunk-cf": dict.fromkeys(CF_ALL, CRASH),
        "virtualizarr-cf": dict.fromkeys(CF_ALL, CRASH),
        "kerchunk-classic": dict.fromkeys(CLASSIC, WRONG),
        "virtualizarr-classic": dict.fromkeys(("temp", "packed", "height", "nanfill"), WRONG),
        "kerchunk-plugins": dict.fromkeys(PLUGINS, WRONG),
        "virtualizarr-plugins": dict.fromkeys(PLUGINS, WRONG),
    },
    "gdalmdiminfo": {
        "kerchunk-cf": {
            **dict.fromkeys(("temp", "packed", "nanfill"), SHUFFLE), "station_name": VLEN
        },
        "virtualizarr-cf": {
            **dict.fromkeys(("temp", "packed", "nanfill"), SHUFFLE),
            "station_name": VLEN, "checked": FLETCHER32,
        },
    },
    "gdal_translate": {
        "kerchunk-cf": {
            **dict.fromkeys(("temp", "packed", "nanfill"), SHUFFLE),
            "station_name": VLEN, "crs": RANK0,
        },
        "virtualizarr-cf": {
            **dict.fromkeys(("temp", "packed", "nanfill"), SHUFFLE),
            "station_name": VLEN, "crs": RANK0, "checked": FLETCHER32,
        },
    },
    "rasterio": {
        "kerchunk-cf": {
            "packed": ZLIB_3_12, "nanfill": ZLIB_3_12, "station_name": VLEN, "crs": RANK0
        },
        "virtualizarr-cf": {
            "packed": ZLIB_3_12, "nanfill": ZLIB_3_12, "station_name": VLEN, "crs": RANK0,
            "checked": FLETCHER32,
        },
    },
}  # fmt: skip

ABSENT = Outcome("absent")
#: What the decoded view leaves out (and ``refmount check --decode`` names): a
#: variable-length string array has no fixed-size decoding.
DECODE_LEFT_OUT = {"cf": {"station_name"}}

#: --decode: what readers still refuse.  Everything else reads equal.  Nothing now: a
#: rank-0 array, which GDAL's raster API refuses and netCDF-C 4.9.0 dies reading the data
#: of (raw view, or a plain directory copy), is served as one element along ``_scalar_``
#: (``compare`` reshapes what a reader got to the original's shape ``()``;
#: ``test_zarr_sees_a_rank0_array_as_one_element_through_decode`` checks the shape).
DECODE_LIMITS: dict[str, dict[str, Outcome]] = {}


def expectations(reader: str, view: str, refset: RefSet) -> dict[str, Outcome]:
    """Every variable's outcome that differs from EQUAL, for this reader, view and set."""
    if view == "decode":
        dataset = refset.name.split("-")[1]
        return DECODE_LIMITS.get(reader, {}) | dict.fromkeys(
            DECODE_LEFT_OUT.get(dataset, ()), ABSENT
        )
    return RAW_LIMITS.get(reader, {}).get(refset.name, {})


def matches(got: Outcome, want: Outcome) -> bool:
    return got.kind == want.kind and want.detail in got.detail


def check(reader: str, view: str, refset: RefSet, outcomes: dict[str, Outcome]) -> None:
    want = expectations(reader, view, refset)
    report = f"{reader} {view} {refset.name}: " + json.dumps(
        {name: str(o) for name, o in sorted(outcomes.items())}, ensure_ascii=False
    )
    for name, got in outcomes.items():
        assert matches(got, want.get(name, EQUAL)), f"{name}: {report}"
    if view == "decode":
        assert not [o for o in outcomes.values() if o.kind == "wrong"], report


def each(
    refset: RefSet, mounted: Path, read: Callable[[str, np.ndarray], Outcome]
) -> dict[str, Outcome]:
    """``read`` of every variable in the mounted tree; those not in it are ABSENT."""
    present = set(os.listdir(mounted))
    return {
        name: read(name, values) if name in present else ABSENT
        for name, values in refset.expected.items()
    }


# -- the matrix -------------------------------------------------------------------------------


def test_ncdump(refset: RefSet, view: str, mounted: Path) -> None:
    outcomes = each(
        refset, mounted, lambda n, v: reader_runs.ncdump(mounted, n, v, refset.fills.get(n))
    )
    check("ncdump", view, refset, outcomes)
    if view == "decode":  # and the whole tree at once, every variable's data printed
        failure, printed = reader_runs.ncdump_whole(mounted)
        assert failure is None, failure
        data = printed.split("\ndata:\n", 1)[1]
        present = {name for name, got in outcomes.items() if got.kind != "absent"}
        assert {n for n in present if re.search(rf"^ {n} =", data, re.M)} == present


def test_gdal_debian_mdim(refset: RefSet, view: str, mounted: Path) -> None:
    outcomes = each(refset, mounted, lambda n, v: reader_runs.gdalmdiminfo(mounted, n, v))
    check("gdalmdiminfo", view, refset, outcomes)


def test_gdal_debian_translate(refset: RefSet, view: str, mounted: Path, tmp_path: Path) -> None:
    outcomes = each(
        refset, mounted, lambda n, v: reader_runs.gdal_translate(mounted, n, v, tmp_path)
    )
    check("gdal_translate", view, refset, outcomes)


def test_gdal_rasterio_wheel(refset: RefSet, view: str, mounted: Path, tmp_path: Path) -> None:
    present = set(os.listdir(mounted))
    expected = {k: v for k, v in refset.expected.items() if k in present}
    outcomes = reader_runs.rasterio_gdal(mounted, expected, tmp_path)
    outcomes |= dict.fromkeys(set(refset.expected) - present, ABSENT)
    check("rasterio", view, refset, outcomes)


def test_zarr3(refset: RefSet, view: str, mounted: Path) -> None:
    outcomes = each(refset, mounted, lambda n, v: reader_runs.zarr3(mounted, n, v))
    check("zarr", view, refset, outcomes)


def test_xarray(refset: RefSet, view: str, mounted: Path) -> None:
    outcomes = each(refset, mounted, lambda n, v: reader_runs.xarray_stored(mounted, n, v))
    check("xarray", view, refset, outcomes)


def test_check_names_what_decode_leaves_out(refset: RefSet, view: str, mounted: Path) -> None:
    """What the decoded view leaves out is exactly what ``refmount check --decode`` names,
    and the raw view has every variable."""
    present = set(os.listdir(mounted))
    missing = set(refset.expected) - present
    if view == "raw":
        assert not missing
        return
    dataset = refset.name.split("-")[1]
    assert missing == DECODE_LEFT_OUT.get(dataset, set())
    reader_runs.assert_check_names(refset.path, missing)


@pytest.mark.parametrize("refset", CF_SETS, indirect=True)
def test_xarray_decodes_cf_as_from_the_original(refset: RefSet, view: str, mounted: Path) -> None:
    """xarray's CF decoding (masked fill values, scaled packed integers, times) through the
    mount equals xarray opening the original file, less what the set or view leaves out."""
    left_out = set(stored_values(refset.dataset.path)) - set(os.listdir(mounted))
    with xr.open_dataset(refset.dataset.path) as original:
        expected = original.drop_vars(sorted(left_out)).load()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with xr.open_zarr(str(mounted), consolidated=False) as ds:
            loaded = ds.load()
    if view == "decode":
        # rank 0 is served as one element along "_scalar_": the value, once squeezed
        assert loaded["crs"].dims == (SCALAR_DIMENSION,) and loaded.sizes[SCALAR_DIMENSION] == 1
        assert [name for name, v in loaded.variables.items() if SCALAR_DIMENSION in v.dims] == [
            "crs"
        ]
        loaded = loaded.squeeze(SCALAR_DIMENSION)
    xr.testing.assert_equal(loaded, expected)
    assert loaded["time"].dtype.kind == "M"
    assert loaded["packed"].dtype.kind == "f" and int(loaded["packed"].isnull().sum()) == 3
    assert int(loaded["temp"].isnull().sum()) == 4


@pytest.mark.parametrize("refset", CF_SETS, indirect=True)
def test_zarr_sees_a_rank0_array_as_one_element_through_decode(
    refset: RefSet, view: str, mounted: Path
) -> None:
    """zarr 3 reads ``crs`` as shape ``()`` through the raw view and ``(1,)`` through
    ``--decode``, with the same value (VirtualiZarr's ``crs/`` key served as ``crs/0``)."""
    crs = zarr.open_group(str(mounted), mode="r", zarr_format=2)["crs"]
    assert crs.shape == ((1,) if view == "decode" else ())
    assert crs.attrs["_ARRAY_DIMENSIONS"] == ([SCALAR_DIMENSION] if view == "decode" else [])
    assert crs[...].tolist() == ([0] if view == "decode" else 0)

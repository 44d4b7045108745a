"""The netCDF view read as users read: xarray's ``open_dataset`` with CF decoding on, and
CDO unpacking, through each ``.nc`` of the reader matrix's sets (kerchunk and
VirtualiZarr of tests/support/reader_datasets.py's files, and of ``packed.nc``, a gridded
product's packing), give what they give on the original file: the same variables,
dtypes, values, masks and attributes (issue 37: ``_FillValue`` dropped made every CF
reader take fill values for data; ``float`` packing attributes came back ``double``).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import xarray as xr

from refmount.netcdf.attributes import variable_attributes, zarr_fill
from refmount.netcdf.header import (
    NC_DOUBLE,
    NC_FLOAT,
    NC_INT,
    NC_SHORT,
    NC_UBYTE,
    NC_UINT,
    NC_USHORT,
)
from refmount.netcdf.order import cf_order, mapping_names
from refmount.netcdf.types import FileType, attribute, file_type, from_single
from tests.support.mounting import REPO, Mounted
from tests.support.reader_datasets import Dataset, write_datasets, write_packed_netcdf4
from tests.test_decode_readers import MAKERS, SCANNER_LEAVES_OUT

SETS = [f"{maker}-{name}" for maker in MAKERS for name in ("cf", "classic", "plugins", "packed")]


@dataclass
class Served:
    name: str
    original: Path
    nc: Path
    left_out: set[str]  # what the scanner does not reference


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Dataset]:
    directory = tmp_path_factory.mktemp("cf-data")
    found = {d.name: d for d in write_datasets(directory)}
    found["packed"] = Dataset("packed", write_packed_netcdf4(directory / "packed.nc"), "netcdf4")
    return found


def serve(
    param: str, files: dict[str, Dataset], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    maker, name = param.split("-")
    directory = tmp_path_factory.mktemp(param)
    refs = directory / "refs.json"
    refs.write_text(json.dumps(MAKERS[maker](files[name], directory)))
    (directory / "mnt").mkdir()
    m = Mounted(refs, directory / "mnt", ["--netcdf"], directory / "refmount.log")
    try:
        left_out = SCANNER_LEAVES_OUT.get((maker, name), set())
        yield Served(param, files[name].path, m.mountpoint / "refs.nc", left_out)
    finally:
        m.stop()


@pytest.fixture(scope="module", params=SETS)
def served(
    request: pytest.FixtureRequest,
    files: dict[str, Dataset],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    yield from serve(request.param, files, tmp_path_factory)


@pytest.fixture(scope="module", params=[s for s in SETS if s.endswith("-packed")])
def packed(
    request: pytest.FixtureRequest,
    files: dict[str, Dataset],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    yield from serve(request.param, files, tmp_path_factory)


def same_values(got: xr.DataArray, expected: xr.DataArray) -> bool:
    if expected.dtype.kind in "OUS":  # strings: a char array reads back as text
        return got.values.tolist() == expected.values.tolist()
    return np.array_equal(got.values, expected.values, equal_nan=expected.dtype.kind in "fcmM")


#: The type an unsigned variable's values and attributes have in a CDF-1/2 file.
WIDER = {"|u1": "<i2", "<u2": "<i4", "<u4": "<f8"}


def attributes(
    variable: xr.DataArray | xr.Dataset, *, unsigned: bool = False
) -> dict[str, tuple[str, object]]:
    """Each attribute's value and type (a float's and a double's differ); with
    ``unsigned`` (an original unsigned variable), those of the unsigned type as the view's
    CDF-2 file has them: in the wider type that holds its values."""
    out = {}
    for name, value in variable.attrs.items():
        array = np.asarray(value)
        dtype = array.dtype.str if array.dtype.kind != "U" else "str"
        out[name] = (WIDER.get(dtype, dtype) if unsigned else dtype, array.tolist())
    return out


def unsigned(variable: xr.DataArray) -> bool:
    """Whether the original variable is stored unsigned."""
    return np.dtype(variable.encoding.get("dtype", variable.dtype)).kind == "u"


def test_xarray_reads_the_file_as_the_original(served: Served) -> None:
    with xr.open_dataset(served.original) as original, xr.open_dataset(served.nc) as view:
        assert sorted(view.variables) == sorted(set(original.variables) - served.left_out)
        assert attributes(view) == attributes(original)
        for name, variable in view.variables.items():
            expected = original[name]
            wider = unsigned(expected)
            if expected.dtype.kind not in "OU":  # text: xarray reads char arrays as objects
                dtype = expected.dtype.str
                assert variable.dtype == WIDER.get(dtype, dtype), name
            assert same_values(variable, expected), name
            assert attributes(variable) == attributes(expected, unsigned=wider), name
            fill = expected.encoding.get("_FillValue")
            if fill is not None:  # the fill value in the variable's type
                got = np.asarray(variable.encoding.get("_FillValue"))
                want = np.asarray(fill)
                if wider:  # an unsigned variable's: in the wider type it is written in
                    want = want.astype(WIDER[want.dtype.str])
                assert got.dtype == want.dtype, name
                assert np.array_equal(got, want, equal_nan=got.dtype.kind == "f"), name


def test_xarray_reads_the_bundled_example_as_its_original(
    mount: Callable[..., Mounted],
) -> None:
    """examples/air, the netCDF reader tests' file (tests/test_netcdf_readers.py)."""
    air = REPO / "examples" / "air"
    path = mount(air / "refs.json", "--netcdf", "--netcdf-name", "air").mountpoint / "air.nc"
    with xr.open_dataset(air / "air.nc") as original, xr.open_dataset(path) as view:
        assert sorted(view.variables) == sorted(original.variables)
        assert attributes(view) == attributes(original)
        for name, variable in view.variables.items():
            assert variable.dtype == original[name].dtype, name
            assert same_values(variable, original[name]), name
            assert attributes(variable) == attributes(original[name]), name


def test_ncdump_prints_the_original_attributes(served: Served) -> None:
    """Every attribute of the original, as ncdump prints it (its type's suffix), but those
    of unsigned variables (in CDF-2 the wider type's, ``255s`` for ``255UB``)."""

    def header(path: Path) -> list[str]:
        done = subprocess.run(["ncdump", "-h", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        lines = [line.strip() for line in done.stdout.splitlines()]
        return [line.removeprefix("string ") for line in lines]  # netCDF-4 text: char

    original, through = header(served.original), header(served.nc)
    if served.name.startswith("virtualizarr"):  # VirtualiZarr writes CF times anew
        original = [line for line in original if not line.startswith("time:units")]
    unsigned = {
        line.split()[1].split("(")[0]
        for line in original
        if line.split(" ", 1)[0] in ("ubyte", "ushort", "uint")
    }
    for line in original:
        variable = line.split(":", 1)[0]
        if ":" in line and variable not in served.left_out | unsigned:
            assert line in through, line


def test_precip_mean_and_masks_are_the_original_s(packed: Served) -> None:
    """The issue's failure: a quarter of ``precip`` is its fill value -32767, which a view
    without ``_FillValue`` has xarray unpack as -327.67 mm/day."""
    with xr.open_dataset(packed.original) as original, xr.open_dataset(packed.nc) as view:
        assert view.precip.dtype == np.float32 == original.precip.dtype
        masked = int(original.precip.isnull().sum())
        assert masked > view.precip.size // 5
        assert int(view.precip.isnull().sum()) == masked
        assert float(view.precip.mean()) == float(original.precip.mean())
        assert 4 < float(view.precip.mean()) < 6


def cdo_unpacked(path: Path, out: Path) -> dict[str, np.ma.MaskedArray]:
    """Every variable as CDO unpacks it (``-b F64``: doubles, fill values masked)."""
    done = subprocess.run(
        ["cdo", "-s", "-b", "F64", "-f", "nc4", "copy", str(path), str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with netCDF4.Dataset(out) as ds:
        return {name: ds[name][:] for name in ds.variables}


def test_cdo_unpacks_as_from_the_original(served: Served, tmp_path: Path) -> None:
    """Every variable CDO copies from the original, copied from the view equal, masks
    included: the grid mapping ``crs`` too (CDO takes it from the first variable on a
    grid: variables come in CF's order, ``temp`` before ``cont``), and an unsigned
    variable's fill values (CDO reads a CDF-2 ``_Unsigned`` byte's ``_FillValue`` as
    signed, so they read as data: unsigned types are written in a wider type)."""
    expected = cdo_unpacked(served.original, tmp_path / "original.nc")
    got = cdo_unpacked(served.nc, tmp_path / "view.nc")
    assert set(expected) - served.left_out <= set(got)
    for name, values in expected.items():
        if name in got:
            assert np.array_equal(np.ma.getmaskarray(got[name]), np.ma.getmaskarray(values))
            assert np.array_equal(got[name].compressed(), values.compressed()), name
    if served.name.endswith("-packed"):
        assert expected["precip"].mask.any() and expected["sst"].mask.any()
        assert expected["flags"].mask.any() and expected["flags"].max() > 127
    if served.name.endswith("-cf"):
        assert "crs" in got


OCTAVE = (
    "pkg load netcdf; v = ncread('{path}', '{name}'); "
    "f = fopen('{out}', 'w'); fwrite(f, double(v(:)), 'double', 0, 'ieee-le'); fclose(f);"
)
R = (
    'library(ncdf4); f <- nc_open("{path}"); v <- ncvar_get(f, "{name}"); '
    'writeBin(as.double(v), "{out}", size = 8, endian = "little")'
)


@pytest.mark.parametrize("reader", ["octave", "r"])
def test_octave_and_r_read_an_unsigned_variable_as_the_original(
    packed: Served, reader: str, tmp_path: Path
) -> None:
    """``flags`` (uint8, 255 its fill value, values up to 254): Octave's ``ncread`` and
    R's ncdf4 ignore ``_Unsigned``, so a CDF-2 byte holding 189 read as -67."""

    def read(path: Path, out: Path) -> np.ndarray:
        if reader == "octave":
            script = OCTAVE.format(path=path, name="flags", out=out)
            argv = ["octave", "--no-gui", "--no-window-system", "-q", "--eval", script]
        else:
            argv = ["Rscript", "-e", R.format(path=path, name="flags", out=out)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return np.fromfile(out, "<f8")

    expected = read(packed.original, tmp_path / "original.f8")
    got = read(packed.nc, tmp_path / "view.f8")
    assert np.nanmax(expected) > 127 and np.isnan(expected).any()
    assert np.array_equal(got, expected, equal_nan=True)


# -- the rules, without a mount -------------------------------------------------------------


def kind_of(dtype: str, *, cdf5: bool = False) -> FileType:
    return file_type(np.dtype(dtype), boolean=False, cdf5=cdf5)


def test_fill_and_valid_values_take_the_variable_s_type() -> None:
    short, ubyte, single = kind_of("<i2"), kind_of("|u1"), kind_of("<f4")
    made = variable_attributes(
        "v", {"valid_range": [0, 30000], "missing_value": -32767.0}, short, cdf5=False, fill=-32767
    )
    assert [(a.name, a.nc_type, a.values.tolist()) for a in made] == [
        ("_FillValue", NC_SHORT, [-32767]),
        ("valid_range", NC_SHORT, [0, 30000]),
        ("missing_value", NC_SHORT, [-32767]),
    ]
    (fill, valid) = variable_attributes(
        "u", {"_FillValue": 255, "valid_range": [0, 254]}, ubyte, cdf5=False
    )
    assert (fill.nc_type, fill.values.tolist(), valid.values.tolist()) == (
        NC_SHORT,
        [255],
        [0, 254],
    )
    (fill,) = variable_attributes("u", {"_FillValue": 255}, kind_of("|u1", cdf5=True), cdf5=True)
    assert (fill.nc_type, fill.values.tolist()) == (NC_UBYTE, [255])  # CDF-5: its own type
    (fill,) = variable_attributes("i", {"_FillValue": -9999}, kind_of("<i8"), cdf5=False)
    assert (fill.nc_type, fill.values.tolist()) == (NC_DOUBLE, [-9999.0])  # int64 in CDF-2
    # xarray's Zarr v2 spelling of a float fill value (base64 of a little-endian double)
    (fill,) = variable_attributes("f", {"_FillValue": "AAAAAAA4j8A="}, single, cdf5=False)
    assert (fill.nc_type, fill.values.tolist()) == (NC_FLOAT, [-999.0])
    # a value the type does not hold: written as given; a fill value: left out
    (valid,) = variable_attributes("v", {"valid_min": 0.5, "_FillValue": 1e6}, short, cdf5=False)
    assert (valid.nc_type, valid.values.tolist()) == (NC_DOUBLE, [0.5])


def test_packing_attributes_take_the_unpacked_type() -> None:
    def types(document: dict, dtype: str) -> list[int]:
        return [a.nc_type for a in variable_attributes("v", document, kind_of(dtype), cdf5=False)]

    # kerchunk writes a float 0.01 as 0.009999999776482582: float, add_offset alike
    assert types({"scale_factor": 0.009999999776482582, "add_offset": 0.0}, "<i2") == [
        NC_FLOAT,
        NC_FLOAT,
    ]
    assert types({"scale_factor": 0.01, "add_offset": 273.15}, "<i2") == [NC_DOUBLE, NC_DOUBLE]
    assert types({"scale_factor": 0.5, "add_offset": 100.0}, "<i2") == [NC_DOUBLE, NC_DOUBLE]
    assert types({"scale_factor": 0.5}, "<f4") == [NC_FLOAT]  # the variable's own type
    assert types({"scale_factor": 0.01}, "<f4") == [NC_DOUBLE]  # no float holds it
    assert types({"scale_factor": 0.5}, "<f8") == [NC_DOUBLE]
    assert attribute("r", [0.0, 99.52999877929688], cdf5=False).nc_type == NC_FLOAT
    assert attribute("r", [0.0, 99.5], cdf5=False).nc_type == NC_DOUBLE  # says nothing
    assert not from_single(0.01) and not from_single(0.5) and from_single(0.009999999776482582)


def test_unsigned_types_are_written_in_a_wider_type_in_cdf2() -> None:
    assert [kind_of(d).nc_type for d in ("|u1", "<u2", "<u4")] == [NC_SHORT, NC_INT, NC_DOUBLE]
    assert [kind_of(d, cdf5=True).nc_type for d in ("|u1", "<u2", "<u4")] == [
        NC_UBYTE,
        NC_USHORT,
        NC_UINT,
    ]
    values = np.array([0, 189, 4294967295], "<u4")
    assert np.frombuffer(kind_of("<u4").convert(values.copy()), ">f8").tolist() == [
        0.0,
        189.0,
        4294967295.0,
    ]
    assert bytes(kind_of("|u1").convert(np.array([189], "u1"))) == b"\x00\xbd"


def test_variables_come_in_cf_order() -> None:
    def named(*arrays: tuple[str, dict]) -> list[str]:
        return [path for path, _, _ in cf_order([(p, None, d) for p, d in arrays])]

    dims = "_ARRAY_DIMENSIONS"
    assert named(
        ("cont", {dims: ["y", "x"]}),
        ("crs", {}),
        ("g/temp", {dims: ["time", "y", "x"], "grid_mapping": "crs"}),
        ("time", {dims: ["time"]}),
        ("x", {dims: ["x"]}),
    ) == ["time", "x", "crs", "g/temp", "cont"]
    # coordinates in the order of the dimensions of the variables they describe, as the
    # original's writer defined them (examples/air: time, lat, lon), not by name
    assert named(
        ("air", {dims: ["time", "lat", "lon"]}),
        ("lat", {dims: ["lat"]}),
        ("lon", {dims: ["lon"]}),
        ("time", {dims: ["time"]}),
    ) == ["time", "lat", "lon", "air"]
    # CF's extended form names mappings with a colon, the coordinates after them
    assert mapping_names({"grid_mapping": "crsOSGB: x y crsWGS84: lat lon"}) == [
        "crsOSGB",
        "crsWGS84",
    ]
    assert mapping_names({"grid_mapping": "crs"}) == ["crs"] and mapping_names({}) == []


def test_which_zarr_fill_values_stand_for_a_fill_value() -> None:
    def fill(value: object, dtype: str = "<i2", scalar: bool = False) -> object:
        return zarr_fill({"fill_value": value}, scalar=scalar, kind=kind_of(dtype))

    assert fill(-32767) == -32767 and fill(-999.0, "<f4") == -999.0 and fill("NaN", "<f4")
    assert fill(None) is None and fill(0) is None and fill(0.0, "<f8") is None
    assert fill(-2147483647, "<i4", scalar=True) is None  # kerchunk's scalars: HDF5's fill
    assert fill(-1, "<i4", scalar=True) == -1


def test_a_char_array_dumps_as_the_original(packed: Served) -> None:
    """``char station_name(station, name_strlen)``: one string per station, not a
    character per element along an added dimension."""

    def dumped(path: Path) -> str:
        done = subprocess.run(
            ["ncdump", "-v", "station_name", str(path)], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split("data:", 1)[1]

    assert dumped(packed.nc) == dumped(packed.original)
    assert '"Zurich",' in dumped(packed.nc)

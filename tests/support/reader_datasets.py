"""The files of the reader matrix (tests/test_decode_readers.py), each written by the library
people write them with, and what the netCDF library reads back from them.

* ``cf.nc`` (netCDF4): ``temp`` zlib + shuffle with CF attributes and a ``_FillValue``;
  ``packed`` int16 with ``scale_factor``/``add_offset``; ``plain`` chunked and
  uncompressed; ``cont`` contiguous; ``nanfill`` with a NaN ``_FillValue``; ``checked``
  zlib + fletcher32; a scalar ``crs`` (grid mapping) and a variable-length string variable
  ``station_name``; coordinates on an unlimited ``time``.
* ``classic.nc`` (netCDF3 classic, big-endian): record variables on the unlimited
  ``time``, packed shorts, a NaN fill value.
* ``packed.nc`` (netCDF4, :func:`write_packed_netcdf4`; not in the matrix of
  tests/test_decode_readers.py): what gridded products hold, attributes in the types
  CF gives them: ``precip`` int16 packed with float ``scale_factor``/``add_offset``
  (unpacked to float), a quarter of it ``_FillValue`` -32767 (netCDF's default for
  short, given explicitly) and ``valid_range`` in shorts; ``sst`` float with a
  ``missing_value`` and float ``valid_min``/``valid_max``; ``flags`` ubyte with 255 as
  its fill; ``station_name`` a char array ``(station, name_strlen)``.
* ``plugins.h5`` (HDF5 written by h5py with hdf5plugin's filters): ``lz4`` with blosc-lz4
  (byte shuffle), ``zstd`` with zstd.  Values compressible enough that HDF5 keeps every
  chunk filtered (it stores a chunk raw, flagged, when an optional filter does not shrink
  it, and kerchunk then writes no codec).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import h5py
import hdf5plugin
import netCDF4
import numpy as np

STATIONS = ["Zürich", "Genève", "Ås"]
TITLE = "Matrice des lecteurs — ünïcødé"


@dataclass(frozen=True)
class Dataset:
    name: str
    path: Path
    kind: str  # "netcdf4", "netcdf3" or "hdf5": which scanner references it


def _cf_coordinates(ds: netCDF4.Dataset, ntime: int, ny: int, nx: int) -> None:
    ds.createDimension("time", None)
    ds.createDimension("y", ny)
    ds.createDimension("x", nx)
    time = ds.createVariable("time", "f8", ("time",), chunksizes=(ntime,))
    time.units = "days since 2001-01-01 00:00:00"
    time.calendar = "standard"
    time.standard_name = "time"
    time[:] = np.arange(ntime, dtype="f8") * 0.5
    y = ds.createVariable("y", "f4", ("y",))
    y.units = "km"
    y.standard_name = "projection_y_coordinate"
    y[:] = np.linspace(-45.0, 45.0, ny, dtype="f4")
    x = ds.createVariable("x", "f4", ("x",))
    x.units = "km"
    x.standard_name = "projection_x_coordinate"
    x[:] = np.linspace(0.0, 110.0, nx, dtype="f4")


def write_cf_netcdf4(path: Path, seed: int = 41) -> Path:
    rng = np.random.default_rng(seed)
    ntime, ny, nx = 4, 10, 12
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.title = TITLE
        ds.Conventions = "CF-1.8"
        _cf_coordinates(ds, ntime, ny, nx)
        crs = ds.createVariable("crs", "i4")
        crs.grid_mapping_name = "lambert_conformal_conic"
        crs.standard_parallel = [30.0, 60.0]
        crs.longitude_of_central_meridian = 10.0
        crs.latitude_of_projection_origin = 45.0
        crs.assignValue(0)

        temp = ds.createVariable(
            "temp", "f4", ("time", "y", "x"), zlib=True, shuffle=True, complevel=4,
            chunksizes=(2, 5, 6), fill_value=np.float32(-999.0),
        )  # fmt: skip
        temp.standard_name = "air_temperature"
        temp.long_name = "température de l'air"
        temp.units = "K"
        temp.grid_mapping = "crs"
        temp[:] = (280.0 + rng.normal(0.0, 5.0, (ntime, ny, nx))).astype("f4")
        temp[1, 2, :4] = np.ma.masked

        packed = ds.createVariable(
            "packed", "i2", ("time", "y", "x"), zlib=True, shuffle=True,
            chunksizes=(2, 5, 6), fill_value=np.int16(-32767),
        )  # fmt: skip
        packed.scale_factor = 0.01
        packed.add_offset = 273.15
        packed.units = "K"
        packed[:] = 273.15 + rng.uniform(-50.0, 50.0, (ntime, ny, nx))
        packed[0, 0, :3] = np.ma.masked

        plain = ds.createVariable("plain", "f8", ("y", "x"), chunksizes=(5, 6))
        plain.comment = "chunked, uncompressed"
        plain[:] = rng.random((ny, nx))
        cont = ds.createVariable("cont", "i4", ("y", "x"), contiguous=True)
        cont[:] = rng.integers(-(2**31), 2**31 - 1, (ny, nx), dtype="i4")
        nanfill = ds.createVariable(
            "nanfill", "f4", ("y", "x"), zlib=True, chunksizes=(5, 6), fill_value=np.float32("nan")
        )
        values = rng.normal(0.0, 1.0, (ny, nx)).astype("f4")
        values[3, 4:8] = np.nan
        nanfill[:] = values
        checked = ds.createVariable(
            "checked", "f4", ("y", "x"), zlib=True, fletcher32=True, chunksizes=(5, 6)
        )
        checked[:] = rng.normal(10.0, 3.0, (ny, nx)).astype("f4")

        ds.createDimension("station", len(STATIONS))
        station = ds.createVariable("station_name", str, ("station",))
        station.long_name = "nom de la station"
        for i, name in enumerate(STATIONS):
            station[i] = name
    return path


def write_classic_netcdf3(path: Path, seed: int = 42) -> Path:
    rng = np.random.default_rng(seed)
    ntime, ny, nx = 5, 6, 8
    with netCDF4.Dataset(path, "w", format="NETCDF3_CLASSIC") as ds:
        ds.title = "netCDF3 classic, record dimension"
        ds.createDimension("time", None)
        ds.createDimension("y", ny)
        ds.createDimension("x", nx)
        time = ds.createVariable("time", "f8", ("time",))
        time.units = "hours since 2001-01-01 00:00:00"
        time[:] = np.arange(ntime, dtype="f8") * 6
        temp = ds.createVariable("temp", "f4", ("time", "y", "x"))
        temp.units = "K"
        temp[:] = rng.normal(280.0, 5.0, (ntime, ny, nx)).astype("f4")
        packed = ds.createVariable("packed", "i2", ("time", "y", "x"))
        packed.scale_factor = 0.5
        packed.add_offset = 100.0
        packed[:] = rng.uniform(0.0, 200.0, (ntime, ny, nx))
        height = ds.createVariable("height", "f8", ("y", "x"))
        height.units = "m"
        height[:] = rng.random((ny, nx)) * 1000
        nanfill = ds.createVariable("nanfill", "f4", ("y", "x"), fill_value=np.float32("nan"))
        values = rng.normal(0.0, 1.0, (ny, nx)).astype("f4")
        values[2, :3] = np.nan
        nanfill[:] = values
    return path


def write_packed_netcdf4(path: Path, seed: int = 44) -> Path:
    rng = np.random.default_rng(seed)
    ntime, ny, nx = 6, 30, 40
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.Conventions = "CF-1.8"
        ds.createDimension("time", ntime)
        ds.createDimension("lat", ny)
        ds.createDimension("lon", nx)
        time = ds.createVariable("time", "f8", ("time",))
        time.units = "days since 1800-01-01"
        time[:] = 80000.0 + np.arange(ntime) * 30.0
        lat = ds.createVariable("lat", "f4", ("lat",))
        lat.units = "degrees_north"
        lat[:] = np.linspace(-72.5, 72.5, ny, dtype="f4")
        lon = ds.createVariable("lon", "f4", ("lon",))
        lon.units = "degrees_east"
        lon[:] = np.linspace(0.0, 351.0, nx, dtype="f4")
        precip = ds.createVariable(
            "precip", "i2", ("time", "lat", "lon"), zlib=True, chunksizes=(1, ny, nx),
            fill_value=np.int16(-32767),
        )  # fmt: skip
        precip.set_auto_maskandscale(False)
        precip.scale_factor = np.float32(0.01)
        precip.add_offset = np.float32(0.0)
        precip.valid_range = np.array([0, 30000], "i2")
        precip.actual_range = np.array([0.0, 99.53], "f4")
        precip.units = "mm/day"
        packed = np.round(rng.gamma(0.8, 6.0, (ntime, ny, nx)) * 100).clip(0, 9950)
        packed[rng.random((ntime, ny, nx)) < 0.25] = -32767
        precip[:] = packed.astype("i2")
        sst = ds.createVariable(
            "sst", "f4", ("time", "lat", "lon"), zlib=True, fill_value=np.float32(-9.96921e36)
        )
        sst.missing_value = np.float32(-9.96921e36)
        sst.valid_min = np.float32(-1.8)
        sst.valid_max = np.float32(45.0)
        sst.units = "degC"
        sst[:] = rng.normal(15.0, 8.0, (ntime, ny, nx)).clip(-1.8, 45.0).astype("f4")
        sst[:, :5, :] = np.ma.masked  # land
        flags = ds.createVariable("flags", "u1", ("lat", "lon"), fill_value=np.uint8(255))
        flags.valid_range = np.array([0, 254], "u1")
        flags[:] = rng.integers(0, 255, (ny, nx), dtype="u1")
        flags[0, :7] = np.ma.masked
        ds.createDimension("station", 3)
        ds.createDimension("name_strlen", 7)
        name = ds.createVariable("station_name", "S1", ("station", "name_strlen"))
        name.long_name = "station name"
        name.cf_role = "timeseries_id"
        name[:] = netCDF4.stringtochar(np.array(["Zurich", "Bern", "As"], "S7"))
    return path


def write_plugin_hdf5(path: Path, seed: int = 43) -> Path:
    # Importing netCDF4 points HDF5_PLUGIN_PATH at the filter plugins its wheel bundles,
    # built against its own HDF5: h5py's HDF5 would load those and fail in their callback
    # ("error during user callback"), and hdf5plugin registers nothing that is already
    # available.  So hdf5plugin's own filters are registered over them.
    hdf5plugin.register(("blosc", "zstd"), force=True)
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "lz4", data=np.round(rng.normal(0.0, 2.0, (40, 60))).astype("f4"), chunks=(20, 30),
            **hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.SHUFFLE),
        )  # fmt: skip
        f.create_dataset(
            "zstd", data=rng.integers(-1000, 1000, (40, 60), dtype="i4"), chunks=(20, 30),
            **hdf5plugin.Zstd(clevel=3),
        )  # fmt: skip
    return path


def write_datasets(directory: Path) -> list[Dataset]:
    directory.mkdir(parents=True, exist_ok=True)
    return [
        Dataset("cf", write_cf_netcdf4(directory / "cf.nc"), "netcdf4"),
        Dataset("classic", write_classic_netcdf3(directory / "classic.nc"), "netcdf3"),
        Dataset("plugins", write_plugin_hdf5(directory / "plugins.h5"), "hdf5"),
    ]


def stored_values(path: Path) -> dict[str, np.ndarray]:
    """Every variable's stored values (no masking, no scaling), native byte order, as
    netCDF4-python reads the original file (its wheel has the blosc and zstd filters)."""
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        arrays = {name: np.asarray(var[...]) for name, var in ds.variables.items()}
    return {
        name: a if a.dtype == object else a.astype(a.dtype.newbyteorder("="))
        for name, a in arrays.items()
    }


def fill_values(path: Path) -> dict[str, object]:
    """What ``ncdump`` prints as ``_`` stands for, per variable: its fill value."""
    with netCDF4.Dataset(path) as ds:
        return {
            name: getattr(var, "_FillValue", netCDF4.default_fillvals.get(var.dtype.str[1:]))
            for name, var in ds.variables.items()
            if var.dtype != str
        }

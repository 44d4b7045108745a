"""Real data for tests: netCDF4 files written by the netCDF library, references by kerchunk.

The tests compare refmount with fsspec's ReferenceFileSystem on reference sets made the way
users make them, so nothing here is hand-written: the netCDF4 library writes the file, and
kerchunk's ``SingleHdf5ToZarr`` scans it.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from pathlib import Path
from typing import Any

import kerchunk.hdf
import netCDF4
import numpy as np
import zstandard

TITLE = "Température de l'air — test ☃ (ünïcødé)"
AIR_LONG_NAME = "air température à 2 m"

#: Chunks at most this many bytes are written into the references (kerchunk "inlines" them).
INLINE_THRESHOLD = 300


def write_netcdf(path: Path, seed: int = 20240611) -> Path:
    """A netCDF4 (HDF5) file of about 4.5 MB exercising what kerchunk has to describe.

    * ``air`` (time, lat, lon) float32: chunked, shuffle + zlib compressed;
    * ``raw`` (time, level, lat, lon) int32: chunked, uncompressed, most of the bytes;
    * ``cont`` (lat, lon) float32: contiguous storage (one chunk for kerchunk);
    * ``time`` on the unlimited dimension, ``lat``/``lon`` coordinates;
    * ``tiny`` float32 and ``small`` int16: small enough to be inlined (``tiny``'s bytes are
      not ASCII, so kerchunk writes them as ``base64:``; ``small``'s are, so a plain string);
    * ``scalar``: a rank-0 variable;
    * global and variable attributes, some of them non-ASCII text.
    """
    rng = np.random.default_rng(seed)
    ntime, nlevel, nlat, nlon = 24, 4, 80, 120
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.title = TITLE
        ds.Conventions = "CF-1.8"
        ds.history = "written by tests/data_builders.py"
        ds.createDimension("time", None)  # unlimited
        ds.createDimension("level", nlevel)
        ds.createDimension("lat", nlat)
        ds.createDimension("lon", nlon)

        # Chunks no bigger than the current length keep old netCDF-C NCZarr readers happy.
        time = ds.createVariable("time", "f8", ("time",), chunksizes=(8,))
        time.units = "hours since 2000-01-01 00:00:00"
        time.standard_name = "time"
        time[:] = np.arange(ntime, dtype="f8") * 6.0

        level = ds.createVariable("level", "i4", ("level",))
        level.units = "hPa"
        level[:] = np.array([1000, 850, 500, 250], dtype="i4")

        lat = ds.createVariable("lat", "f4", ("lat",))
        lat.units = "degrees_north"
        lat[:] = np.linspace(-89.0, 89.0, nlat, dtype="f4")
        lon = ds.createVariable("lon", "f4", ("lon",))
        lon.units = "degrees_east"
        lon[:] = np.linspace(0.0, 357.0, nlon, dtype="f4")

        air = ds.createVariable(
            "air", "f4", ("time", "lat", "lon"), zlib=True, complevel=4, shuffle=True,
            chunksizes=(6, 40, 60),
        )  # fmt: skip
        air.long_name = AIR_LONG_NAME
        air.units = "K"
        base = 288.0 - 30.0 * np.cos(np.deg2rad(lat[:]))[None, :, None] ** 2
        noise = rng.normal(0.0, 2.0, (ntime, nlat, nlon))
        air[:] = np.round(base + noise, 2).astype("f4")

        raw = ds.createVariable(
            "raw", "i4", ("time", "level", "lat", "lon"), chunksizes=(4, 2, 40, 120)
        )
        raw.comment = "uncompressed integers"
        raw[:] = rng.integers(-(2**31), 2**31 - 1, (ntime, nlevel, nlat, nlon), dtype="i4")

        cont = ds.createVariable("cont", "f4", ("lat", "lon"), contiguous=True)
        cont[:] = rng.random((nlat, nlon), dtype="f4")

        tiny = ds.createVariable("tiny", "f4", ("level",))
        tiny.note = "inlined as base64"
        tiny[:] = rng.normal(0.0, 1e6, nlevel).astype("f4")

        small = ds.createVariable("small", "i2", ("lat",))
        small[:] = np.arange(nlat, dtype="i2") + 32  # printable ASCII: inlined as text

        scalar = ds.createVariable("scalar", "f8")
        scalar.description = "a rank-0 variable"
        scalar.assignValue(3.5)
    return path


def kerchunk_refs(source: Path | str, url: str, inline_threshold: int = INLINE_THRESHOLD) -> dict:
    """kerchunk's reference set for ``source``, with every target URL written as ``url``.

    ``source`` is a local path (scanned from disk) or a URL (kerchunk reads it through fsspec,
    and then ``url`` must be that same URL).
    """
    if isinstance(source, str) and "://" in source:
        assert url == source, "kerchunk writes the URL it scanned"
        translator = kerchunk.hdf.SingleHdf5ToZarr(source, inline_threshold=inline_threshold)
        refs: dict[str, Any] = translator.translate()
        return refs
    with open(source, "rb") as f:
        refs = kerchunk.hdf.SingleHdf5ToZarr(f, url, inline_threshold=inline_threshold).translate()
    return refs


def ref_map(refs: dict) -> dict[str, Any]:
    """The key map of a JSON reference set (version 0 or 1 without ``gen``)."""
    return refs["refs"] if refs.get("version") == 1 else refs


def netcdf_arrays(nc_path: Path) -> dict[str, np.ndarray]:
    """Every variable's raw values (no masking, no scaling) as the netCDF library reads them."""
    with netCDF4.Dataset(nc_path) as ds:
        ds.set_auto_maskandscale(False)
        return {name: np.asarray(var[...]) for name, var in ds.variables.items()}


COMPRESSORS = {
    "gzip": gzip.compress,
    "bz2": bz2.compress,
    "xz": lzma.compress,
    "zstd": lambda data: zstandard.ZstdCompressor().compress(data),
}


def compress(data: bytes, kind: str | None) -> bytes:
    return data if kind is None else COMPRESSORS[kind](data)


def dump_refs(refs: dict, path: Path, kind: str | None = None) -> Path:
    """Write ``refs`` as JSON at ``path``, compressed with ``kind`` (gzip/bz2/xz/zstd)."""
    path.write_bytes(compress(json.dumps(refs).encode(), kind))
    return path


# -- data for today's readers (tests/test_readers.py) ---------------------------------------

READERS_TITLE = "Réseau d'essai ☃ — ünïcødé"
READERS_LONG_NAME = "température de l'air à 2 m"
STATIONS = ["Zürich", "Genève", "Ås"]


def _coordinates(ds: netCDF4.Dataset, times: np.ndarray, ny: int, nx: int) -> None:
    ds.createDimension("time", None)  # unlimited
    ds.createDimension("y", ny)
    ds.createDimension("x", nx)
    time = ds.createVariable("time", "f8", ("time",), chunksizes=(len(times),))
    time.units = "days since 2001-01-01 00:00:00"
    time.calendar = "standard"
    time.standard_name = "time"
    time[:] = times
    y = ds.createVariable("y", "f4", ("y",))
    y.units = "km"
    y[:] = np.linspace(-50.0, 50.0, ny, dtype="f4")
    x = ds.createVariable("x", "f4", ("x",))
    x.units = "km"
    x[:] = np.linspace(0.0, 90.0, nx, dtype="f4")


def _fields(ds: netCDF4.Dataset, rng: np.random.Generator, ntime: int, ny: int, nx: int) -> None:
    temp = ds.createVariable(
        "temp", "f4", ("time", "y", "x"), zlib=True, shuffle=True, complevel=4,
        chunksizes=(min(ntime, 4), 10, 15),
    )  # fmt: skip
    temp.long_name = READERS_LONG_NAME
    temp.units = "K"
    temp[:] = (280.0 + rng.normal(0.0, 5.0, (ntime, ny, nx))).astype("f4")
    packed = ds.createVariable(
        "packed", "i2", ("time", "y", "x"), zlib=True, shuffle=True,
        chunksizes=(min(ntime, 4), 10, 15), fill_value=np.int16(-32767),
    )  # fmt: skip
    packed.scale_factor = 0.01
    packed.add_offset = 273.15
    packed.units = "K"
    packed[:] = 273.15 + rng.uniform(-50.0, 50.0, (ntime, ny, nx))
    packed[0, 0, :3] = np.ma.masked  # some missing values: _FillValue decoding


def write_readers_netcdf4(path: Path, seed: int = 11) -> Path:
    """A netCDF4 file with what readers have to decode: ``temp`` (zlib + shuffle, chunked, on
    the unlimited ``time``), ``packed`` (int16 with scale_factor/add_offset and missing
    values), ``plain`` (2-D, zlib without shuffle: what GDAL's Zarr driver decodes),
    ``scalar`` (rank 0), ``station`` (variable-length strings), non-ASCII attributes."""
    rng = np.random.default_rng(seed)
    ntime, ny, nx = 8, 20, 30
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.title = READERS_TITLE
        ds.Conventions = "CF-1.8"
        _coordinates(ds, np.arange(ntime, dtype="f8") * 0.25, ny, nx)
        _fields(ds, rng, ntime, ny, nx)
        plain = ds.createVariable("plain", "f8", ("y", "x"), zlib=True, shuffle=False,
                                  chunksizes=(10, 15))  # fmt: skip
        plain.comment = "zlib only, no shuffle"
        plain[:] = rng.random((ny, nx))
        scalar = ds.createVariable("scalar", "f8")
        scalar.description = "rang 0 — scalaire"
        scalar.assignValue(3.5)
        ds.createDimension("station", len(STATIONS))
        station = ds.createVariable("station_name", str, ("station",))
        station.long_name = "nom de la station"
        for i, name in enumerate(STATIONS):
            station[i] = name
    return path


def write_readers_netcdf3(path: Path, seed: int = 12) -> Path:
    """A netCDF3 (64-bit offset) file: record variables on the unlimited dimension, a
    fixed-size variable, packed shorts, non-ASCII attributes."""
    rng = np.random.default_rng(seed)
    ntime, ny, nx = 6, 12, 16
    with netCDF4.Dataset(path, "w", format="NETCDF3_64BIT_OFFSET") as ds:
        ds.title = READERS_TITLE
        ds.createDimension("time", None)
        ds.createDimension("y", ny)
        ds.createDimension("x", nx)
        time = ds.createVariable("time", "f8", ("time",))
        time.units = "hours since 2001-01-01 00:00:00"
        time[:] = np.arange(ntime, dtype="f8") * 6
        y = ds.createVariable("y", "f4", ("y",))
        y[:] = np.arange(ny, dtype="f4")
        x = ds.createVariable("x", "f4", ("x",))
        x[:] = np.arange(nx, dtype="f4")
        temp = ds.createVariable("temp", "f4", ("time", "y", "x"))
        temp.long_name = READERS_LONG_NAME
        temp[:] = rng.normal(280.0, 5.0, (ntime, ny, nx)).astype("f4")
        packed = ds.createVariable("packed", "i2", ("time", "y", "x"))
        packed.scale_factor = 0.5
        packed.add_offset = 100.0
        packed[:] = rng.uniform(0.0, 200.0, (ntime, ny, nx))
        height = ds.createVariable("height", "f8", ("y", "x"))
        height.units = "m"
        height[:] = rng.random((ny, nx)) * 1000
    return path


def write_series(directory: Path, count: int = 4, steps: int = 3, seed: int = 13) -> list[Path]:
    """``count`` netCDF4 files of ``steps`` time steps each: one time series in parts."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for part in range(count):
        path = directory / f"part{part}.nc"
        with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
            ds.title = READERS_TITLE
            times = (np.arange(steps, dtype="f8") + part * steps) * 0.25
            _coordinates(ds, times, 20, 30)
            _fields(ds, rng, steps, 20, 30)
        paths.append(path)
    return paths

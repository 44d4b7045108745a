"""Write the bundled example: examples/air/air.nc and its kerchunk references refs.json.

    python examples/make_example.py          # needs numpy, netCDF4, kerchunk

air.nc is a small synthetic air-temperature field written by the netCDF4 library (chunked,
zlib-compressed float32); refs.json is what kerchunk's SingleHdf5ToZarr says about it,
with the target URL written relative ("air.nc"), so that the pair works wherever it is:
refmount resolves a URL without a protocol against the refs file's own directory.

The data are deterministic (a fixed random seed), so rerunning gives the same values.
"""

from __future__ import annotations

import json
from pathlib import Path

import kerchunk.hdf
import netCDF4
import numpy as np

HERE = Path(__file__).resolve().parent / "air"


def write_netcdf(path: Path) -> None:
    rng = np.random.default_rng(1948)
    ntime, nlat, nlon = 124, 25, 53  # 31 days, 6-hourly, on a 2.5 degree grid
    lat = np.linspace(75.0, 15.0, nlat, dtype="f4")
    lon = np.linspace(200.0, 330.0, nlon, dtype="f4")
    hours = np.arange(ntime, dtype="f8") * 6.0

    # A smooth, plausible field: cold poles, a daily cycle, a travelling wave, some noise.
    phi = np.deg2rad(lat)[None, :, None]
    lam = np.deg2rad(lon)[None, None, :]
    t = hours[:, None, None]
    air = (
        300.0
        - 45.0 * np.sin(phi) ** 2
        + 4.0 * np.cos(2 * np.pi * (t / 24.0) + lam)
        + 6.0 * np.sin(3 * lam - 2 * np.pi * t / 240.0) * np.cos(phi)
        + rng.normal(0.0, 0.5, (ntime, nlat, nlon))
    )

    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.title = "refmount example: synthetic 4x daily air temperature"
        ds.Conventions = "CF-1.8"
        ds.source = "examples/make_example.py (synthetic data, not observations)"
        ds.createDimension("time", None)
        ds.createDimension("lat", nlat)
        ds.createDimension("lon", nlon)

        v = ds.createVariable("time", "f8", ("time",), chunksizes=(ntime,))
        v.units = "hours since 2013-01-01 00:00:00"
        v.standard_name = "time"
        v.calendar = "standard"
        v[:] = hours
        v = ds.createVariable("lat", "f4", ("lat",))
        v.units = "degrees_north"
        v.standard_name = "latitude"
        v[:] = lat
        v = ds.createVariable("lon", "f4", ("lon",))
        v.units = "degrees_east"
        v.standard_name = "longitude"
        v[:] = lon

        v = ds.createVariable(
            "air", "f4", ("time", "lat", "lon"), zlib=True, complevel=6, shuffle=True,
            chunksizes=(31, nlat, nlon), least_significant_digit=2,
        )  # fmt: skip
        v.long_name = "air temperature at 2 m"
        v.standard_name = "air_temperature"
        v.units = "K"
        v[:] = air.astype("f4")


def write_refs(nc_path: Path, refs_path: Path) -> dict:
    with open(nc_path, "rb") as f:
        # The URL is written into every chunk reference as is: keep it relative.
        refs = kerchunk.hdf.SingleHdf5ToZarr(f, nc_path.name, inline_threshold=300).translate()
    refs_path.write_text(json.dumps(refs, indent=1, sort_keys=True) + "\n")
    return refs


def main() -> None:
    HERE.mkdir(exist_ok=True)
    nc_path, refs_path = HERE / "air.nc", HERE / "refs.json"
    write_netcdf(nc_path)
    refs = write_refs(nc_path, refs_path)
    targets = {v[0] for v in refs["refs"].values() if isinstance(v, list)}
    assert targets == {"air.nc"}, targets
    size = nc_path.stat().st_size + refs_path.stat().st_size
    print(f"wrote {nc_path} and {refs_path} ({len(refs['refs'])} keys, {size} bytes)")


if __name__ == "__main__":
    main()

"""GRIB2 benchmark: a GRIB2 variable read through ``--decode`` by Debian's ncdump and
GDAL 3.6 and by xarray (zarr), against cfgrib/xarray reading the file in-process.

    .venv/bin/python bench/grib.py [--messages 4] [--ny 1059] [--nx 1799] [--delay 0.010]

Writes ``--messages`` GRIB2 messages of 2 m temperature on an ``--ny`` x ``--nx`` grid
(HRRR's CONUS grid by default) at successive steps, packed as HRRR packs them (complex
packing with spatial differencing), with ecCodes; serves the file over nginx on
127.0.0.1 with ``--delay`` seconds before every answer; references it with kerchunk's
``scan_grib`` and combines the messages along ``step`` with ``MultiZarrToZarr``.  Each
row reads the whole variable twice, cold (a fresh mount, a fresh process) and warm:
command-line readers run twice as processes on one mount; Python readers read twice in
one process, timed there.  cfgrib reads the local file (it cannot read over HTTP), its
cold read including the index it builds.  For refmount rows, the daemon's CPU time and
its decoding workers' is given per GB decoded.  Every reading is checked against
ecCodes' values (``WRONG VALUES`` otherwise).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from readers import (  # noqa: E402
    CHILD_TIMEOUT,
    cpu_seconds,
    last_line,
    refmount,
    run_child,
    table,
)

from tests.support.nginx import NginxServer  # noqa: E402

#: Child programs: read the whole variable, print "cold", wait for a line, read it again,
#: print the timings and a digest of the values as float32.
XARRAY_ZARR_CHILD = r"""
import hashlib, json, sys, time, warnings
import numpy as np, xarray as xr, zarr, xarray.backends.zarr
warnings.simplefilter("ignore")
times = []
for attempt in range(2):
    start = time.perf_counter()
    with xr.open_zarr(sys.argv[1], consolidated=False, zarr_format=2, decode_times=False) as ds:
        values = ds["t2m"].values
    times.append(time.perf_counter() - start)
    if attempt == 0:
        print("cold", flush=True)
        sys.stdin.readline()
digest = hashlib.sha256(values.astype("<f4").tobytes()).hexdigest()
print(json.dumps({"times": times, "sha256": digest}))
"""

CFGRIB_CHILD = r"""
import hashlib, json, sys, time, warnings
import numpy as np, xarray as xr, cfgrib
warnings.simplefilter("ignore")
times = []
for attempt in range(2):
    start = time.perf_counter()
    with xr.open_dataset(sys.argv[1], engine="cfgrib", backend_kwargs={"indexpath": ""}) as ds:
        values = ds["t2m"].values
    times.append(time.perf_counter() - start)
    if attempt == 0:
        print("cold", flush=True)
        sys.stdin.readline()
digest = hashlib.sha256(values.astype("<f4").tobytes()).hexdigest()
print(json.dumps({"times": times, "sha256": digest}))
"""


def write_grib(path: Path, messages: int, ny: int, nx: int) -> str:
    """The file, and the digest of its values (float32) as ecCodes decodes them."""
    import eccodes

    rng = np.random.default_rng(0)
    base = (
        280 + 15 * np.sin(np.linspace(0, 6, nx))[None, :] * np.cos(np.linspace(0, 3, ny))[:, None]
    )
    decoded = []
    with path.open("wb") as out:
        for step in range(messages):
            handle = eccodes.codes_grib_new_from_samples("regular_ll_sfc_grib2")
            try:
                eccodes.codes_set_long(handle, "Ni", nx)
                eccodes.codes_set_long(handle, "Nj", ny)
                for key, value in (
                    ("latitudeOfFirstGridPointInDegrees", 52.0),
                    ("longitudeOfFirstGridPointInDegrees", 0.0),
                    ("latitudeOfLastGridPointInDegrees", 52.0 - (ny - 1) * 0.02),
                    ("longitudeOfLastGridPointInDegrees", (nx - 1) * 0.02),
                    ("iDirectionIncrementInDegrees", 0.02),
                    ("jDirectionIncrementInDegrees", 0.02),
                ):
                    eccodes.codes_set_double(handle, key, value)
                eccodes.codes_set_string(handle, "shortName", "2t")
                eccodes.codes_set_string(handle, "typeOfLevel", "heightAboveGround")
                eccodes.codes_set_long(handle, "level", 2)
                eccodes.codes_set(handle, "step", step + 1)
                eccodes.codes_set_string(handle, "packingType", "grid_complex_spatial_differencing")
                field = base + step + rng.normal(0, 0.5, (ny, nx))
                eccodes.codes_set_values(handle, field.ravel())
                message = eccodes.codes_get_message(handle)
            finally:
                eccodes.codes_release(handle)
            out.write(message)
            check = eccodes.codes_new_from_message(message)
            decoded.append(eccodes.codes_get_array(check, "values"))
            eccodes.codes_release(check)
    return hashlib.sha256(np.concatenate(decoded).astype("<f4").tobytes()).hexdigest()


def write_refs(url: str, work: Path) -> Path:
    from kerchunk.combine import MultiZarrToZarr
    from kerchunk.grib2 import scan_grib

    sets = scan_grib(url)
    combined = MultiZarrToZarr(
        sets,
        concat_dims=["step"],
        identical_dims=["latitude", "longitude", "heightAboveGround", "time"],
    ).translate()
    path = work / "grib.json"
    path.write_text(json.dumps(combined))
    return path


def run_passes(commands: list[list[str]], daemon: int, values: callable) -> dict:
    """Commands run in turn, twice (cold, warm); ``values()`` what they produced."""
    times, cpu = [], []
    base = cpu_seconds(daemon)
    for _ in range(2):
        start = time.perf_counter()
        for argv in commands:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=CHILD_TIMEOUT)
            if done.returncode != 0:
                return {"error": last_line(done.stderr)}
        times.append(time.perf_counter() - start)
        now = cpu_seconds(daemon)
        cpu.append(now - base)
        base = now
    digest = hashlib.sha256(values().astype("<f4").tobytes()).hexdigest()
    return {"times": times, "cpu": cpu, "sha256": digest}


def measure(work: Path, messages: int, ny: int, nx: int, delay: float) -> list[tuple[str, dict]]:
    rows: list[tuple[str, dict]] = []
    with tempfile.TemporaryDirectory(prefix="refmount-bench-grib-") as tmp_name:
        tmp = Path(tmp_name)
        root = tmp / "www"
        root.mkdir()
        grib = root / "t2m.grib2"
        digest = write_grib(grib, messages, ny, nx)
        with NginxServer(root, delay=delay) as nginx:
            refs = write_refs(f"{nginx.url}/t2m.grib2", tmp)
            with refmount(refs, tmp / "mnt-ncdump", "--decode") as m:
                cdl = tmp / "t2m.cdl"
                target = f"file://{m.mountpoint}#mode=zarr,file"
                argv = ["sh", "-c", f"ncdump -p 9,17 -v t2m '{target}' > {cdl}"]
                rows.append(("ncdump (netCDF-C 4.9, Debian), refmount --decode",
                             run_passes([argv], m.pid, lambda: ncdump_values(cdl))))  # fmt: skip
            with refmount(refs, tmp / "mnt-gdal", "--decode") as m:
                outs = [tmp / f"t2m{i}.envi" for i in range(messages)]
                commands = [
                    ["gdal_translate", "-q", "-of", "ENVI", f'ZARR:"{m.mountpoint}":/t2m:{i}',
                     str(out)]
                    for i, out in enumerate(outs)
                ]  # fmt: skip
                values = lambda: np.concatenate([np.fromfile(o, "<f8") for o in outs])  # noqa: E731
                rows.append(("GDAL 3.6 (Debian gdal_translate, one per step), refmount --decode",
                             run_passes(commands, m.pid, values)))  # fmt: skip
            with refmount(refs, tmp / "mnt-xarray", "--decode") as m:
                result = run_child(XARRAY_ZARR_CHILD, str(m.mountpoint), daemon=m.pid)
                rows.append(("xarray (zarr), refmount --decode", result))
            rows.append(("xarray (cfgrib), the local file, in-process",
                         run_child(CFGRIB_CHILD, str(grib))))  # fmt: skip
    for _name, result in rows:
        if "sha256" in result and result["sha256"] != digest:
            result["error"] = "WRONG VALUES"
    return rows


def ncdump_values(cdl: Path) -> np.ndarray:
    text = cdl.read_text()
    body = text[text.index(" t2m =", text.index("\ndata:")) + len(" t2m =") :]
    return np.array(body[: body.index(";")].split(","), dtype=np.float64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=4, help="GRIB messages (steps)")
    parser.add_argument("--ny", type=int, default=1059, help="grid rows")
    parser.add_argument("--nx", type=int, default=1799, help="grid columns")
    parser.add_argument("--delay", type=float, default=0.010, help="seconds before each answer")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    rows = measure(args.work, args.messages, args.ny, args.nx, args.delay)
    mib = args.messages * args.ny * args.nx * 8 / 2**20
    print(
        f"t2m: {args.messages} x {args.ny} x {args.nx} float64 ({mib:.1f} MiB decoded), "
        f"complex packing with spatial differencing; nginx delay {args.delay * 1000:g} ms"
    )
    print(table(rows, mib))


if __name__ == "__main__":
    main()

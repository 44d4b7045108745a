"""Readers benchmark: GDAL and xarray through refmount against their own reference readers.

    .venv/bin/python bench/readers.py [--delay 0.010] [--size 2400] [--work DIR]

One run, over nginx on 127.0.0.1 with ``--delay`` seconds before every answer (an object
store's time to first byte; ``tests/support/nginx.py``):

* writes a netCDF4 file with one zlib-compressed float32 variable ``field`` (``--size``
  squared, 200 x 200 chunks, no shuffle: GDAL's Zarr driver up to 3.10 refuses shuffle),
  serves it, and references it with kerchunk as JSON and as Parquet;
* reads the whole of ``field`` twice in one fresh child process per row: cold (nothing
  cached anywhere: a fresh mount, a fresh process) and warm (the same again in that
  process, on the same mount);
* rows:

  ==================================  ===============================================
  GDAL, refmount (JSON / Parquet)     rasterio's GDAL opening ``ZARR:"MNT":/field``
  GDAL, /vsikerchunk (JSON / Parquet) GDAL's own reference reader (GDAL >= 3.11;
                                      otherwise the row says why it did not run)
  xarray, refmount (JSON / Parquet)   ``xarray.open_zarr(MNT)["field"].values``
  xarray, fsspec reference:// (JSON)  ``xarray.open_zarr("reference://", storage_
                                      options={"fo": REFS})["field"].values``
  ==================================  ===============================================

Every value read is checked against the netCDF library's reading of the file. refmount
runs from this checkout's interpreter (``python -m refmount REFS MNT -f`` in a
subprocess), is stopped by its process id and unmounted in ``finally``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import kerchunk.df
import kerchunk.hdf
import netCDF4
import numpy as np
import rasterio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.nginx import NginxServer  # noqa: E402

CHUNK = 200
MOUNT_TIMEOUT = 60.0
CHILD_TIMEOUT = 600.0

#: Child programs: argv[1] is the dataset to open; each prints the two timings and a digest.
GDAL_CHILD = r"""
import hashlib, json, sys, time
import rasterio
times = []
for _ in range(2):
    start = time.perf_counter()
    with rasterio.open(sys.argv[1]) as ds:
        values = ds.read(1)
    times.append(time.perf_counter() - start)
print(json.dumps({"times": times, "sha256": hashlib.sha256(values.tobytes()).hexdigest()}))
"""

XARRAY_CHILD = r"""
import hashlib, json, sys, time, warnings
import xarray as xr
import zarr, xarray.backends.zarr  # imported before the clock starts, as the GDAL child's
warnings.simplefilter("ignore")
target, options = sys.argv[1], json.loads(sys.argv[2])
times = []
for _ in range(2):
    start = time.perf_counter()
    with xr.open_zarr(target, consolidated=False, zarr_format=2, **options) as ds:
        values = ds["field"].values
    times.append(time.perf_counter() - start)
print(json.dumps({"times": times, "sha256": hashlib.sha256(values.tobytes()).hexdigest()}))
"""


def write_data(work: Path, size: int) -> tuple[Path, str]:
    """The netCDF file (once per size) and the digest of ``field``'s values."""
    path = work / "data" / f"field{size}.nc"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(2026)
        with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
            ds.createDimension("y", size)
            ds.createDimension("x", size)
            field = ds.createVariable(
                "field", "f4", ("y", "x"), zlib=True, complevel=4, shuffle=False,
                chunksizes=(CHUNK, CHUNK),
            )  # fmt: skip
            smooth = np.add.outer(np.sin(np.arange(size) / 50.0), np.cos(np.arange(size) / 70.0))
            field[:] = (smooth + rng.normal(0.0, 0.1, (size, size))).astype("f4")
    with netCDF4.Dataset(path) as ds:
        values = np.asarray(ds["field"][:], dtype="<f4")
    return path, hashlib.sha256(values.tobytes()).hexdigest()


def write_refs(nc_path: Path, url: str, work: Path) -> tuple[Path, Path]:
    with open(nc_path, "rb") as f:
        refs = kerchunk.hdf.SingleHdf5ToZarr(f, url, inline_threshold=100).translate()
    json_path = work / "refs.json"
    json_path.write_text(json.dumps(refs))
    parquet_path = work / "refs.parq"
    kerchunk.df.refs_to_dataframe(refs, str(parquet_path), record_size=1000)
    return json_path, parquet_path


def is_mounted(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/mounts") as mounts:
        return any(line.split()[1] == target for line in mounts)


@contextmanager
def refmount(refs: Path, mountpoint: Path) -> Iterator[Path]:
    """refmount in the foreground as our child; stopped by pid and unmounted after."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    log = (mountpoint.parent / f"{mountpoint.name}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "refmount", str(refs), str(mountpoint), "-f"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not is_mounted(mountpoint):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"refmount did not mount {refs} (see {log.name})")
            time.sleep(0.05)
        os.stat(mountpoint)
        yield mountpoint
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if is_mounted(mountpoint):
            subprocess.run(["fusermount3", "-u", str(mountpoint)], capture_output=True)
        if is_mounted(mountpoint):
            subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True)
        log.close()


def run_child(program: str, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", program, *args],
        capture_output=True, text=True, timeout=CHILD_TIMEOUT,
    )  # fmt: skip
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["exit status"])[-1]}
    return json.loads(done.stdout)


def gdal_version() -> tuple[int, int]:
    major, minor = rasterio.__gdal_version__.split(".")[:2]
    return int(major), int(minor)


def measure(work: Path, size: int, delay: float) -> list[tuple[str, dict]]:
    nc_path, digest = write_data(work, size)
    rows: list[tuple[str, dict]] = []
    with tempfile.TemporaryDirectory(prefix="refmount-bench-readers-") as tmp_name:
        tmp = Path(tmp_name)
        root = tmp / "www"
        root.mkdir()
        os.link(nc_path, root / "field.nc")
        with NginxServer(root, delay=delay) as nginx:
            json_refs, parquet_refs = write_refs(nc_path, f"{nginx.url}/field.nc", tmp)
            for kind, refs in (("JSON", json_refs), ("Parquet", parquet_refs)):
                with refmount(refs, tmp / f"mnt-gdal-{kind}") as mnt:
                    result = run_child(GDAL_CHILD, f'ZARR:"{mnt}":/field')
                rows.append((f"GDAL {rasterio.__gdal_version__}, refmount ({kind})", result))
            for kind, refs, prefix in (
                ("JSON", json_refs, "/vsikerchunk_json_ref/"),
                ("Parquet", parquet_refs, "/vsikerchunk_parquet_ref/"),
            ):
                name = f"GDAL {rasterio.__gdal_version__}, {prefix} ({kind})"
                if gdal_version() < (3, 11):
                    rows.append((name, {"error": "not run: /vsikerchunk needs GDAL >= 3.11"}))
                    continue
                rows.append((name, run_child(GDAL_CHILD, f'ZARR:"{prefix}{{{refs}}}":/field')))
            for kind, refs in (("JSON", json_refs), ("Parquet", parquet_refs)):
                with refmount(refs, tmp / f"mnt-xarray-{kind}") as mnt:
                    result = run_child(XARRAY_CHILD, str(mnt), "{}")
                rows.append((f"xarray, refmount ({kind})", result))
            # zarr 3 reads through fsspec asynchronously: the reference filesystem and its
            # target filesystem must both be asynchronous.
            storage = {
                "fo": str(json_refs),
                "remote_protocol": "http",
                "asynchronous": True,
                "remote_options": {"asynchronous": True},
            }
            options = {"storage_options": storage}
            result = run_child(XARRAY_CHILD, "reference://", json.dumps(options))
            rows.append(("xarray, fsspec reference:// (JSON)", result))
    for _name, result in rows:
        if "sha256" in result and result["sha256"] != digest:
            result["error"] = "WRONG VALUES"
    return rows


def table(rows: list[tuple[str, dict]], mib: float) -> str:
    lines = [
        "| reader | cold s | warm s | cold MiB/s | warm MiB/s |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, result in rows:
        if "times" not in result or "error" in result:
            lines.append(f"| {name} | {result.get('error', '?')} | | | |")
            continue
        cold, warm = result["times"]
        lines.append(f"| {name} | {cold:.2f} | {warm:.2f} | {mib / cold:.1f} | {mib / warm:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay", type=float, default=0.010, help="seconds before each answer")
    parser.add_argument("--size", type=int, default=2400, help="side of the square variable")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "refmount-bench")
    args = parser.parse_args()
    rows = measure(args.work, args.size, args.delay)
    mib = args.size * args.size * 4 / 2**20
    command = shlex.join([os.path.relpath(sys.executable), *sys.argv])
    print(f"$ {command}")
    print(
        f"field: {args.size}x{args.size} float32 ({mib:.1f} MiB decoded), zlib, "
        f"{CHUNK}x{CHUNK} chunks ({(args.size // CHUNK) ** 2} of them); nginx delay "
        f"{args.delay * 1000:.0f} ms; {os.cpu_count()} CPUs"
    )
    print(table(rows, mib))


if __name__ == "__main__":
    main()

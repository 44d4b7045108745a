"""Readers benchmark: GDAL, netCDF-C and xarray through refmount (raw and ``--decode``)
against their own reference readers.

    .venv/bin/python bench/readers.py [--delay 0.010] [--size 2400] [--work DIR]

One run, over nginx on 127.0.0.1 with ``--delay`` seconds before every answer (an object
store's time to first byte; ``tests/support/nginx.py``):

* writes a netCDF4 file with one zlib-compressed float32 variable ``field`` (``--size``
  squared, 200 x 200 chunks, no shuffle, so that GDAL before 3.11 reads the raw view
  too), serves it, and references it with kerchunk as JSON and as Parquet, and with
  VirtualiZarr in an Icechunk repository (a local repository, its virtual chunks the
  served file's byte ranges);
* reads the whole of ``field`` twice per row: cold (nothing cached anywhere: a fresh
  mount, a fresh process) and warm.  Python readers (rasterio's GDAL, xarray) read it
  again in the same process and are timed in that process (imports excluded);
  command-line readers (``ncdump``, Debian's ``gdal_translate``) run twice, as processes,
  timed from start to exit, on the same mount;
* rows:

  ==========================================  ===========================================
  GDAL 3.12 (rasterio wheel), refmount        ``rasterio.open('ZARR:"MNT":/field')``,
  (JSON, Parquet; JSON ``--decode``)          raw view and decoded view
  GDAL 3.12, /vsikerchunk (JSON / Parquet)    GDAL's own reference reader (GDAL >= 3.11;
                                              otherwise the row says why it did not run)
  GDAL 3.6 (Debian), refmount (JSON, raw      ``gdal_translate -of ENVI ZARR:"MNT":/field``
  and ``--decode``)
  ncdump (Debian netCDF-C), refmount (JSON,   ``ncdump -p 9 -v field 'file://MNT#mode=zarr,
  raw and ``--decode``)                       file'`` (the raw view's values are wrong:
                                              netCDF-C ignores the zlib codec)
  xarray, refmount (JSON / Parquet; JSON      ``xarray.open_zarr(MNT)["field"].values``
  ``--decode``)
  xarray, fsspec reference:// (JSON)          ``xarray.open_zarr("reference://", storage_
                                              options={"fo": REFS})["field"].values``,
                                              in-process
  GDAL 3.6, ncdump, refmount (Icechunk,       the repository mounted with ``--decode``
  ``--decode``)                               (Zarr v3 served as v2): the readers of v2
                                              only, as above
  xarray + icechunk (in-process)              ``xarray.open_zarr(repo.readonly_session(
                                              "main").store)["field"].values``
  ==========================================  ===========================================

Every value read is checked against the netCDF library's reading of the file (a row
whose values differ says ``WRONG VALUES``).  For every refmount row the daemon's CPU
time (user + system, ``/proc/PID/stat``) is taken after the cold read and after the warm
one, and given per GB of ``field`` read (its decoded size).  refmount runs from this
checkout's interpreter (``python -m refmount REFS MNT -f`` in a subprocess), is stopped
by its process id and unmounted in ``finally``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import kerchunk.df
import kerchunk.hdf
import netCDF4
import numpy as np
import rasterio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.mounting import Mounted  # noqa: E402
from tests.support.nginx import NginxServer  # noqa: E402

CHUNK = 200
MOUNT_TIMEOUT = 60.0
CHILD_TIMEOUT = 600.0

#: Child programs: argv[1] is the dataset to open.  Each reads it, prints "cold" and waits
#: for a line on stdin (the parent samples the daemon's CPU time meanwhile), reads it
#: again, and prints the two timings and a digest.
GDAL_CHILD = r"""
import hashlib, json, sys, time
import rasterio
times = []
for attempt in range(2):
    start = time.perf_counter()
    with rasterio.open(sys.argv[1]) as ds:
        values = ds.read(1)
    times.append(time.perf_counter() - start)
    if attempt == 0:
        print("cold", flush=True)
        sys.stdin.readline()
print(json.dumps({"times": times, "sha256": hashlib.sha256(values.tobytes()).hexdigest()}))
"""

XARRAY_CHILD = r"""
import hashlib, json, sys, time, warnings
import xarray as xr
import zarr, xarray.backends.zarr  # imported before the clock starts, as the GDAL child's
warnings.simplefilter("ignore")
target, options = sys.argv[1], json.loads(sys.argv[2])
times = []
for attempt in range(2):
    start = time.perf_counter()
    with xr.open_zarr(target, consolidated=False, zarr_format=2, **options) as ds:
        values = ds["field"].values
    times.append(time.perf_counter() - start)
    if attempt == 0:
        print("cold", flush=True)
        sys.stdin.readline()
print(json.dumps({"times": times, "sha256": hashlib.sha256(values.tobytes()).hexdigest()}))
"""


ICECHUNK_CHILD = r"""
import hashlib, json, sys, time, warnings
import icechunk, xarray as xr
import zarr, xarray.backends.zarr
warnings.simplefilter("ignore")
icechunk.set_logs_filter("error")
repository, container = sys.argv[1], sys.argv[2]
times = []
for attempt in range(2):
    start = time.perf_counter()
    repo = icechunk.Repository.open(
        icechunk.local_filesystem_storage(repository),
        authorize_virtual_chunk_access=icechunk.containers_credentials(
            {container: icechunk.credentials.HttpAccess}
        ),
    )
    with xr.open_zarr(repo.readonly_session("main").store, consolidated=False) as ds:
        values = ds["field"].values
    times.append(time.perf_counter() - start)
    if attempt == 0:
        print("cold", flush=True)
        sys.stdin.readline()
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


#: Writes the Icechunk repository, in a child: this directory's icechunk.py (a benchmark)
#: would shadow the package here.
REPOSITORY_CHILD = r"""
import sys, icechunk
from obspec_utils.registry import ObjectStoreRegistry
from obstore.store import HTTPStore
from virtualizarr import open_virtual_dataset
from virtualizarr.parsers import HDFParser
icechunk.set_logs_filter("error")
base, path = sys.argv[1], sys.argv[2]
config = icechunk.RepositoryConfig.default()
container = icechunk.VirtualChunkContainer(base + "/", icechunk.http_store())
config.set_virtual_chunk_container(container)
repo = icechunk.Repository.create(icechunk.local_filesystem_storage(path), config)
store = HTTPStore.from_url(base, client_options={"allow_http": True})
vds = open_virtual_dataset(f"{base}/field.nc", registry=ObjectStoreRegistry({base: store}),
                           parser=HDFParser(), loadable_variables=[])
session = repo.writable_session("main")
vds.vz.to_icechunk(session.store)
session.commit("bench")
"""


def write_repository(base: str, work: Path) -> Path:
    """``base``/field.nc scanned by VirtualiZarr (over HTTP) into an Icechunk repository."""
    path = work / "repo"
    subprocess.run(
        [sys.executable, "-c", REPOSITORY_CHILD, base, str(path)],
        check=True, timeout=CHILD_TIMEOUT, cwd="/",
    )  # fmt: skip
    return path


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far, with its children's (``--decode``'s
    worker processes: those running and those reaped; ``/proc/PID/stat``)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:  # a child that has just ended: counted by its parent
        return 0.0
    ticks = sum(int(field) for field in fields[11:15])  # utime stime cutime cstime
    total = ticks / os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(FileNotFoundError):
            total += sum(cpu_seconds(int(child)) for child in task.read_text().split())
    return total


@contextmanager
def refmount(refs: Path, mountpoint: Path, *args: str) -> Iterator[Mounted]:
    """refmount in the foreground as our child; stopped by pid and unmounted after."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    log = mountpoint.parent / f"{mountpoint.name}.log"
    mounted = Mounted(refs, mountpoint, list(args), log, timeout=MOUNT_TIMEOUT)
    try:
        yield mounted
    finally:
        mounted.stop()


def last_line(text: str) -> str:
    return (text.strip().splitlines() or ["exit status"])[-1]


def run_child(program: str, *args: str, daemon: int | None = None) -> dict:
    """A Python child (cold read, "cold", a line from us, warm read, the result); with
    ``daemon``, that process's CPU seconds during the cold and the warm read."""
    base = cpu_seconds(daemon) if daemon else 0.0
    child = subprocess.Popen(
        [sys.executable, "-c", program, *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdin is not None and child.stdout is not None
        cold = child.stdout.readline().strip() == "cold"
        after_cold = cpu_seconds(daemon) if daemon else 0.0
        if cold:
            child.stdin.write("\n")
            child.stdin.flush()
        out, err = child.communicate(timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        return {"error": f"no answer within {CHILD_TIMEOUT:g} s"}
    if child.returncode != 0 or not cold:
        return {"error": last_line(err)}
    result = json.loads(out)
    if daemon:
        result["cpu"] = [after_cold - base, cpu_seconds(daemon) - after_cold]
    return result


def run_command(
    argv: list[str], out: Path, values: Callable[[Path], np.ndarray], daemon: int
) -> dict:
    """A command-line reader, twice (cold, warm), its standard output into ``out``;
    ``values`` reads what it produced."""
    times, cpu = [], []
    base = cpu_seconds(daemon)
    for _ in range(2):
        start = time.perf_counter()
        with out.open("wb") as stdout:
            done = subprocess.run(
                argv, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=CHILD_TIMEOUT
            )
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            return {"error": last_line(done.stderr)}
        now = cpu_seconds(daemon)
        cpu.append(now - base)
        base = now
    try:
        digest = hashlib.sha256(values(out).astype("<f4").tobytes()).hexdigest()
    except ValueError as e:  # output that is not numbers at all
        return {"error": f"unreadable output: {e}"}
    return {"times": times, "cpu": cpu, "sha256": digest}


def ncdump_values(out: Path) -> np.ndarray:
    """``field``'s values in an ``ncdump -p 9 -v field`` listing (9 digits: exact)."""
    text = out.read_text()
    body = text[text.index(" field =", text.index("\ndata:")) + len(" field =") :]
    body = body[: body.index(";")].replace("NaNf", "NaN").replace("Infinityf", "Infinity")
    return np.array(body.split(","), dtype=np.float32)


def gdal_version() -> tuple[int, int]:
    major, minor = rasterio.__gdal_version__.split(".")[:2]
    return int(major), int(minor)


def has_parquet_driver() -> bool:
    """Whether rasterio's GDAL reads Parquet (/vsikerchunk_parquet_ref/ needs it; the
    rasterio 1.5 wheels are built without it)."""
    with rasterio.Env() as env:
        return "Parquet" in env.drivers()


def debian_gdal_version() -> str:
    done = subprocess.run(["gdalinfo", "--version"], capture_output=True, text=True)
    return done.stdout.split()[1].rstrip(",")


def measure(work: Path, size: int, delay: float) -> list[tuple[str, dict]]:
    nc_path, digest = write_data(work, size)
    rows: list[tuple[str, dict]] = []
    gdal = f"GDAL {rasterio.__gdal_version__} (rasterio)"
    debian = f"GDAL {debian_gdal_version()} (Debian gdal_translate)"
    with tempfile.TemporaryDirectory(prefix="refmount-bench-readers-") as tmp_name:
        tmp = Path(tmp_name)
        root = tmp / "www"
        root.mkdir()
        os.link(nc_path, root / "field.nc")
        with NginxServer(root, delay=delay) as nginx:
            json_refs, parquet_refs = write_refs(nc_path, f"{nginx.url}/field.nc", tmp)
            views = (
                ("JSON", json_refs, ()),
                ("Parquet", parquet_refs, ()),
                ("JSON, --decode", json_refs, ("--decode",)),
            )
            for kind, refs, args in views:
                with refmount(refs, tmp / f"mnt-gdal-{len(rows)}", *args) as m:
                    source = f'ZARR:"{m.mountpoint}":/field'
                    result = run_child(GDAL_CHILD, source, daemon=m.pid)
                rows.append((f"{gdal}, refmount ({kind})", result))
            for kind, refs, prefix in (
                ("JSON", json_refs, "/vsikerchunk_json_ref/"),
                ("Parquet", parquet_refs, "/vsikerchunk_parquet_ref/"),
            ):
                name = f"{gdal}, {prefix} ({kind})"
                if gdal_version() < (3, 11):
                    rows.append((name, {"error": "not run: /vsikerchunk needs GDAL >= 3.11"}))
                    continue
                result = run_child(GDAL_CHILD, f'ZARR:"{prefix}{{{refs}}}":/field')
                if "error" in result and kind == "Parquet" and not has_parquet_driver():
                    result["error"] += (
                        f" (GDAL {rasterio.__gdal_version__} without its Parquet driver)"
                    )
                rows.append((name, result))
            envi = tmp / "field.envi"
            for kind, args in (("JSON", ()), ("JSON, --decode", ("--decode",))):
                with refmount(json_refs, tmp / f"mnt-debian-{len(rows)}", *args) as m:
                    argv = ["gdal_translate", "-q", "-of", "ENVI"]
                    argv += [f'ZARR:"{m.mountpoint}":/field', str(envi)]
                    result = run_command(
                        argv, tmp / "gdal.log", lambda _: np.fromfile(envi, "<f4"), m.pid
                    )
                rows.append((f"{debian}, refmount ({kind})", result))
            for kind, args in (("JSON", ()), ("JSON, --decode", ("--decode",))):
                with refmount(json_refs, tmp / f"mnt-ncdump-{len(rows)}", *args) as m:
                    argv = ["ncdump", "-p", "9", "-v", "field"]
                    argv += [f"file://{m.mountpoint}#mode=zarr,file"]
                    result = run_command(argv, tmp / "field.cdl", ncdump_values, m.pid)
                rows.append((f"ncdump (netCDF-C 4.9, Debian), refmount ({kind})", result))
            for kind, refs, args in views:
                with refmount(refs, tmp / f"mnt-xarray-{len(rows)}", *args) as m:
                    result = run_child(XARRAY_CHILD, str(m.mountpoint), "{}", daemon=m.pid)
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
            rows.append(("xarray, fsspec reference:// (JSON, in-process)", result))
            repository = write_repository(nginx.url, tmp)
            with refmount(repository, tmp / f"mnt-debian-{len(rows)}", "--decode") as m:
                argv = ["gdal_translate", "-q", "-of", "ENVI"]
                argv += [f'ZARR:"{m.mountpoint}":/field', str(envi)]
                result = run_command(
                    argv, tmp / "gdal.log", lambda _: np.fromfile(envi, "<f4"), m.pid
                )
            rows.append((f"{debian}, refmount (Icechunk, --decode)", result))
            with refmount(repository, tmp / f"mnt-ncdump-{len(rows)}", "--decode") as m:
                argv = ["ncdump", "-p", "9", "-v", "field"]
                argv += [f"file://{m.mountpoint}#mode=zarr,file"]
                result = run_command(argv, tmp / "field.cdl", ncdump_values, m.pid)
            rows.append(("ncdump (netCDF-C 4.9, Debian), refmount (Icechunk, --decode)", result))
            result = run_child(ICECHUNK_CHILD, str(repository), nginx.url + "/")
            rows.append(("xarray + icechunk (in-process)", result))
    for _name, result in rows:
        if "sha256" in result and result["sha256"] != digest:
            result["error"] = "WRONG VALUES"
    return rows


def table(rows: list[tuple[str, dict]], mib: float) -> str:
    gb = mib * 2**20 / 1e9
    lines = [
        "| reader | cold s | warm s | cold MiB/s | warm MiB/s "
        "| daemon+workers CPU s/GB cold | warm |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, result in rows:
        if "times" not in result or "error" in result:
            lines.append(f"| {name} | {result.get('error', '?')} | | | | | |")
            continue
        cold, warm = result["times"]
        cpu = [f"{c / gb:.1f}" for c in result["cpu"]] if "cpu" in result else ["", ""]
        lines.append(
            f"| {name} | {cold:.2f} | {warm:.2f} | {mib / cold:.1f} | {mib / warm:.1f} "
            f"| {cpu[0]} | {cpu[1]} |"
        )
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

"""Icechunk benchmark: a repository mounted by refmount against icechunk in-process.

    python bench/icechunk.py [--chunks 1000000] [--delay 0.005] [--workdir DIR]

Two repositories, built in a temporary directory each run:

* ``http``: a netCDF4 file (``temp``, 60x400x400 float32, zlib + shuffle, 48 chunks)
  referenced by VirtualiZarr through HTTP, beside a native array (``native``, zstd,
  48 chunks), both served with the repository by nginx on 127.0.0.1 with ``--delay``
  seconds before each answer.  Read whole, each variable: through the mount (zarr in a
  fresh process; cold, warm, then after a remount with ``--disk-cache``, cold and warm
  disk) against xarray + icechunk in a fresh process on the same repository over HTTP.
* ``big``: a local repository with one array of ``--chunks`` virtual chunks (1-chunk
  grid cells, 40 URLs that need not exist) beside 100 small native arrays.  Mount
  readiness (``refmount REPO MNT``, backgrounded, to the root listing) and the first
  ``ls`` of the big array's chunk directory, against ``Repository.open`` + iterating the
  array's references in a fresh process; the daemon's resident memory after the listing.

Everything mounted is unmounted at exit; only daemons this script started are signalled.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.mounting import child_env, mount_background, rss_kib  # noqa: E402
from tests.support.nginx import NginxServer  # noqa: E402

SHAPE, CHUNKS = (60, 400, 400), (5, 200, 200)

BUILD_HTTP = f"""
import sys, numpy as np, netCDF4, icechunk, zarr
from pathlib import Path
from obspec_utils.registry import ObjectStoreRegistry
from obstore.store import HTTPStore
from virtualizarr import open_virtual_dataset
from virtualizarr.parsers import HDFParser
icechunk.set_logs_filter("error")
root, base = Path(sys.argv[1]), sys.argv[2]
shape, chunks = {SHAPE}, {CHUNKS}
rng = np.random.default_rng(1)
(root / "data").mkdir(parents=True)
with netCDF4.Dataset(root / "data/a.nc", "w") as ds:
    for name, size in zip("tyx", shape):
        ds.createDimension(name, size)
    v = ds.createVariable("temp", "f4", tuple("tyx"), zlib=True, shuffle=True, chunksizes=chunks)
    v[:] = np.round(rng.normal(280, 5, shape), 2).astype("f4")
config = icechunk.RepositoryConfig.default()
config.set_virtual_chunk_container(
    icechunk.VirtualChunkContainer(base + "/data/", icechunk.http_store()))
repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(root / "repo")), config)
store = HTTPStore.from_url(base, client_options={{"allow_http": True}})
vds = open_virtual_dataset(base + "/data/a.nc", registry=ObjectStoreRegistry({{base: store}}),
                           parser=HDFParser())
session = repo.writable_session("main")
vds.vz.to_icechunk(session.store)
group = zarr.open_group(session.store)
native = group.create_array("native", shape=shape, chunks=chunks, dtype="f4",
                            compressors=zarr.codecs.ZstdCodec(), dimension_names=tuple("tyx"))
native[:] = rng.normal(0, 1, shape).astype("f4")
session.commit("bench")
"""

BUILD_BIG = """
import sys, numpy as np, icechunk, zarr
icechunk.set_logs_filter("error")
root, n = sys.argv[1], int(sys.argv[2])
config = icechunk.RepositoryConfig.default()
config.set_virtual_chunk_container(
    icechunk.VirtualChunkContainer("s3://bucket/data/", icechunk.s3_store(region="us-east-1")))
repo = icechunk.Repository.create(icechunk.local_filesystem_storage(root), config)
session = repo.writable_session("main")
group = zarr.open_group(session.store)
group.create_array("big", shape=(n,), chunks=(1,), dtype="f4")
urls = [f"s3://bucket/data/file_{i % 40:02d}.nc" for i in range(n)]
session.store.set_virtual_refs_arr("big", (n,), urls, np.arange(n, dtype=np.uint64) * 100,
                                   np.full(n, 100, np.uint64))
for i in range(100):
    group.create_array(f"small{i:03d}", shape=(10,), chunks=(5,), dtype="i4")[:] = np.arange(10)
session.commit("big")
"""

READ_MOUNT = """
import sys, time, zarr
t = time.perf_counter()
values = zarr.open_array(sys.argv[1], mode="r")[:]
print(json.dumps([time.perf_counter() - t, float(values.sum())]))
"""

READ_ICECHUNK = """
import sys, time, json, icechunk, xarray as xr
icechunk.set_logs_filter("error")
url, name = sys.argv[1], sys.argv[2]
t = time.perf_counter()
repo = icechunk.Repository.open(
    icechunk.http_storage(url + "/repo"),
    authorize_virtual_chunk_access=icechunk.containers_credentials(
        {url + "/data/": icechunk.credentials.HttpAccess}))
ds = xr.open_zarr(repo.readonly_session("main").store, consolidated=False)
values = ds[name].values
print(json.dumps([time.perf_counter() - t, float(values.sum())]))
"""

ITERATE = """
import sys, time, json, asyncio, icechunk
icechunk.set_logs_filter("error")
t = time.perf_counter()
repo = icechunk.Repository.open(icechunk.local_filesystem_storage(sys.argv[1]))
store = repo.readonly_session("main").store
async def count():
    return sum([len(b[1]) async for b in store.array_chunk_iterator("big", batch_size=100000)])
n = asyncio.run(count())
print(json.dumps([time.perf_counter() - t, n]))
"""


def python(script: str, *args: str) -> list[float]:
    """Run ``script`` in a fresh process (in ``/``: this file's name must not shadow the
    icechunk package) and return the JSON list it prints last."""
    done = subprocess.run(
        [sys.executable, "-c", "import json\n" + script, *args],
        capture_output=True, text=True, env=child_env(), timeout=900, cwd="/",
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    if done.returncode < 0 and lines:  # icechunk's runtime at times crashes at exit (-11)
        print(f"(a measuring process died of signal {-done.returncode} after printing its "
              "result)", file=sys.stderr)  # fmt: skip
    elif done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr else "failed")
    return json.loads(lines[-1]) if lines else []


def bench_http(work: Path, delay: float, rows: list[tuple[str, str, str]]) -> None:
    www = work / "www"
    www.mkdir()
    with NginxServer(www, delay=delay) as server:
        python(BUILD_HTTP, str(www), server.url)
        for name in ("temp", "native"):
            try:
                read_one(work, server.url, name, rows)
            except (RuntimeError, AssertionError) as exc:
                rows.append((f"{name}: not measured", "-", str(exc)[:200]))


def read_one(work: Path, url: str, name: str, rows: list[tuple[str, str, str]]) -> None:
    """One variable read whole, in-process and through the mounts (each mount logs to
    ``WORK/NAME-N.log``; a failed read shows the log's last line)."""
    seconds, total = python(READ_ICECHUNK, url, name)
    rows.append((f"{name}: icechunk + xarray in-process", f"{seconds:.2f} s", ""))
    mnt = work / f"mnt-{name}"
    logs = iter(work / f"{name}-{n}.log" for n in range(3))

    def read(args: list[str]) -> list[float]:
        log = next(logs)
        try:
            with mount_background(f"{url}/repo", mnt, [*args, "--log-file", str(log)]):
                return [*python(READ_MOUNT, str(mnt / name)), *python(READ_MOUNT, str(mnt / name))]
        except RuntimeError as exc:
            last = log.read_text().strip().splitlines()[-1:] if log.exists() else []
            raise RuntimeError(f"{exc} ({' '.join(last)})") from None

    cold, got, warm, _ = read(["--allow-local"])
    assert abs(got - total) <= 1e-6 * max(1.0, abs(total)), (name, got, total)
    rows.append((f"{name}: mount, cold", f"{cold:.2f} s", "equal sums"))
    rows.append((f"{name}: mount, warm", f"{warm:.2f} s", ""))
    disk = ["--allow-local", "--disk-cache", str(work / f"disk-{name}")]
    read(disk)
    again, _, _, _ = read(disk)
    rows.append((f"{name}: remount, --disk-cache warm", f"{again:.2f} s", ""))


def bench_big(work: Path, chunks: int, rows: list[tuple[str, str, str]]) -> None:
    root = work / "big"
    subprocess.run(
        [sys.executable, "-c", BUILD_BIG, str(root), str(chunks)],
        check=True, env=child_env(), timeout=900, cwd="/",
    )  # fmt: skip
    seconds, count = python(ITERATE, str(root))
    rows.append(("Repository.open + iterate in-process", f"{seconds:.2f} s", f"{count:,} refs"))
    with mount_background(root, work / "mnt-big") as mounted:
        rows.append(("mount ready (101 arrays)", f"{mounted.ready:.2f} s", "target < 1 s"))
        start = time.perf_counter()
        listed = subprocess.run(
            ["ls", "-U", "-A", str(mounted.path / "big/c")], capture_output=True, check=True
        ).stdout.count(b"\n")
        first_ls = time.perf_counter() - start
        rows.append(("first ls of the big array", f"{first_ls:.2f} s", f"{listed:,} names"))
        assert mounted.pid is not None
        rss = rss_kib(mounted.pid) / 1024
        rows.append(("daemon RSS after it", f"{rss:.0f} MiB", "target < 300 MiB"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=1_000_000)
    parser.add_argument("--delay", type=float, default=0.005, help="nginx delay per request")
    parser.add_argument("--workdir", type=Path, help="(default: a temporary directory)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="icechunk-bench-", dir=args.workdir))
    rows: list[tuple[str, str, str]] = []
    try:
        bench_http(work, args.delay, rows)
        bench_big(work, args.chunks, rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    width = max(len(figure) for figure, _, _ in rows)
    for figure, value, note in rows:
        print(f"{figure:<{width}}  {value:>10}  {note}")


if __name__ == "__main__":
    main()

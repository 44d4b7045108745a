"""The netCDF view's header on a dataset of many small chunks (issue 30: "header and
``stat`` of a 100,000-chunk dataset's file in < 1 s"): ``stat`` and ``ncdump -h`` of
``MNT/x.nc`` through ``--netcdf``, next to ``ncdump -h`` of the same set through
``--decode`` with NCZarr (``'file:///MNT#mode=zarr,file'``), against nginx with 10 ms
per request, each on a fresh mount.

    python bench/netcdf_header.py [--chunks 100000] [--repeat 3] [--delay 0.01]

Data: a float32 array ``field`` of shape ``(chunks, 64)``, chunks ``(1, 64)`` (256 B
decoded, zlib), back to back in one file served by nginx.  Each run starts with the
kernel's page cache dropped and a new daemon.  Printed: the seconds each step takes
(median of ``--repeat``), how many chunks each daemon decoded (its ``decoded_chunks``
counter: what the header cost beyond the header) and the load average.  The ``.nc``
file's ``st_blksize`` is printed too: netCDF-C reads its first block of that size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.throughput import drop_caches  # noqa: E402
from tests.support.mounting import Mounted  # noqa: E402
from tests.support.nginx import NginxServer  # noqa: E402

WIDTH = 64  # values per chunk: 256 B decoded


def write_set(work: Path, url_of: str | None, chunks: int) -> list[tuple[int, int]]:
    """``data/small.bin`` (every chunk compressed, back to back), built once; the extents."""
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    blob, index = data / "small.bin", data / f"small-{chunks}.json"
    if index.exists() and blob.exists():
        return [tuple(pair) for pair in json.loads(index.read_text())]  # type: ignore[misc]
    extents, offset = [], 0
    with open(blob, "wb") as out:
        for k in range(chunks):
            values = (np.arange(WIDTH, dtype="<f4") + k).tobytes()
            compressed = zlib.compress(values, 4)
            out.write(compressed)
            extents.append((offset, len(compressed)))
            offset += len(compressed)
    index.write_text(json.dumps(extents))
    return extents


def write_refs(path: Path, url: str, extents: list[tuple[int, int]]) -> None:
    zarray = {
        "zarr_format": 2,
        "shape": [len(extents), WIDTH],
        "chunks": [1, WIDTH],
        "dtype": "<f4",
        "compressor": {"id": "zlib", "level": 4},
        "filters": None,
        "fill_value": "NaN",
        "order": "C",
    }
    refs: dict[str, Any] = {
        ".zgroup": json.dumps({"zarr_format": 2}),
        ".zattrs": json.dumps({"title": "100,000 small chunks"}),
        "field/.zarray": json.dumps(zarray),
        "field/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["time", "x"], "units": "K"}),
    }
    for k, (offset, length) in enumerate(extents):
        refs[f"field/{k}.0"] = [f"{url}/small.bin", offset, length]
    path.write_text(json.dumps({"version": 1, "refs": refs}))


def counter(mountpoint: Path, name: str) -> int:
    """One of the daemon's counters (``refmount status`` shows them all)."""
    stats = json.loads(os.getxattr(mountpoint, "user.refmount.stats"))
    return int(stats.get(name, 0))


def timed(argv: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - began


def netcdf_header(refs: Path, work: Path) -> dict[str, float]:
    mountpoint = work / "mnt-netcdf"
    mountpoint.mkdir(exist_ok=True)
    args = ["--netcdf", "--netcdf-name", "x", "--xattrs"]
    m = Mounted(refs, mountpoint, args, work / "netcdf.log")
    try:
        path = mountpoint / "x.nc"
        began = time.perf_counter()
        st = os.stat(path)
        stat_s = time.perf_counter() - began
        ncdump_s = timed(["ncdump", "-h", str(path)])
        return {
            "stat": stat_s,
            "ncdump": ncdump_s,
            "decoded": counter(mountpoint, "decoded_chunks"),
            "ahead": counter(mountpoint, "netcdf_read_ahead"),
            "blksize": st.st_blksize,
        }
    finally:
        m.stop()


def nczarr_header(refs: Path, work: Path) -> dict[str, float]:
    mountpoint = work / "mnt-decode"
    mountpoint.mkdir(exist_ok=True)
    m = Mounted(refs, mountpoint, ["--decode", "--xattrs"], work / "decode.log")
    try:
        ncdump_s = timed(["ncdump", "-h", f"file://{mountpoint}#mode=zarr,file"])
        return {"ncdump": ncdump_s, "decoded": counter(mountpoint, "decoded_chunks")}
    finally:
        m.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chunks", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--delay", type=float, default=0.01)
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "refmount-nch")
    args = p.parse_args()
    work = args.workdir
    extents = write_set(work, None, args.chunks)
    runs: dict[str, list[dict[str, float]]] = {"netcdf": [], "nczarr": []}
    with NginxServer(work / "data", delay=args.delay) as server:
        refs = work / "refs.json"
        write_refs(refs, server.url, extents)
        for _ in range(args.repeat):
            drop_caches()
            runs["netcdf"].append(netcdf_header(refs, work))
            drop_caches()
            runs["nczarr"].append(nczarr_header(refs, work))
    load = os.getloadavg()

    def median(name: str, what: str) -> float:
        return statistics.median(run[what] for run in runs[name])

    print(f"{args.chunks} chunks of {WIDTH * 4} B decoded; nginx +{args.delay * 1e3:g} ms")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"  x.nc st_blksize: {runs['netcdf'][0]['blksize']:.0f}")
    print(f"  stat MNT/x.nc (--netcdf):                {median('netcdf', 'stat'):6.3f} s")
    print(
        f"  ncdump -h MNT/x.nc (--netcdf):           {median('netcdf', 'ncdump'):6.3f} s"
        f"  ({median('netcdf', 'decoded'):.0f} chunks decoded,"
        f" {median('netcdf', 'ahead'):.0f} asked ahead)"
    )
    print(
        f"  ncdump -h file://MNT#mode=zarr (--decode): {median('nczarr', 'ncdump'):6.3f} s"
        f"  ({median('nczarr', 'decoded'):.0f} chunks decoded)"
    )


if __name__ == "__main__":
    main()

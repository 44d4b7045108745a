"""The netCDF view's record layout (issue 37): ``cp MNT/x.nc /dev/shm/`` of a file whose
two variables are stored record by record (``--netcdf-record-dim time``) next to the
same data as fixed variables (``--netcdf-record-dim none``), against nginx with 10 ms
per request, each copy on a fresh mount with the page cache dropped.

    python bench/netcdf_records.py [--chunks 4096] [--repeat 3] [--delay 0.01]

Data: ``bench/zarr_chunks.py``'s chunks (float32, 256 KiB decoded, zlib), split between
two arrays ``a`` and ``b`` of shape ``(chunks / 2, 256, 256)`` on ``(time, y, x)``: 4096
chunks are 1 GiB decoded.  In the record layout each record holds one chunk of ``a``
then one of ``b``, so a sequential reader alternates between them; in the fixed layout
it reads ``a`` whole, then ``b``.  Printed: each layout's rate in decoded MB/s (median
of ``--repeat``, every run shown), their ratio, and the load average.  The two copies
are compared value for value once (``ncks``-free: netCDF4-python).
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
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import zarr_chunks  # noqa: E402
from bench.netcdf_copy import mounted  # noqa: E402
from bench.throughput import drop_caches  # noqa: E402
from tests.support.nginx import NginxServer  # noqa: E402

LAYOUTS = {"records": "time", "fixed": "none"}


def write_refs(path: Path, url: str, extents: list[tuple[int, int]]) -> None:
    """Two arrays ``a`` and ``b``, each half of the chunks, and a time coordinate."""
    half = len(extents) // 2
    side = zarr_chunks.SIDE
    refs: dict[str, Any] = {".zgroup": json.dumps({"zarr_format": 2})}
    for name, part in (("a", extents[:half]), ("b", extents[half : 2 * half])):
        refs[f"{name}/.zarray"] = json.dumps({**zarr_chunks.ZARRAY, "shape": [half, side, side]})
        refs[f"{name}/.zattrs"] = json.dumps(zarr_chunks.ZATTRS)
        for k, (offset, length) in enumerate(part):
            refs[f"{name}/{k}.0.0"] = [f"{url}/zarr.bin", offset, length]
    path.write_text(json.dumps({"version": 1, "refs": refs}))


def copy(refs: Path, work: Path, layout: str, out: Path) -> float:
    """Seconds of ``cp`` of the file laid out as ``layout``, on a fresh mount."""
    m = mounted(
        refs, work, layout, ["--netcdf", "--netcdf-name", "x", "--netcdf-record-dim", layout]
    )
    try:
        path = m.mountpoint / "x.nc"
        os.stat(path)
        began = time.perf_counter()
        subprocess.run(["cp", str(path), str(out)], check=True)
        return time.perf_counter() - began
    finally:
        m.stop()


def same_values(one: Path, other: Path) -> None:
    with netCDF4.Dataset(one) as a, netCDF4.Dataset(other) as b:
        assert a.dimensions["time"].isunlimited() != b.dimensions["time"].isunlimited()
        for name in ("a", "b"):
            for k in range(0, len(a.dimensions["time"]), 64):
                assert np.array_equal(a[name][k], b[name][k]), (name, k)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chunks", type=int, default=4096)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--delay", type=float, default=0.01)
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "refmount-ncr")
    args = p.parse_args()
    work = args.workdir
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    extents = zarr_chunks.write_chunks(data, args.chunks)
    decoded = (args.chunks // 2 * 2) * zarr_chunks.DECODED
    outs = {layout: Path(f"/dev/shm/refmount-bench-{layout}.nc") for layout in LAYOUTS}
    results: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    with NginxServer(data, delay=args.delay) as server:
        refs = work / "refs.json"
        write_refs(refs, server.url, extents)
        try:
            for n in range(args.repeat):
                for layout, record_dim in LAYOUTS.items():
                    drop_caches()
                    results[layout].append(copy(refs, work, record_dim, outs[layout]))
                if n == 0:
                    same_values(outs["records"], outs["fixed"])
        finally:
            for out in outs.values():
                out.unlink(missing_ok=True)
    load = os.getloadavg()
    rate = {k: decoded / statistics.median(v) / 1e6 for k, v in results.items()}
    gib, delay_ms = decoded / 2**30, args.delay * 1e3
    print(f"{args.chunks} chunks, {gib:.2f} GiB decoded; nginx +{delay_ms:g} ms per request")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for layout in LAYOUTS:
        runs = ", ".join(f"{decoded / s / 1e6:.0f}" for s in results[layout])
        print(f"  cp of the {layout:<8} layout  {rate[layout]:7.0f} MB/s  (runs: {runs})")
    print(f"  ratio records / fixed: {rate['records'] / rate['fixed']:.2f}")


if __name__ == "__main__":
    main()

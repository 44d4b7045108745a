"""``cp`` of a netCDF view's variable chunked along its last axis (issue 40, item 8):
``(ROWS, COLUMNS)`` float32 chunked ``(ROWS, 1)``, larger than the memory budget, so every
row the file holds meets every chunk.

    python bench/netcdf_columns.py [--rows 2048] [--columns 2048] [--cache-size 8M]

Data: one local file of the zlib chunks back to back (column after column), referenced by
a JSON set, mounted with ``--netcdf --allow-local --cache-size``; each run is a fresh
daemon with the page cache dropped.  Printed: the seconds ``cp MNT/columns.nc
/dev/shm/`` takes, the CPU seconds of the daemon's process tree (its decode workers
too) during it, and the load average.  The copy is compared with the values once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.throughput import drop_caches  # noqa: E402
from tests.support.mounting import Mounted  # noqa: E402


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its descendants alive now."""
    total, todo = 0, [pid]
    while todo:
        one = todo.pop()
        try:
            fields = Path(f"/proc/{one}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
        for task in Path(f"/proc/{one}/task").glob("*/children"):
            try:
                todo.extend(int(child) for child in task.read_text().split())
            except OSError:
                continue
    return total / os.sysconf("SC_CLK_TCK")


def write_set(work: Path, rows: int, columns: int) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(40)
    values = np.round(rng.normal(280.0, 5.0, (rows, columns)), 1).astype("<f4")
    data = work / "columns.bin"
    meta = {
        "zarr_format": 2, "shape": [rows, columns], "chunks": [rows, 1], "dtype": "<f4",
        "compressor": {"id": "zlib", "level": 1}, "filters": None, "order": "C",
        "fill_value": None,
    }  # fmt: skip
    refs: dict[str, object] = {
        ".zgroup": '{"zarr_format": 2}',
        "v/.zarray": json.dumps(meta),
        "v/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["row", "column"]}),
    }
    at = 0
    with open(data, "wb") as f:
        for column in range(columns):
            chunk = zlib.compress(np.ascontiguousarray(values[:, column]).tobytes(), 1)
            f.write(chunk)
            refs[f"v/0.{column}"] = [str(data), at, len(chunk)]
            at += len(chunk)
    path = work / "columns.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path, values


def copy(refs: Path, work: Path, cache: str) -> tuple[float, float, bytes]:
    """Seconds of ``cp``, the daemon tree's CPU seconds during it, the copy's bytes."""
    mountpoint = work / "mnt"
    mountpoint.mkdir(exist_ok=True)
    args = ["--netcdf", "--allow-local", "--cache-size", cache]
    m = Mounted(refs, mountpoint, args, work / "refmount.log")
    out = Path("/dev/shm/refmount-bench-columns.nc")
    try:
        os.stat(mountpoint / "columns.nc")
        cpu = tree_cpu(m.pid)
        began = time.perf_counter()
        subprocess.run(["cp", str(mountpoint / "columns.nc"), str(out)], check=True)
        seconds = time.perf_counter() - began
        return seconds, tree_cpu(m.pid) - cpu, out.read_bytes()
    finally:
        m.stop()
        out.unlink(missing_ok=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2048)
    p.add_argument("--columns", type=int, default=2048)
    p.add_argument("--cache-size", default="8M")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "refmount-cols")
    args = p.parse_args()
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    refs, values = write_set(work, args.rows, args.columns)
    size = values.nbytes
    shape = f"({args.rows}, {args.columns}) float32 chunked ({args.rows}, 1)"
    print(f"{shape}: {size / 2**20:.0f} MiB, {args.columns} chunks; --cache-size {args.cache_size}")
    for n in range(args.repeat):
        drop_caches()
        seconds, cpu, data = copy(refs, work, args.cache_size)
        if n == 0:
            assert data[-size:] == values.astype(">f4").tobytes(), "the copy differs"
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        rate = size / seconds / 1e6
        print(f"  cp: {seconds:.2f} s ({rate:.1f} MB/s), daemon and workers {cpu:.2f} CPU s; "
              f"load average {load}")  # fmt: skip


if __name__ == "__main__":
    main()

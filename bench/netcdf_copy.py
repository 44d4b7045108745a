"""The netCDF view's copy rate (issue 30): ``cp MNT/x.nc /dev/shm/`` through ``--netcdf``
next to ``cat`` of the same array's decoded chunk files in key order through
``--decode``, both against nginx with 10 ms per request, each on a fresh mount.

    python bench/netcdf_copy.py [--chunks 4096] [--repeat 3] [--delay 0.01]

Data: ``bench/zarr_chunks.py``'s array (float32 chunks of 256 KiB decoded, zlib, back
to back in one file served by nginx): 4096 chunks are 1 GiB decoded, the netCDF file is
that plus its header.  Each run starts with the kernel's page cache dropped (as root:
the server's file too) and a new daemon.  Printed: each system's rate in decoded MB/s
(median of ``--repeat``), the ratio (issue 37's bar: netCDF >= 0.9 x decoded), the
seconds ``stat`` and ``ncdump -h`` of the fresh file take, each daemon's peak RSS
(``VmHWM``) against ``--cache-size`` + 150 MB, the netCDF daemon's process tree's peak
(its decode workers too, sampled during the copy), and the load average.  The copy is
compared with the decoded chunks byte for byte (values, big-endian) once.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import zarr_chunks  # noqa: E402
from bench.throughput import drop_caches  # noqa: E402
from tests.support.mounting import Mounted  # noqa: E402
from tests.support.nginx import NginxServer  # noqa: E402

CACHE = "512M"
CACHE_BYTES = 512 << 20


def status_bytes(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` size (``VmHWM``, ``VmRSS``) in bytes; 0 for a process gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) << 10
    return 0


def tree_rss(pid: int) -> int:
    """The resident bytes of ``pid`` and its descendants (``--decode``'s and
    ``--netcdf``'s worker processes) now."""
    total, todo = 0, [pid]
    while todo:
        one = todo.pop()
        total += status_bytes(one, "VmRSS")
        for task in Path(f"/proc/{one}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo.extend(int(child) for child in task.read_text().split())
    return total


class TreeRss:
    """The peak of :func:`tree_rss` of ``pid``, sampled every 0.1 s while in use."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.1):
            self.peak = max(self.peak, tree_rss(self.pid))

    def __enter__(self) -> TreeRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def mounted(refs: Path, work: Path, name: str, args: list[str]) -> Mounted:
    mountpoint = work / f"mnt-{name}"
    mountpoint.mkdir(exist_ok=True)
    return Mounted(refs, mountpoint, ["--cache-size", CACHE, *args], work / f"{name}.log")


def copy_netcdf(refs: Path, work: Path, out: Path) -> tuple[float, float, int, int]:
    """Seconds of ``cp``, seconds of ``stat`` + ``ncdump -h``, the daemon's peak RSS and
    its process tree's (sampled during the copy)."""
    m = mounted(refs, work, "netcdf", ["--netcdf", "--netcdf-name", "x"])
    try:
        path = m.mountpoint / "x.nc"
        began = time.perf_counter()
        os.stat(path)
        subprocess.run(["ncdump", "-h", str(path)], check=True, capture_output=True)
        header = time.perf_counter() - began
        began = time.perf_counter()
        with TreeRss(m.pid) as tree:
            subprocess.run(["cp", str(path), str(out)], check=True)
        return time.perf_counter() - began, header, status_bytes(m.pid, "VmHWM"), tree.peak
    finally:
        m.stop()


def cat_decoded(refs: Path, work: Path, keys: list[str]) -> tuple[float, int]:
    """Seconds of one ``cat`` of every decoded chunk file in key order, peak RSS."""
    m = mounted(refs, work, "decode", ["--decode"])
    try:
        files = [str(m.mountpoint / key) for key in keys]
        began = time.perf_counter()
        with open(os.devnull, "wb") as sink:
            subprocess.run(["cat", *files], check=True, stdout=sink)
        return time.perf_counter() - began, status_bytes(m.pid, "VmHWM")
    finally:
        m.stop()


def check_copy(out: Path, chunks: int) -> None:
    """The copy's values (big-endian, after the header) equal every chunk's."""
    size = out.stat().st_size
    values = np.memmap(out, ">f4", mode="r", offset=size - chunks * zarr_chunks.DECODED)
    rng = np.random.default_rng(22)  # the chunks' noise, drawn in chunk order
    side = zarr_chunks.SIDE**2
    for k in range(chunks):
        got = values[k * side : (k + 1) * side].astype("<f4").tobytes()
        assert got == zarr_chunks.chunk_values(k, rng), f"chunk {k} differs"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chunks", type=int, default=4096)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--delay", type=float, default=0.01)
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "refmount-nc")
    p.add_argument(
        "--no-check",
        action="store_true",
        help="skip comparing the copy with every chunk (minutes for 4 GiB)",
    )
    args = p.parse_args()
    work = args.workdir
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    extents = zarr_chunks.write_chunks(data, args.chunks)
    decoded = args.chunks * zarr_chunks.DECODED
    out = Path("/dev/shm/refmount-bench-x.nc")
    results: dict[str, list[float]] = {"netcdf": [], "decode": []}
    rss: dict[str, int] = {"netcdf": 0, "decode": 0}
    tree = 0  # the netCDF daemon's process tree during the copy
    headers: list[float] = []
    with NginxServer(data, delay=args.delay) as server:
        refs = work / "refs.json"
        keys = zarr_chunks.write_refs(refs, server.url, extents)
        try:
            for n in range(args.repeat):
                drop_caches()
                seconds, header, peak, tree_peak = copy_netcdf(refs, work, out)
                results["netcdf"].append(seconds)
                headers.append(header)
                rss["netcdf"] = max(rss["netcdf"], peak)
                tree = max(tree, tree_peak)
                if n == 0 and not args.no_check:
                    check_copy(out, args.chunks)
                out.unlink()
                drop_caches()
                seconds, peak = cat_decoded(refs, work, keys)
                results["decode"].append(seconds)
                rss["decode"] = max(rss["decode"], peak)
        finally:
            out.unlink(missing_ok=True)
    load = os.getloadavg()
    rate = {k: decoded / statistics.median(v) / 1e6 for k, v in results.items()}
    gib, delay_ms = decoded / 2**30, args.delay * 1e3
    print(f"{args.chunks} chunks, {gib:.2f} GiB decoded; nginx +{delay_ms:g} ms per request")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; --cache-size {CACHE}")
    for name, label in (("netcdf", "cp MNT/x.nc /dev/shm/ (--netcdf)"),
                        ("decode", "cat decoded chunk files in key order (--decode)")):  # fmt: skip
        runs = ", ".join(f"{decoded / s / 1e6:.0f}" for s in results[name])
        allowed = (CACHE_BYTES + 150e6) / 2**20
        print(f"  {label:<50} {rate[name]:7.0f} MB/s  (runs: {runs})  peak RSS "
              f"{rss[name] / 2**20:.0f} MiB (allowed {allowed:.0f})")  # fmt: skip
    print(f"  netCDF daemon and its workers during cp: peak RSS {tree / 2**20:.0f} MiB "
          f"(sampled every 0.1 s)")  # fmt: skip
    print(f"  ratio netcdf / decode: {rate['netcdf'] / rate['decode']:.2f} (issue 37's bar >= 0.9)")
    print(f"  stat + ncdump -h of the fresh file: {statistics.median(headers):.2f} s (median)")


if __name__ == "__main__":
    main()

"""The netCDF view's copy rate (issue 30): ``cp MNT/x.nc /dev/shm/`` through ``--netcdf``
next to ``cat`` of the same array's decoded chunk files in key order through
``--decode``, both against nginx with 10 ms per request, each on a fresh mount.

    python bench/netcdf_copy.py [--chunks 4096] [--repeat 3] [--delay 0.01]

Data: ``bench/zarr_chunks.py``'s array (float32 chunks of 256 KiB decoded, zlib, back
to back in one file served by nginx): 4096 chunks are 1 GiB decoded, the netCDF file is
that plus its header.  Each run starts with the kernel's page cache dropped (as root:
the server's file too) and a new daemon.  Printed: each system's rate in decoded MB/s
(median of ``--repeat``), the ratio (issue 30's target: netCDF >= 0.7 x decoded), the
seconds ``stat`` and ``ncdump -h`` of the fresh file take, each daemon's peak RSS
(``VmHWM``) against ``--cache-size`` + 150 MB, and the load average.  The copy is
compared with the decoded chunks byte for byte (values, big-endian) once.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
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


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    return 0


def mounted(refs: Path, work: Path, name: str, args: list[str]) -> Mounted:
    mountpoint = work / f"mnt-{name}"
    mountpoint.mkdir(exist_ok=True)
    return Mounted(refs, mountpoint, ["--cache-size", CACHE, *args], work / f"{name}.log")


def copy_netcdf(refs: Path, work: Path, out: Path) -> tuple[float, float, int]:
    """Seconds of ``cp``, seconds of ``stat`` + ``ncdump -h``, the daemon's peak RSS."""
    m = mounted(refs, work, "netcdf", ["--netcdf", "--netcdf-name", "x"])
    try:
        path = m.mountpoint / "x.nc"
        began = time.perf_counter()
        os.stat(path)
        subprocess.run(["ncdump", "-h", str(path)], check=True, capture_output=True)
        header = time.perf_counter() - began
        began = time.perf_counter()
        subprocess.run(["cp", str(path), str(out)], check=True)
        return time.perf_counter() - began, header, peak_rss(m.pid)
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
        return time.perf_counter() - began, peak_rss(m.pid)
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
    args = p.parse_args()
    work = args.workdir
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    extents = zarr_chunks.write_chunks(data, args.chunks)
    decoded = args.chunks * zarr_chunks.DECODED
    out = Path("/dev/shm/refmount-bench-x.nc")
    results: dict[str, list[float]] = {"netcdf": [], "decode": []}
    rss: dict[str, int] = {"netcdf": 0, "decode": 0}
    headers: list[float] = []
    with NginxServer(data, delay=args.delay) as server:
        refs = work / "refs.json"
        keys = zarr_chunks.write_refs(refs, server.url, extents)
        try:
            for n in range(args.repeat):
                drop_caches()
                seconds, header, peak = copy_netcdf(refs, work, out)
                results["netcdf"].append(seconds)
                headers.append(header)
                rss["netcdf"] = max(rss["netcdf"], peak)
                if n == 0:
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
    print(f"  ratio netcdf / decode: {rate['netcdf'] / rate['decode']:.2f} (target >= 0.7)")
    print(f"  stat + ncdump -h of the fresh file: {statistics.median(headers):.2f} s (median)")


if __name__ == "__main__":
    main()

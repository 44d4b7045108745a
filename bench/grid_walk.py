"""One reader walking an array's chunks across objects: grid read-ahead (issue 39).

    python bench/grid_walk.py [--t 600] [--delay 0.01] [--repeat 2] [--rows ...]

Data, built each run: an array ``v`` of shape (T, 256, 256) float32, chunk (1, 256, 256)
= 256 KiB, chunk ``t`` the whole object ``g/t.bin`` (a combined reference set: one
granule per time step), served by nginx on 127.0.0.1 with ``--delay`` seconds before
each answer; a JSON reference set (v2 keys ``v/t.0.0``).

Rows, each from a fresh mount (``refmount --xattrs``, cold), each with and without grid
read-ahead (``--no-grid-read-ahead``: the path before issue 39):

  limit     obstore in-process: one ``get_range_async`` per chunk, 16 in flight
  cat       one ``cat`` of ``v/0.0.0 ... v/{T-1}.0.0`` in key order
  cat16     16 ``cat`` processes at once, each over its own run of T/16 keys in order
            (16 walkers sharing the read-ahead budget)
  series    a time series at one point: one process ``pread``s 16 KiB at one offset of
            each chunk file, in ``t`` order (its limit: the limit row's time for the
            whole chunks)
  ncdump    ``ncdump -v v 'file://MNT#mode=zarr,file'`` on ``--decode`` (netCDF-C's
            NCZarr); ``ncdump.local`` the same over a copy on /dev/shm (the reader's own
            floor: printing 39 M values)

Each row: seconds (best of ``--repeat``), MB/s of chunk bytes, the ratio to the limit,
requests nginx answered (its access log), the read-ahead bytes fetched and not read
(``grid_readahead_unused`` of ``user.refmount.stats``), the load average beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.mounting import Mounted  # noqa: E402
from tests.support.nginx import NginxServer  # noqa: E402

SIDE = 256
CHUNK = SIDE * SIDE * 4
PARALLEL = 16
POINT = 16 << 10  # bytes a time series reads of each chunk
SERIES = """
import os, sys, time
offset, size, names = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
start = time.perf_counter()
got = 0
for name in names:
    fd = os.open(name, os.O_RDONLY)
    got += len(os.pread(fd, size, offset))
    os.close(fd)
print(time.perf_counter() - start, got)
"""


def build(www: Path, t: int) -> None:
    (www / "g").mkdir(parents=True)
    base = (np.arange(SIDE * SIDE, dtype="f4") % 97).reshape(SIDE, SIDE)
    for n in range(t):
        (www / "g" / f"{n}.bin").write_bytes((base + n % 7).astype("<f4").tobytes())


def refs_of(url: str, t: int) -> dict:
    meta = {"zarr_format": 2, "shape": [t, SIDE, SIDE], "chunks": [1, SIDE, SIDE],
            "dtype": "<f4", "compressor": None, "filters": None, "fill_value": 0.0,
            "order": "C"}  # fmt: skip
    refs: dict[str, object] = {
        ".zgroup": json.dumps({"zarr_format": 2}),
        ".zattrs": "{}",
        "v/.zarray": json.dumps(meta),
        "v/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["t", "y", "x"]}),
    }
    for n in range(t):
        refs[f"v/{n}.0.0"] = [f"{url}/g/{n}.bin", 0, CHUNK]
    return {"version": 1, "refs": refs}


def requests(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def limit(url: str, t: int) -> float:
    """obstore in-process, one GET per chunk, 16 in flight: seconds."""
    import obstore
    from obstore.store import HTTPStore

    store = HTTPStore.from_url(url, client_options={"allow_http": True})

    async def fetch_all() -> int:
        gate = asyncio.Semaphore(PARALLEL)

        async def one(n: int) -> int:
            async with gate:
                data = await obstore.get_range_async(store, f"g/{n}.bin", start=0, length=CHUNK)
                return len(data)

        return sum(await asyncio.gather(*(one(n) for n in range(t))))

    began = time.perf_counter()
    got = asyncio.run(fetch_all())
    seconds = time.perf_counter() - began
    assert got == t * CHUNK, got
    return seconds


def read_through(mnt: Path, row: str, t: int) -> float:
    keys = [f"v/{n}.0.0" for n in range(t)]
    began = time.perf_counter()
    if row == "cat":
        # Into a file, as cat16: a pipe this process drains (``capture_output`` reads 32
        # KiB at a time) costs the two cores about 0.2 s per 157 MB, the reader's time
        # and not the mount's (bench/README.md).
        with tempfile.TemporaryFile() as out:
            subprocess.run(["cat", *keys], cwd=mnt, stdout=out, check=True)
            got = os.fstat(out.fileno()).st_size
        assert got == t * CHUNK, got
    elif row == "cat16":
        runs = [keys[n * t // PARALLEL : (n + 1) * t // PARALLEL] for n in range(PARALLEL)]
        # Into files, not pipes: a pipe nobody drains yet would hold its reader back.
        with contextlib.ExitStack() as stack:
            outs = [stack.enter_context(tempfile.TemporaryFile()) for _ in runs]
            readers = [
                subprocess.Popen(["cat", *run], cwd=mnt, stdout=out)
                for run, out in zip(runs, outs, strict=True)
            ]
            assert all(reader.wait() == 0 for reader in readers)
            got = sum(os.fstat(out.fileno()).st_size for out in outs)
        assert got == t * CHUNK, got
    elif row == "series":
        text = subprocess.run(
            [sys.executable, "-c", SERIES, str(CHUNK // 2), str(POINT), *keys],
            cwd=mnt, capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        assert int(text[1]) == t * POINT
        return float(text[0])
    elif row.startswith("ncdump"):
        # Into a file, as cat: its ~300 MB of text read back through a pipe by this
        # process would take the two cores from the reader and the daemon.
        with tempfile.TemporaryFile() as out:
            subprocess.run(
                ["ncdump", "-v", "v", f"file://{mnt}#mode=zarr,file"], stdout=out, check=True
            )
            seconds = time.perf_counter() - began
            out.seek(0)
            commas = sum(block.count(b",") for block in iter(lambda: out.read(1 << 24), b""))
        assert commas >= t * SIDE * SIDE - 1, commas
        return seconds
    return time.perf_counter() - began


def measure(refs: Path, work: Path, row: str, t: int, ahead: bool, log: Path) -> tuple:
    """One read from a fresh mount: seconds, requests, unused read-ahead bytes."""
    mnt = work / "mnt"
    mnt.mkdir(exist_ok=True)
    args = ["--xattrs"] + ([] if ahead else ["--no-grid-read-ahead"])
    if row.startswith("ncdump"):
        args.append("--decode")
    mounted = Mounted(refs, mnt, args, work / "refmount.log")
    try:
        before = requests(log)
        seconds = read_through(mnt, row, t)
        time.sleep(0.5)  # read-ahead still in flight lands in the counts
        stats = json.loads(os.getxattr(mnt, "user.refmount.stats"))
        unused = stats.get("grid_readahead_unused", 0)
        return seconds, requests(log) - before, unused
    finally:
        mounted.stop()


def local_ncdump(refs: Path, work: Path, t: int) -> float:
    """ncdump over the decoded tree copied to /dev/shm: the reader's own time."""
    mnt = work / "mnt"
    mnt.mkdir(exist_ok=True)
    copy = Path(tempfile.mkdtemp(prefix="grid-walk-", dir="/dev/shm"))
    try:
        mounted = Mounted(refs, mnt, ["--decode"], work / "refmount.log")
        try:
            shutil.copytree(mnt, copy / "tree")
        finally:
            mounted.stop()
        return read_through(copy / "tree", "ncdump", t)
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--t", type=int, default=600, help="chunks (objects) along time")
    parser.add_argument("--delay", type=float, default=0.01, help="nginx delay per request")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--rows", nargs="+", default=["cat", "cat16", "series", "ncdump"])
    parser.add_argument("--without", action="store_true", help="rows without read-ahead too")
    parser.add_argument("--workdir", type=Path, help="(default: a temporary directory)")
    args = parser.parse_args()
    t = args.t
    work = Path(tempfile.mkdtemp(prefix="grid-walk-", dir=args.workdir))
    try:
        www = work / "www"
        build(www, t)
        log = work / "access.log"
        mb = t * CHUNK / 1e6
        print(f"v: ({t}, {SIDE}, {SIDE}) float32, chunk (1, {SIDE}, {SIDE}), one object per "
              f"chunk, {mb:.0f} MB; nginx +{args.delay * 1000:g} ms")  # fmt: skip
        with NginxServer(www, delay=args.delay, wire_log=log) as server:
            refs = work / "refs.json"
            refs.write_text(json.dumps(refs_of(server.url, t)))
            best = min(limit(server.url, t) for _ in range(args.repeat))
            print("| row | seconds | MB/s | x limit | requests | unused read-ahead MB | load |")
            print("|---|---|---|---|---|---|---|")
            print(f"| limit (obstore, {PARALLEL} in flight) | {best:.2f} | {mb / best:.0f} "
                  f"| 1.00 | {t} | - | {load()} |")  # fmt: skip
            for row in args.rows:
                for ahead in (True, False) if args.without else (True,):
                    runs = [measure(refs, work, row, t, ahead, log) for _ in range(args.repeat)]
                    seconds, count, unused = min(runs)
                    name = row if ahead else f"{row}, --no-grid-read-ahead"
                    # The time series reads 16 KiB of each chunk: compared by time with
                    # the limit's whole chunks; the others by rate.
                    ratio = best / seconds
                    rate = mb / seconds if row != "series" else t * POINT / 1e6 / seconds
                    print(f"| {name} | {seconds:.2f} | {rate:.0f} | {ratio:.2f} | {count} "
                          f"| {unused / 1e6:.1f} | {load()} |")  # fmt: skip
            if "ncdump" in args.rows:
                local = local_ncdump(refs, work, t)
                print(f"| ncdump over a copy on /dev/shm (no FUSE) | {local:.2f} | - | - | - | - "
                      f"| {load()} |")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""The daemon's CPU per request: one workload through fresh mounts, CPU seconds counted.

    python bench/request_cost.py [--workload W3] [--rounds 3] [--cpus 0] [--profile OUT]
                                 [--pyfuse3 DIR] [--stock] [--env NAME=VALUE ...]

``bench/throughput.py`` compares refmount with its peers; this script measures what one
change to the daemon does to the CPU a request costs, which on a shared machine is far
steadier than a rate.  It reuses ``throughput.py``'s data (``--workdir``), serves it with
nginx on 127.0.0.1 (``--delay`` per request), and for each round mounts afresh and runs
one workload:

- ``W3``: ``--readers`` ``cat`` processes, each over ``--files`` chunk files (256 KiB
  each, back to back in one remote file); every chunk is read once in the round (a
  random permutation), so every READ misses the cache;
- ``W2``: one ``cat`` of every chunk file in key order;
- ``W1``: ``dd bs=1M`` of the 512 MiB file.

It prints, per round, the rate, the daemon's CPU seconds (user + system of every thread,
from ``/proc``), CPU per chunk and per GB, and the in-process limit (fsspec, one GET per
chunk, ``--readers`` in flight) once.  ``--cpus`` pins the daemon with ``taskset``;
``--pyfuse3 DIR`` puts a pyfuse3 build (``pip install --target DIR ...``) first on the
daemon's path; ``--stock`` hides refmount's patch as ``throughput.py``'s refmount.stock
does; ``--env`` sets variables for the daemon (``REFMOUNT_REQUEST_TIMING=500`` logs where
a READ's time goes, see ``refmount/request_timing.py``); ``--profile OUT`` records the
daemon during the workload with ``py-spy record --native --threads --gil`` (raw
collapsed stacks, for ``flamegraph.pl`` or ``sort``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.throughput import CHUNK, Sizes, data_dir, tree_cpu_split, write_chunk_refs  # noqa: E402
from tests.support.mounting import REFMOUNT, STOCK_PYFUSE3, Mounted  # noqa: E402
from tests.support.nginx import NginxServer  # noqa: E402
from tests.support.servers import stop_process  # noqa: E402

RUN_TIMEOUT = 900.0


def reader_lists(keys: list[str], readers: int, files: int, seed: int) -> list[list[str]]:
    """``readers`` lists of ``files`` distinct chunk keys each, no key in two lists."""
    if readers * files > len(keys):
        raise SystemExit(f"--readers x --files is more than the {len(keys)} chunks")
    picked = random.Random(seed).sample(keys, readers * files)
    return [picked[n * files : (n + 1) * files] for n in range(readers)]


def run_workload(workload: str, root: Path, keys: list[str], lists: list[list[str]]) -> None:
    if workload == "W1":
        argv = ["dd", f"if={root / 'big'}", "of=/dev/null", "bs=1M"]
        subprocess.run(argv, check=True, capture_output=True, timeout=RUN_TIMEOUT)
    elif workload == "W2":
        subprocess.run(["cat", *keys], cwd=root, stdout=subprocess.DEVNULL, check=True,
                       timeout=RUN_TIMEOUT)  # fmt: skip
    else:
        procs = [
            subprocess.Popen(["cat", *files], cwd=root, stdout=subprocess.DEVNULL)
            for files in lists
        ]
        try:
            codes = [p.wait(RUN_TIMEOUT) for p in procs]
        finally:
            for p in procs:
                stop_process(p)
        if any(codes):
            raise RuntimeError(f"cat exited with {codes}")


def limit(url: str, lists: list[list[str]]) -> float:
    """MB/s of fsspec's HTTP filesystem in-process, one GET per chunk, one per reader in
    flight: what one GET per chunk allows, with no daemon in between."""
    import asyncio

    import fsspec
    import fsspec.asyn

    fs = fsspec.filesystem("http", skip_instance_cache=True)
    starts = [int(key[2:]) * CHUNK for files in lists for key in files]

    async def fetch_all() -> int:
        gate = asyncio.Semaphore(len(lists))

        async def one(start: int) -> int:
            async with gate:
                data = await fs._cat_file(f"{url}/chunks.bin", start=start, end=start + CHUNK)
                return len(data)

        return sum(await asyncio.gather(*(one(s) for s in starts)))

    began = time.perf_counter()
    got = fsspec.asyn.sync(fsspec.asyn.get_loop(), fetch_all)
    assert got == len(starts) * CHUNK, got
    return got / (time.perf_counter() - began) / 1e6


@contextlib.contextmanager
def profiled(pid: int, out: str | None) -> Iterator[None]:
    if out is None:
        yield
        return
    argv = [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid),
            "--rate", "500", "--native", "--threads", "--gil", "--format", "raw",
            "-o", out]  # fmt: skip
    spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached
    try:
        yield
    finally:
        spy.send_signal(2)  # py-spy writes its output on SIGINT
        spy.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=("W1", "W2", "W3"), default="W3")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--readers", type=int, default=16)
    parser.add_argument("--files", type=int, default=250, help="chunk files per W3 reader")
    parser.add_argument("--delay", type=float, default=0.01)
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "refmount-bench"))
    parser.add_argument("--cpus", help="taskset CPU list for the daemon, e.g. 0 or 0,1")
    parser.add_argument("--pyfuse3", help="a directory with a pyfuse3 build, first on the path")
    parser.add_argument("--stock", action="store_true", help="hide refmount's pyfuse3 patch")
    parser.add_argument("--env", nargs="*", default=[], help="NAME=VALUE for the daemon")
    parser.add_argument("--refmount-args", default="--cache-size 512M")
    parser.add_argument("--profile", help="py-spy raw output file (the last round's)")
    args = parser.parse_args()

    sizes = Sizes.pick(quick=False)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    data = data_dir(work, sizes)
    for item in args.env:
        name, _, value = item.partition("=")
        os.environ[name] = value
    if args.pyfuse3:
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(Path(args.pyfuse3).resolve()), os.environ.get("PYTHONPATH")])
        )
    prefix = ["taskset", "-c", args.cpus] if args.cpus else []
    command = STOCK_PYFUSE3 if args.stock else REFMOUNT
    with NginxServer(data, delay=args.delay) as server:
        refs = work / "request-cost-refs.json"
        _, keys = write_chunk_refs(refs, server.url, sizes)
        chunks = {"W1": 0, "W2": len(keys), "W3": args.readers * args.files}[args.workload]
        total = sizes.big if args.workload == "W1" else chunks * CHUNK
        if args.workload == "W3":
            peak = limit(server.url, reader_lists(keys, args.readers, args.files, 0))
            print(f"limit (one GET per chunk, in-process): {peak:.0f} MB/s")
        for n in range(args.rounds):
            lists = reader_lists(keys, args.readers, args.files, n + 1)
            mountpoint = Path(tempfile.mkdtemp(prefix="mnt-cost-", dir=work))
            log = work / f"request-cost-{n}.log"
            try:
                with Mounted(refs, mountpoint, args.refmount_args.split(), log, prefix=prefix,
                             command=command, timeout=120) as mounted:  # fmt: skip
                    last = n == args.rounds - 1
                    with profiled(mounted.pid, args.profile if last else None):
                        user, system = tree_cpu_split(mounted.pid)
                        began = time.perf_counter()
                        run_workload(args.workload, mountpoint, keys, lists)
                        seconds = time.perf_counter() - began
                        after = tree_cpu_split(mounted.pid)
                        user, system = after[0] - user, after[1] - system
                        cpu = user + system
            finally:
                mountpoint.rmdir()
            per_chunk = f", {cpu / chunks * 1000:.3f} ms/chunk" if chunks else ""
            shown = f"{cpu:.2f} s, {system / cpu:.0%} system"
            print(f"{args.workload} round {n + 1}: {total / seconds / 1e6:.0f} MB/s, daemon CPU "
                  f"{shown} ({cpu / (total / 1e9):.2f} s/GB{per_chunk})", flush=True)  # fmt: skip
            timing = [line for line in log.read_text().splitlines() if "READs in" in line]
            for line in timing[-2:]:
                print("  " + line.split(" ", 3)[-1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

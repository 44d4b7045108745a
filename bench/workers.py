"""The cost of decoding in worker processes: the same chunks decoded by the decode job
in threads of this process and in the daemon's worker pool (started beforehand, as at a
mount), with the wall time and the CPU time of this process and its workers.

    .venv/bin/python bench/workers.py [--chunks 144] [--side 200] [--workers 2]

Each chunk is ``--side`` squared float32 values compressed with zlib (level 4, as
``bench/readers.py``'s), decoded ``--rounds`` times.  The decoded bytes are checked.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from refmount.decode.arrays import parse_zarray
from refmount.workers import InProcessRunner, JobRunner, PoolConfig, WorkerPool


def children_cpu(pids: list[int]) -> float:
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def decode_all(runner: JobRunner, spec: dict, chunks: list[bytes], size: int) -> None:
    limit = trio.CapacityLimiter(8)  # reads in flight, as the kernel's read-ahead has

    async def one(raw: bytes, expected: bytes) -> None:
        async with limit:
            out = await runner.submit("decode", spec, raw, size)
        assert bytes(out) == expected

    async with trio.open_nursery() as nursery:
        for raw, expected in chunks:
            nursery.start_soon(one, raw, expected)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=144)
    parser.add_argument("--side", type=int, default=200)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    shape = [args.side, args.side]
    meta = {"zarr_format": 2, "shape": shape, "chunks": shape, "dtype": "<f4",
            "compressor": {"id": "zlib", "level": 4}, "filters": None, "fill_value": 0,
            "order": "C"}  # fmt: skip
    decoder = parse_zarray(json.dumps(meta).encode()).decoder
    rng = np.random.default_rng(0)
    chunks = []
    for _ in range(args.chunks):
        values = np.cumsum(rng.normal(size=shape), axis=1).astype("<f4").tobytes()
        chunks.append((zlib.compress(values, 4), values))
    gb = args.chunks * decoder.size * args.rounds / 1e9
    print(f"{args.chunks} chunks of {decoder.size / 2**20:.2f} MiB (zlib), x{args.rounds}; "
          f"{args.workers} workers or threads; {os.cpu_count()} CPUs")  # fmt: skip
    print("| decoding in | wall s | MB/s | CPU s/GB (this process + workers) |")
    print("|---|---:|---:|---:|")

    async def run(runner: JobRunner, name: str, pids: list[int]) -> None:
        cpu0, wall0 = own_cpu() + children_cpu(pids), time.perf_counter()
        for _ in range(args.rounds):
            await decode_all(runner, decoder.spec, chunks, decoder.size)
        wall = time.perf_counter() - wall0
        cpu = own_cpu() + children_cpu(pids) - cpu0
        print(f"| {name} | {wall:.2f} | {gb * 1000 / wall:.0f} | {cpu / gb:.2f} |")

    async def both() -> None:
        await run(InProcessRunner(args.workers), "threads (InProcessRunner)", [])
        pool = WorkerPool(PoolConfig(args.workers))
        try:
            await pool.warm_up()
            await run(pool, "worker processes (WorkerPool)", pool.pids())
        finally:
            pool.close()

    trio.run(both)


if __name__ == "__main__":
    main()

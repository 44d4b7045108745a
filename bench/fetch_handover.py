"""What handing a read to a fetch worker costs, per 256 KiB chunk, in CPU of both processes.

    python bench/fetch_handover.py [--chunks 2000] [--in-flight 16] [--rounds 3]

Without FUSE: a :class:`~refmount.fetch.Fetcher` reads ``--chunks`` distinct 256 KiB
ranges of one file from nginx on 127.0.0.1 (no delay), ``--in-flight`` at once, first
with its backend in this process (obstore, as the daemon does with ``--fetch-workers
0``), then with one fetch worker (``--fetch-workers 1``), rounds interleaved.  It prints
the CPU seconds per chunk of this process (every thread) and of the worker, and their
sum: the hand-over costs the difference between the sums (the pipe's two copies, the
reply's framing, the worker's trio loop), and moves the rest out of this process.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import sys
import tempfile
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from refmount.fetch import Fetcher
from refmount.workers.fetching import FetchWorkers
from tests.support.nginx import NginxServer

CHUNK = 256 << 10
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def process_cpu(pid: int) -> float:
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


async def read_all(fetcher: Fetcher, url: str, chunks: int, in_flight: int) -> None:
    order = list(range(chunks))
    random.shuffle(order)
    limiter = trio.CapacityLimiter(in_flight)

    async def one(k: int) -> None:
        async with limiter:
            data = await fetcher.fetch(url, k * CHUNK, (k + 1) * CHUNK)
            assert len(data) == CHUNK

    async with trio.open_nursery() as nursery:
        for k in order:
            nursery.start_soon(one, k)


def round_in_process(url: str, chunks: int, in_flight: int) -> tuple[float, float]:
    fetcher = Fetcher()

    async def main() -> float:
        await read_all(fetcher, url, 16, in_flight)  # the backend made, the pool warm
        before = own_cpu()
        await read_all(fetcher, url, chunks, in_flight)
        return own_cpu() - before

    try:
        return trio.run(main), 0.0
    finally:
        fetcher.close()


def round_in_worker(url: str, chunks: int, in_flight: int) -> tuple[float, float]:
    workers = FetchWorkers(1, per_worker=32)
    fetcher = Fetcher()
    fetcher.make_remote = workers.backend

    async def main() -> tuple[float, float]:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(workers.run)
            await read_all(fetcher, url, 16, in_flight)
            (pid,) = workers.pids()
            before, worker_before = own_cpu(), process_cpu(pid)
            await read_all(fetcher, url, chunks, in_flight)
            spent = own_cpu() - before, process_cpu(pid) - worker_before
            nursery.cancel_scope.cancel()
        return spent

    return trio.run(main)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        (Path(root) / "data.bin").write_bytes(os.urandom(args.chunks * CHUNK))
        with NginxServer(Path(root)) as server:
            url = f"{server.url}/data.bin"
            spent: dict[str, list[tuple[float, float]]] = {"in-process": [], "worker": []}
            for _ in range(args.rounds):
                spent["in-process"].append(round_in_process(url, args.chunks, args.in_flight))
                spent["worker"].append(round_in_worker(url, args.chunks, args.in_flight))
    print(f"{args.chunks} chunks of 256 KiB, {args.in_flight} in flight, {args.rounds} rounds")
    print("ms of CPU per chunk (median): this process / the worker / both")
    for name, rounds in spent.items():
        here = statistics.median(a for a, _ in rounds) / args.chunks * 1000
        there = statistics.median(b for _, b in rounds) / args.chunks * 1000
        both = statistics.median(a + b for a, b in rounds) / args.chunks * 1000
        print(f"  {name:<10}  {here:.3f} / {there:.3f} / {both:.3f}")


if __name__ == "__main__":
    main()

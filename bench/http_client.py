"""What one cold 256 KiB chunk costs each HTTP client refmount can read it with, in-process.

    python bench/http_client.py [--chunks 2000] [--parallel 16] [--delay 0.01] [--repeat 2]
                                [--protocol http|https]

nginx on 127.0.0.1 (``echo_sleep`` before each answer) serves one file of 4,000 chunks;
each client reads ``--chunks`` distinct random chunks of it, ``--parallel`` at once, with
the page cache dropped first (as root), and the table gives MB/s and the process's CPU
(user + system, every thread) per chunk, medians of the rounds:

  obstore.async   ``obstore.get_range_async`` on an asyncio loop (the bench's W3d limit)
  obstore.threads ``obstore.get_range`` in worker threads (how refmount's obstore
                  backend reads, from trio's worker threads)
  refmount.http   refmount's Fetcher on trio with its own HTTP/1.1 client
                  (``refmount.fetch.http``): deadlines, retries and length checks included
  refmount.obstore the same Fetcher with ``--fetch-backend obstore``

``--protocol https``: the same over nginx's TLS (a certificate of a CA made for the run,
given to obstore as ``root_certificate`` and to refmount through ``SSL_CERT_FILE``).

No FUSE: this isolates the fetch; ``bench/throughput.py`` measures it through a mount.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.throughput import drop_caches, write_random  # noqa: E402
from refmount.fetch import Fetcher, FetchPolicy  # noqa: E402
from tests.support.certificates import make_certificates  # noqa: E402
from tests.support.nginx import NginxServer  # noqa: E402

CHUNK = 256 << 10
FILE_CHUNKS = 4000


def cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def client_options() -> dict[str, object]:
    """obstore's client options: plain HTTP allowed, the run's CA trusted (if any)."""
    options: dict[str, object] = {"allow_http": True}
    if ca := os.environ.get("SSL_CERT_FILE"):
        options["root_certificate"] = Path(ca).read_text()
    return options


def obstore_async(url: str, starts: list[int], parallel: int) -> int:
    import obstore
    from obstore.store import HTTPStore

    store = HTTPStore.from_url(url, client_options=client_options())

    async def main() -> int:
        gate = asyncio.Semaphore(parallel)

        async def one(start: int) -> int:
            async with gate:
                data = await obstore.get_range_async(store, "chunks.bin", start=start, length=CHUNK)
                return len(data)

        return sum(await asyncio.gather(*(one(s) for s in starts)))

    return asyncio.run(main())


def obstore_threads(url: str, starts: list[int], parallel: int) -> int:
    import obstore
    from obstore.store import HTTPStore

    store = HTTPStore.from_url(url, client_options=client_options())

    def one(start: int) -> int:
        return len(obstore.get_range(store, "chunks.bin", start=start, length=CHUNK))

    with ThreadPoolExecutor(parallel) as pool:
        return sum(pool.map(one, starts))


def refmount_fetcher(backend: str) -> Callable[[str, list[int], int], int]:
    def run(url: str, starts: list[int], parallel: int) -> int:
        fetcher = Fetcher(policy=FetchPolicy(max_requests_per_host=parallel), backend=backend)
        total = 0

        async def main() -> None:
            limiter = trio.CapacityLimiter(parallel)

            async def one(start: int) -> None:
                nonlocal total
                async with limiter:
                    data = await fetcher.fetch(f"{url}/chunks.bin", start, start + CHUNK)
                total += len(data)

            async with trio.open_nursery() as nursery:
                for start in starts:
                    nursery.start_soon(one, start)

        trio.run(main)
        fetcher.close()
        return total

    return run


CLIENTS: dict[str, Callable[[str, list[int], int], int]] = {
    "obstore.async": obstore_async,
    "obstore.threads": obstore_threads,
    "refmount.http": refmount_fetcher("auto"),
    "refmount.obstore": refmount_fetcher("obstore"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--delay", type=float, default=0.01, help="seconds per request")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--protocol", choices=("http", "https"), default="http")
    parser.add_argument(
        "--workdir", default=str(Path(tempfile.gettempdir()) / "refmount-bench-http")
    )
    args = parser.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    write_random(work / "chunks.bin", FILE_CHUNKS * CHUNK, 2)
    picked = random.Random(3).sample(range(FILE_CHUNKS), min(args.chunks, FILE_CHUNKS))
    starts = [i * CHUNK for i in picked]
    rates: dict[str, list[float]] = {name: [] for name in CLIENTS}
    costs: dict[str, list[float]] = {name: [] for name in CLIENTS}
    certificates = None
    if args.protocol == "https":
        certificates = make_certificates(work / "tls", "refmount bench CA")
        os.environ["SSL_CERT_FILE"] = str(certificates.ca)
    with NginxServer(work, delay=args.delay, tls=certificates) as server:
        url = server.https_url if certificates else server.url
        for round_ in range(args.repeat):
            for name, client in CLIENTS.items():
                drop_caches()
                began, cpu = time.perf_counter(), cpu_seconds()
                got = client(url, starts, args.parallel)
                seconds, used = time.perf_counter() - began, cpu_seconds() - cpu
                if got != len(starts) * CHUNK:
                    raise SystemExit(f"{name}: {got} bytes, not {len(starts) * CHUNK}")
                rates[name].append(got / seconds / 1e6)
                costs[name].append(used / len(starts) * 1e3)
                print(f"round {round_ + 1} {name:16} {rates[name][-1]:7.1f} MB/s "
                      f"{costs[name][-1]:.3f} ms CPU/chunk", flush=True)  # fmt: skip
    load = os.getloadavg()[0]
    print(
        f"\n{len(starts)} distinct {CHUNK >> 10} KiB chunks over {args.protocol}://, "
        f"{args.parallel} in flight, "
        f"nginx +{args.delay * 1000:g} ms, medians of {args.repeat}; load {load:.1f}\n"
    )
    print("| client | MB/s | CPU ms/chunk |\n|---|---|---|")
    for name in CLIENTS:
        print(f"| {name} | {statistics.median(rates[name]):.0f} | "
              f"{statistics.median(costs[name]):.3f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

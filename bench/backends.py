"""Remote byte ranges in-process, no FUSE: refmount's Fetcher over each backend, and the
raw clients under them, against the same nginx.

    python bench/backends.py [--delay 0.010] [--size-mib 512] [--range-mib 8]
                             [--in-flight 16] [--repeat 3] [--work DIR]

One file of ``--size-mib`` random bytes is served by nginx on 127.0.0.1
(``tests/support/nginx.py``; every request waits ``--delay`` seconds first, like an object
store's time to first byte) and read whole as ``--range-mib`` ranges, ``--in-flight`` at a
time, by each column:

  ================  ==============================================================
  fsspec            fsspec's HTTP filesystem (aiohttp), ``_cat_file`` on fsspec's loop
  obstore-async     ``obstore.get_range_async`` on an asyncio loop
  obstore-stream    ``obstore.get_async`` with the range, its stream gathered up to one
                    byte past the range (what refmount's obstore backend does, bounded)
  obstore-threads   ``obstore.get_range`` (sync, releases the GIL) in trio worker threads
  fetcher-fsspec    refmount's Fetcher, ``backend="fsspec"``, from trio
  fetcher-obstore   refmount's Fetcher, ``backend="auto"`` (obstore), from trio
  ================  ==============================================================

Each column runs in a fresh child process (its imports, threads and pools its own), after
one small warm-up read; it reports MB/s (bytes over wall time) and the CPU seconds the
whole child process used per GiB read (user + system, every thread: Python's and the
clients' own).  nginx's CPU is not counted.  Medians of ``--repeat`` rounds, columns
interleaved within each round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.nginx import NginxServer  # noqa: E402

COLUMNS = (
    "fsspec",
    "obstore-async",
    "obstore-stream",
    "obstore-threads",
    "fetcher-fsspec",
    "fetcher-obstore",
)
MiB = 1 << 20


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def spans(size: int, step: int) -> list[tuple[int, int]]:
    return [(start, min(start + step, size)) for start in range(0, size, step)]


# -- the columns, each run in a child process --------------------------------------------


def run_fsspec(url: str, ranges: list[tuple[int, int]], in_flight: int) -> Callable[[], int]:
    import fsspec
    import fsspec.asyn

    fs = fsspec.filesystem("http")
    loop = fsspec.asyn.get_loop()

    async def read_all() -> int:
        gate = asyncio.Semaphore(in_flight)

        async def one(start: int, end: int) -> int:
            async with gate:
                return len(await fs._cat_file(url, start=start, end=end))

        return sum(await asyncio.gather(*(one(s, e) for s, e in ranges)))

    asyncio.run_coroutine_threadsafe(fs._cat_file(url, start=0, end=1), loop).result()
    return lambda: asyncio.run_coroutine_threadsafe(read_all(), loop).result()


def run_obstore_async(streamed: bool) -> Callable[..., Callable[[], int]]:
    def column(url: str, ranges: list[tuple[int, int]], in_flight: int) -> Callable[[], int]:
        import obstore
        from obstore.store import HTTPStore

        base, _, path = url.rpartition("/")
        store = HTTPStore.from_url(base, client_options={"allow_http": True})

        async def get(start: int, end: int) -> int:
            if not streamed:
                return len(await obstore.get_range_async(store, path, start=start, end=end))
            result = await obstore.get_async(store, path, options={"range": (start, end)})
            return sum([len(p) async for p in result.stream(min_chunk_size=end - start + 1)])

        async def read_all() -> int:
            gate = asyncio.Semaphore(in_flight)

            async def one(start: int, end: int) -> int:
                async with gate:
                    return await get(start, end)

            return sum(await asyncio.gather(*(one(s, e) for s, e in ranges)))

        obstore.get_range(store, path, start=0, end=1)
        return lambda: asyncio.run(read_all())

    return column


def run_obstore_threads(
    url: str, ranges: list[tuple[int, int]], in_flight: int
) -> Callable[[], int]:
    import obstore
    import trio
    from obstore.store import HTTPStore

    base, _, path = url.rpartition("/")
    store = HTTPStore.from_url(base, client_options={"allow_http": True})
    limiter = trio.CapacityLimiter(in_flight)

    async def read_all() -> int:
        got = [0]

        async def one(start: int, end: int) -> None:
            data = await trio.to_thread.run_sync(
                lambda: obstore.get_range(store, path, start=start, end=end), limiter=limiter
            )
            got[0] += len(data)

        async with trio.open_nursery() as nursery:
            for start, end in ranges:
                nursery.start_soon(one, start, end)
        return got[0]

    obstore.get_range(store, path, start=0, end=1)
    return lambda: trio.run(read_all)


def run_fetcher(backend: str) -> Callable[..., Callable[[], int]]:
    def column(url: str, ranges: list[tuple[int, int]], in_flight: int) -> Callable[[], int]:
        import trio

        from refmount.fetch import Fetcher, FetchPolicy

        fetcher = Fetcher(policy=FetchPolicy(timeout=120), backend=backend)

        async def read_all() -> int:
            limiter = trio.CapacityLimiter(in_flight)
            got = [0]

            async def one(start: int, end: int) -> None:
                async with limiter:
                    data = await fetcher.fetch(url, start, end)
                got[0] += len(data)

            async with trio.open_nursery() as nursery:
                for start, end in ranges:
                    nursery.start_soon(one, start, end)
            return got[0]

        trio.run(fetcher.fetch, url, 0, 1)  # the backend, its imports and session
        return lambda: trio.run(read_all)

    return column


RUNNERS: dict[str, Callable[..., Callable[[], int]]] = {
    "fsspec": run_fsspec,
    "obstore-async": run_obstore_async(streamed=False),
    "obstore-stream": run_obstore_async(streamed=True),
    "obstore-threads": run_obstore_threads,
    "fetcher-fsspec": run_fetcher("fsspec"),
    "fetcher-obstore": run_fetcher("auto"),
}


def child(column: str, url: str, size: int, step: int, in_flight: int) -> None:
    """One column in this process: print its figures as JSON."""
    read = RUNNERS[column](url, spans(size, step), in_flight)
    cpu, wall = cpu_seconds(), time.perf_counter()
    result = read()
    cpu, wall = cpu_seconds() - cpu, time.perf_counter() - wall
    if result != size:
        raise SystemExit(f"{column}: read {result} bytes of {size}")
    print(json.dumps({"column": column, "wall": wall, "cpu": cpu, "bytes": result}))
    sys.stdout.flush()
    time.sleep(0.5)  # let obstore's runtime threads settle before the interpreter exits


# -- the parent ---------------------------------------------------------------------------


def make_data(work: Path, size: int) -> Path:
    path = work / f"data-{size}.bin"
    if not path.exists() or path.stat().st_size != size:
        with open(path, "wb") as f:
            for _ in range(size // MiB):
                f.write(os.urandom(MiB))
            f.write(os.urandom(size % MiB))
    return path


def run_column(column: str, url: str, args: argparse.Namespace) -> dict[str, float]:
    argv = [sys.executable, __file__, "--child", column, "--url", url]
    argv += ["--size-mib", str(args.size_mib), "--range-mib", str(args.range_mib)]
    argv += ["--in-flight", str(args.in_flight)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{column} failed ({done.returncode}): {done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay", type=float, default=0.010, help="nginx seconds per request")
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--range-mib", type=int, default=8)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported")
    parser.add_argument("--columns", nargs="*", default=list(COLUMNS), choices=COLUMNS)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "refmount-bench")
    parser.add_argument("--child", choices=COLUMNS, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    size, step = args.size_mib * MiB, args.range_mib * MiB
    if args.child:
        child(args.child, args.url, size, step, args.in_flight)
        return 0

    args.work.mkdir(parents=True, exist_ok=True)
    data = make_data(args.work, size)
    rows: dict[str, list[dict[str, float]]] = {c: [] for c in args.columns}
    with NginxServer(args.work, delay=args.delay) as nginx:
        url = f"{nginx.url}/{data.name}"
        for _ in range(args.repeat):
            for column in args.columns:
                rows[column].append(run_column(column, url, args))
    print(
        f"{args.size_mib} MiB as {args.range_mib} MiB ranges, {args.in_flight} in flight, "
        f"nginx on 127.0.0.1 with {args.delay * 1000:g} ms per request; "
        f"medians of {args.repeat}, {os.cpu_count()} cores"
    )
    print(f"{'column':<18}{'MB/s':>8}{'CPU s/GiB':>11}   runs (MB/s)")
    for column, runs in rows.items():
        rates = [r["bytes"] / r["wall"] / 1e6 for r in runs]
        per_gib = [r["cpu"] / (r["bytes"] / (1 << 30)) for r in runs]
        shown = " ".join(f"{rate:.0f}" for rate in rates)
        rate, cpu = statistics.median(rates), statistics.median(per_gib)
        print(f"{column:<18}{rate:>8.0f}{cpu:>11.2f}   {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

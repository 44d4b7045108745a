"""The disk cache (issue 16): cold, warm in the same mount, and warm after a remount,
with and without ``--disk-cache``, next to ``rclone mount --vfs-cache-mode full``.

    python bench/disk_cache.py [--chunks 2000] [--delay 0.01] [--readers 16] [--per-reader 64]

Data: one remote file of ``--chunks`` x 256 KiB chunks served by nginx on 127.0.0.1
(``--delay`` seconds before each answer, like an object store's time to first byte; with
autoindex, which rclone's http remote lists).  The reference set has one key per chunk.

Workloads (as in ``bench/throughput.py``): **W2** one ``cat`` of every chunk key in key
order; **W3** ``--readers`` processes, each reading ``--per-reader`` random chunks.  For
rclone, which mounts the remote file itself, W2 is ``cat`` of that file and W3 reads
the same chunks' byte ranges of it; the readers are the same program (one ``pread`` per
chunk) for every system, so the figures compare the mounts.

Phases, each timed: **cold** (a fresh mount, an empty disk cache), **warm** (the same
workload again on that mount), **remount** (a new mount; the disk cache directory
kept).  Without ``--disk-cache`` a remount is cold again; that row is the baseline the
disk cache is for.  Beside each rate: the daemon's CPU time (user + system, from
``/proc``) per chunk read.  The disk cache files stay in the host's page cache between
mounts (nothing here drops caches: the machine is shared), for rclone as for refmount.

Prints a table and writes ``bench/out/disk_cache.json``.

``--hit-cost`` measures instead what a disk hit costs without FUSE, the network or a
mount: ``--chunks`` whole units written to a cache directory, then read back as parts of
1 and of 32 units (a random chunk; a block of read-ahead) through
``DiskCache.read_part``, every part kept (as the memory cache keeps it, so each lands in
fresh memory): CPU milliseconds per 256 KiB unit, and what its pieces cost apart.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.mounting import Mounted, unmount  # noqa: E402
from tests.support.nginx import NginxServer  # noqa: E402
from tests.support.servers import stop_process  # noqa: E402

log = logging.getLogger("bench.disk_cache")

CHUNK = 256 << 10
MOUNT_TIMEOUT = 120.0
RUN_TIMEOUT = 900.0
PHASES = ("cold", "warm", "remount")
# One process per reader: reads (path, offset) pairs of one chunk each, checks lengths.
READER = """
import os, sys
want = int(sys.argv[1])
for line in sys.stdin:
    path, offset = line.rsplit(" ", 1)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = len(os.pread(fd, want, int(offset)))
    finally:
        os.close(fd)
    if got != want:
        sys.exit(f"{path}@{offset}: {got} bytes, not {want}")
"""


def write_data(root: Path, chunks: int) -> Path:
    path = root / "chunks.bin"
    if not (path.exists() and path.stat().st_size == chunks * CHUNK):
        rng = random.Random(2)
        with open(path, "wb") as out:
            for _ in range(chunks):
                out.write(rng.randbytes(CHUNK))
    return path


def write_refs(work: Path, url: str, chunks: int) -> tuple[Path, list[str]]:
    keys = [f"c/{k:05d}" for k in range(chunks)]
    refs = {key: [f"{url}/chunks.bin", k * CHUNK, CHUNK] for k, key in enumerate(keys)}
    path = work / "refs.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path, keys


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_w2(mnt: Path, system: str, keys: list[str]) -> int:
    if system == "rclone":
        subprocess.run(["cat", str(mnt / "chunks.bin")], stdout=subprocess.DEVNULL, check=True,
                       timeout=RUN_TIMEOUT)  # fmt: skip
    else:
        subprocess.run(["cat", *keys], cwd=mnt, stdout=subprocess.DEVNULL, check=True,
                       timeout=RUN_TIMEOUT)  # fmt: skip
    return len(keys)


def run_w3(mnt: Path, system: str, lists: list[list[int]]) -> int:
    procs = []
    for chunks in lists:
        if system == "rclone":
            lines = [f"{mnt / 'chunks.bin'} {k * CHUNK}" for k in chunks]
        else:
            lines = [f"{mnt / 'c' / f'{k:05d}'} 0" for k in chunks]
        proc = subprocess.Popen([sys.executable, "-c", READER, str(CHUNK)], stdin=subprocess.PIPE)
        assert proc.stdin is not None
        proc.stdin.write("\n".join(lines).encode() + b"\n")
        proc.stdin.close()
        procs.append(proc)
    try:
        codes = [p.wait(RUN_TIMEOUT) for p in procs]
    finally:
        for p in procs:
            stop_process(p)
    if any(codes):
        raise RuntimeError(f"readers exited with {codes}")
    return sum(len(c) for c in lists)


@contextlib.contextmanager
def refmount(refs: Path, mnt: Path, args: list[str], logfile: Path) -> Iterator[int]:
    with Mounted(refs, mnt, args, logfile, timeout=MOUNT_TIMEOUT) as mounted:
        yield mounted.pid


@contextlib.contextmanager
def rclone(url: str, mnt: Path, cache_dir: Path, logfile: Path) -> Iterator[int]:
    argv = [
        "rclone", "mount", ":http:", str(mnt), "--http-url", url, "--vfs-cache-mode", "full",
        "--cache-dir", str(cache_dir), "--read-only", "--dir-cache-time", "1h",
        "--vfs-cache-max-age", "24h", "--vfs-cache-max-size", "100G",
    ]  # fmt: skip
    with open(logfile, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not os.path.ismount(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"rclone did not mount (status {proc.poll()}), see {logfile}")
            time.sleep(0.05)
        os.listdir(mnt)
        yield proc.pid
    finally:
        unmount(mnt)
        stop_process(proc, grace=10.0)


def measure(
    system: str, workload: str, work: Path, server: NginxServer, refs: Path,
    keys: list[str], lists: list[list[int]],
) -> dict[str, dict[str, float]]:  # fmt: skip
    """The three phases of one workload for one system: MB/s and CPU ms per chunk."""
    cache = work / f"cache-{system}-{workload}"
    shutil.rmtree(cache, ignore_errors=True)
    out: dict[str, dict[str, float]] = {}
    for phase in PHASES:
        if phase == "warm":
            continue  # measured inside the cold mount, below
        mnt = Path(tempfile.mkdtemp(prefix="mnt-", dir=work))
        logfile = work / f"{system}-{workload}.log"
        if system == "rclone":
            mount = rclone(server.url, mnt, cache, logfile)
        else:
            args = ["--cache-size", "1G"]
            if system == "refmount+disk":
                args += ["--disk-cache", str(cache), "--disk-cache-size", "20G"]
            mount = refmount(refs, mnt, args, logfile)
        with mount as pid:
            rounds = ("cold", "warm") if phase == "cold" else ("remount",)
            for name in rounds:
                cpu0, t0 = cpu_seconds(pid), time.perf_counter()
                if workload == "W2":
                    count = run_w2(mnt, system, keys)
                else:
                    count = run_w3(mnt, system, lists)
                seconds = time.perf_counter() - t0
                cpu = cpu_seconds(pid) - cpu0
                out[name] = {
                    "mb_s": count * CHUNK / seconds / 1e6,
                    "cpu_ms_per_chunk": cpu / count * 1000,
                }
                log.info("%s %s %s: %.0f MB/s, %.3f ms CPU per chunk", system, workload, name,
                         out[name]["mb_s"], out[name]["cpu_ms_per_chunk"])  # fmt: skip
        mnt.rmdir()
    return out


def hit_cost(work: Path, units: int) -> None:
    """CPU per unit read from disk (see the module's docstring)."""
    import zlib

    import trio

    from refmount.cache.disk import DiskCache, DiskCacheConfig
    from refmount.cache.disk.entry import Entry, EntryKey

    root = work / "hit-cost-cache"
    shutil.rmtree(root, ignore_errors=True)
    disk = DiskCache(DiskCacheConfig(str(root), max_bytes=20 << 30))
    data = random.Random(1).randbytes(CHUNK)
    keys = [EntryKey("http://127.0.0.1/c", 'etag:"1"', i * CHUNK, CHUNK) for i in range(units)]
    for key in keys:
        temp, _ = disk.store.write_temp(key, Entry([(key.offset, key.end)], data))
        disk.store.place(temp, key.name)

    async def read(size: int) -> float:
        kept = []
        cpu0 = time.process_time()
        for first in range(0, units - size + 1, size):
            part = keys[first : first + size]
            wants = [(k.offset, k.end) for k in part]
            buffer, got = await disk.read_part(part, wants, part[0].offset, part[-1].end)
            if buffer is None or None in got:
                raise RuntimeError("a unit was not found")
            kept.append(buffer)
        return (time.process_time() - cpu0) / (len(kept) * size) * 1000

    def per_unit(work_of: Any, keep: bool) -> float:
        kept = []
        cpu0 = time.process_time()
        for i in range(units):
            out = work_of(i)
            if keep:
                kept.append(out)
        return (time.process_time() - cpu0) / units * 1000

    def read_in_place(i: int) -> int:
        fd = os.open(disk.store.path(keys[i].name), os.O_RDONLY)
        try:
            return os.preadv(fd, [scratch], 0)
        finally:
            os.close(fd)

    scratch = bytearray(CHUNK)
    for size in (1, 32):
        costs = [trio.run(read, size) for _ in range(3)]
        print(f"parts of {size:2d} units: " + ", ".join(f"{c:.3f}" for c in costs)
              + " ms CPU per 256 KiB unit (3 rounds)")  # fmt: skip
    fresh = per_unit(lambda i: bytearray(CHUNK), True)
    crc = per_unit(lambda i: zlib.crc32(scratch), False)
    read = per_unit(read_in_place, False)
    print(f"  of which fresh memory (bytearray kept) {fresh:.3f} ms, CRC-32 {crc:.3f} ms, "
          f"open + preadv + close into one reused buffer {read:.3f} ms")  # fmt: skip
    disk.close()
    shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--delay", type=float, default=0.01, help="seconds per request")
    parser.add_argument("--readers", type=int, default=16)
    parser.add_argument("--per-reader", type=int, default=64)
    parser.add_argument("--workdir", default=str(REPO / "bench" / "out" / "disk-cache-work"))
    parser.add_argument("--systems", nargs="+", default=["refmount", "refmount+disk", "rclone"])
    parser.add_argument("--workloads", nargs="+", default=["W2", "W3"])
    parser.add_argument("--hit-cost", action="store_true", help="CPU per unit read from disk")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    work = Path(args.workdir)
    if args.hit_cost:
        work.mkdir(parents=True, exist_ok=True)
        hit_cost(work, args.chunks)
        return
    (work / "www").mkdir(parents=True, exist_ok=True)
    write_data(work / "www", args.chunks)
    systems = list(args.systems)
    if "rclone" in systems and shutil.which("rclone") is None:
        log.warning("rclone skipped: not installed (apt-get install rclone)")
        systems.remove("rclone")
    rng = random.Random(3)
    lists = [[rng.randrange(args.chunks) for _ in range(args.per_reader)]
             for _ in range(args.readers)]  # fmt: skip
    figures: dict[str, Any] = {}
    with NginxServer(work / "www", delay=args.delay, autoindex=True) as server:
        refs, keys = write_refs(work, server.url, args.chunks)
        for system in systems:
            for workload in args.workloads:
                try:
                    figures.setdefault(system, {})[workload] = measure(
                        system, workload, work, server, refs, keys, lists
                    )
                except Exception as exc:
                    log.error("%s %s failed: %s", system, workload, exc)
                    figures.setdefault(system, {})[workload] = {"error": str(exc)[:300]}
    report = {
        "command": " ".join(["python", "bench/disk_cache.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "chunks": args.chunks,
        "delay": args.delay,
        "figures": figures,
        "load": os.getloadavg()[0],
    }
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "disk_cache.json").write_text(json.dumps(report, indent=2))
    print(table(report))


def table(report: dict[str, Any]) -> str:
    lines = [
        f"{report['command']}  ({report['date']}, {report['chunks']} x 256 KiB chunks, "
        f"{report['delay'] * 1000:g} ms per request, load {report['load']:.1f})",
        "",
        "| system | workload | cold MB/s | warm MB/s | remount MB/s | remount / cold "
        "| CPU ms/chunk cold, warm, remount |",
        "|---|---|---|---|---|---|---|",
    ]
    for system, workloads in report["figures"].items():
        for workload, phases in workloads.items():
            if "error" in phases:
                lines.append(f"| {system} | {workload} | failed: {phases['error']} |||||")
                continue
            rates = [phases[p]["mb_s"] for p in PHASES]
            cpus = ", ".join(f"{phases[p]['cpu_ms_per_chunk']:.2f}" for p in PHASES)
            lines.append(
                f"| {system} | {workload} | {rates[0]:.0f} | {rates[1]:.0f} | {rates[2]:.0f} "
                f"| {rates[2] / rates[0]:.1f}x | {cpus} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()

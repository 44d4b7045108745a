"""Throughput benchmark: refmount against fsspec, with a fixed latency per HTTP request.

    python bench/throughput.py [--delay 0.01] [--quick] [--repeat N] [--out bench/out]

Setup (once): the repository installed in a venv (``pip install -e .``); for the
fsspec.fuse peer also ``apt-get install libfuse2`` and ``pip install fusepy`` (fsspec.fuse
is built on them; without them that column is skipped, not failed).  No plotting library
is needed: the PNG is drawn by this script (see ``png_bar_chart``), so the benchmark runs
on a bare server and its numbers never depend on a plotting stack being installed.

What it does, in one run:

* builds the data (once per work directory and size) and serves it with
  ``tests/support/servers.RangeServer`` on 127.0.0.1, which honours ``Range`` and waits
  ``--delay`` seconds before answering each request;
* writes one JSON reference set: ``big`` -> all of ``big.bin`` (512 MiB), and
  ``c/00000`` ... ``c/03999`` -> 256 KiB chunks lying back to back in ``chunks.bin``;
* measures five systems side by side on four workloads:

  ============  ===============================================================
  limit         fsspec's HTTP filesystem in-process, the same parallelism as
                refmount: 8 requests of 8 MiB in flight for W1/W2/W4, 16 chunk
                requests in flight for W3 (results discarded).
  fsspec        ``fsspec.filesystem("reference", fo=refs)`` in-process:
                ``cat("big")``, ``cat(keys)`` in key order, 16 threads of
                ``cat_file`` for W3.
  fsspec.fuse   ``fsspec.fuse.run(fs, "", mountpoint, threads=True)`` in a
                subprocess, read with the same commands as refmount.
  refmount      ``refmount --cache-size 512M REFS MNT`` (daemonizes, returns
                when the mount answers), unmounted with ``fusermount3 -u``.
  tmpfs         W2 and W4 only: the same 4000 chunks as plain files in a
                directory on ``/dev/shm``, read by the same ``cat``: the
                yardstick for W4 (target: refmount at least 0.6 of it).
  ============  ===============================================================

  W1  ``dd if=MNT/big of=/dev/null bs=1M``: one 512 MiB reference.
  W2  ``cat c/00000 ... c/03999 > /dev/null``: one process, key order (1000 MiB).
  W3  16 parallel ``cat`` processes, each over its own random list of chunk files.
  W4  W2 again on the same mount (warm: page cache and refmount's cache).

  Every FUSE workload but W4 runs on a fresh mount, so neither the kernel's page cache
  nor a daemon's cache carries over.  MB/s are useful bytes over wall time.

* samples the refmount daemon's VmRSS every 20 ms and reads its VmHWM;
* prints a table and writes ``results.md``, ``results.json`` and ``throughput.png``
  into ``--out``.

Mounts are always unmounted in ``finally``; only processes this script started are
stopped, by their process id.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.servers import RangeServer, stop_process  # noqa: E402

log = logging.getLogger("bench")

MiB = 1 << 20
CHUNK = 256 << 10
PART = 8 << 20  # request size of the limit's sequential reads (refmount's max part)
SEQ_PARALLEL = 8  # 64 MiB window / 8 MiB parts
RANDOM_READERS = 16
SYSTEMS = ("limit", "fsspec", "fsspec.fuse", "refmount", "tmpfs")
TMPFS_ROOT = Path("/dev/shm")
WORKLOADS = ("W1", "W2", "W3", "W4")
TITLES = {
    "W1": "dd 512 MiB",
    "W2": "cat 4000 chunks",
    "W3": "16 random readers",
    "W4": "W2 warm",
}
MOUNT_TIMEOUT = 120.0
RUN_TIMEOUT = 900.0


@dataclass
class Sizes:
    big: int
    chunks: int
    random_files: int  # files read by each W3 reader

    @classmethod
    def pick(cls, quick: bool) -> Sizes:
        if quick:
            return cls(big=64 * MiB, chunks=400, random_files=16)
        return cls(big=512 * MiB, chunks=4000, random_files=64)


@dataclass
class Setup:
    sizes: Sizes
    data: Path
    refs_path: Path
    refs: dict[str, Any]
    url: str
    keys: list[str]
    random_lists: list[list[str]]
    work: Path
    budget: str


@dataclass
class Result:
    seconds: list[float] = field(default_factory=list)
    error: str | None = None

    def best(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None


# -- data -------------------------------------------------------------------------------


def write_random(path: Path, size: int, seed: int) -> None:
    """A file of ``size`` pseudo-random bytes, kept if it already has that size."""
    if path.exists() and path.stat().st_size == size:
        return
    rng = random.Random(seed)
    with open(path, "wb") as out:
        left = size
        while left:
            n = min(left, 8 * MiB)
            out.write(rng.randbytes(n))
            left -= n


def build(work: Path, sizes: Sizes, url: str, budget: str) -> Setup:
    data = work / f"data-{sizes.big}-{sizes.chunks}"
    data.mkdir(parents=True, exist_ok=True)
    write_random(data / "big.bin", sizes.big, 1)
    write_random(data / "chunks.bin", sizes.chunks * CHUNK, 2)
    keys = [f"c/{k:05d}" for k in range(sizes.chunks)]
    refs: dict[str, Any] = {"big": [f"{url}/big.bin", 0, sizes.big]}
    for k, key in enumerate(keys):
        refs[key] = [f"{url}/chunks.bin", k * CHUNK, CHUNK]
    refs_path = work / "refs.json"
    refs_path.write_text(json.dumps({"version": 1, "refs": refs}))
    rng = random.Random(3)
    random_lists = [
        [keys[rng.randrange(len(keys))] for _ in range(sizes.random_files)]
        for _ in range(RANDOM_READERS)
    ]
    return Setup(sizes, data, refs_path, refs, url, keys, random_lists, work, budget)


def workload_bytes(setup: Setup, workload: str) -> int:
    if workload == "W1":
        return setup.sizes.big
    if workload == "W3":
        return sum(len(files) for files in setup.random_lists) * CHUNK
    return setup.sizes.chunks * CHUNK


# -- in-process systems -----------------------------------------------------------------


def run_limit(setup: Setup, workload: str) -> float:
    """fsspec's HTTP filesystem with refmount's parallelism; bytes are counted, dropped."""
    import fsspec
    import fsspec.asyn

    fs = fsspec.filesystem("http")
    if workload == "W3":
        ranges = [
            (f"{setup.url}/chunks.bin", int(key[2:]) * CHUNK)
            for files in setup.random_lists
            for key in files
        ]
        parallel, size = RANDOM_READERS, CHUNK
    else:
        name, total = ("big.bin", setup.sizes.big) if workload == "W1" else ("chunks.bin", 0)
        total = total or setup.sizes.chunks * CHUNK
        ranges = [(f"{setup.url}/{name}", start) for start in range(0, total, PART)]
        parallel, size = SEQ_PARALLEL, PART

    async def fetch_all() -> int:
        gate = asyncio.Semaphore(parallel)

        async def one(url: str, start: int) -> int:
            async with gate:
                return len(await fs._cat_file(url, start=start, end=start + size))

        return sum(await asyncio.gather(*(one(url, start) for url, start in ranges)))

    began = time.perf_counter()
    got = fsspec.asyn.sync(fsspec.asyn.get_loop(), fetch_all)
    elapsed = time.perf_counter() - began
    check_size(got, workload_bytes(setup, workload))
    return elapsed


def run_fsspec(setup: Setup, workload: str) -> float:
    """fsspec's ReferenceFileSystem in-process, as a Python reader would use it."""
    import fsspec

    fs = fsspec.filesystem("reference", fo={"version": 1, "refs": setup.refs})
    began = time.perf_counter()
    if workload == "W1":
        got = len(fs.cat_file("big"))
    elif workload == "W3":

        def reader(files: list[str]) -> int:
            return sum(len(fs.cat_file(key)) for key in files)

        with ThreadPoolExecutor(RANDOM_READERS) as pool:
            got = sum(pool.map(reader, setup.random_lists))
    else:
        got = sum(len(v) for v in fs.cat(setup.keys).values())
    elapsed = time.perf_counter() - began
    check_size(got, workload_bytes(setup, workload))
    return elapsed


def check_size(got: int, want: int) -> None:
    if got != want:
        raise RuntimeError(f"read {got} bytes, expected {want}")


# -- mounts -----------------------------------------------------------------------------


def find_daemon(mountpoint: Path) -> int | None:
    """The pid of the refmount daemon serving ``mountpoint`` (ours: we chose the path)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(mountpoint).encode() in argv and any(b"refmount" in a for a in argv[:3]):
            return int(entry.name)
    return None


def wait_mounted(mountpoint: Path, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + MOUNT_TIMEOUT
    while time.monotonic() < deadline:
        if os.path.ismount(mountpoint):
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"mount process exited with status {proc.returncode}")
        time.sleep(0.05)
    raise RuntimeError(f"{mountpoint} was not mounted within {MOUNT_TIMEOUT:g} s")


def unmount(mountpoint: Path) -> None:
    if not os.path.ismount(mountpoint):
        return
    result = subprocess.run(["fusermount3", "-u", str(mountpoint)], capture_output=True)
    if result.returncode != 0:
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True)


class RssSampler:
    """Polls a process's resident memory; ``peak`` is the larger of samples and VmHWM."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_kb = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return
        for line in status.splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                self.peak_kb = max(self.peak_kb, int(line.split()[1]))

    def _loop(self) -> None:
        while not self._done.wait(0.02):
            self._read()

    def close(self) -> int:
        self._read()
        self._done.set()
        self._thread.join()
        return self.peak_kb


@contextmanager
def refmount_mount(setup: Setup, mountpoint: Path) -> Iterator[int | None]:
    exe = Path(sys.executable).with_name("refmount")
    argv = [str(exe) if exe.exists() else "refmount", "--cache-size", setup.budget]
    argv += ["--log-file", str(setup.work / "refmount.log"), str(setup.refs_path)]
    argv.append(str(mountpoint))
    try:
        result = subprocess.run(argv, capture_output=True, timeout=MOUNT_TIMEOUT)
        if result.returncode != 0:
            message = (result.stderr or result.stdout).decode(errors="replace").strip()
            raise RuntimeError(f"refmount failed ({result.returncode}): {message[-2000:]}")
        wait_mounted(mountpoint)
        yield find_daemon(mountpoint)
    finally:
        unmount(mountpoint)


# fsspec.fuse prefixes every path with root + "/", and reference keys have no leading "/":
# its root must be "" for keys to be found.
FSSPEC_FUSE = """
import sys, fsspec, fsspec.fuse

class Rootless(fsspec.fuse.FUSEr):
    def __init__(self, fs, path, ready_file=False):
        super().__init__(fs, path, ready_file)
        self.root = ""

fs = fsspec.filesystem("reference", fo=sys.argv[1])
fsspec.fuse.run(fs, "", sys.argv[2], foreground=True, threads=True, ops_class=Rootless)
"""


@contextmanager
def fsspec_fuse_mount(setup: Setup, mountpoint: Path) -> Iterator[int | None]:
    argv = [sys.executable, "-c", FSSPEC_FUSE, str(setup.refs_path), str(mountpoint)]
    logfile = open(setup.work / "fsspec-fuse.log", "ab")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(argv, stdout=logfile, stderr=logfile, stdin=subprocess.DEVNULL)
    try:
        wait_mounted(mountpoint, proc)
        yield proc.pid
    finally:
        unmount(mountpoint)
        stop_process(proc, grace=10.0)
        logfile.close()


def fsspec_fuse_available() -> str | None:
    """None if the fsspec.fuse peer can run here, or why not."""
    probe = subprocess.run(
        [sys.executable, "-c", "import fuse, fsspec.fuse"], capture_output=True, timeout=60
    )
    if probe.returncode != 0:
        return "fusepy/libfuse2 missing (pip install fusepy; apt-get install libfuse2)"
    return None


def run_commands(mountpoint: Path, setup: Setup, workload: str) -> float:
    """The shell side of a FUSE workload; returns wall seconds."""
    began = time.perf_counter()
    if workload == "W1":
        argv = ["dd", f"if={mountpoint / 'big'}", "of=/dev/null", "bs=1M"]
        done = subprocess.run(argv, capture_output=True, timeout=RUN_TIMEOUT)
        if done.returncode:
            raise RuntimeError(f"dd failed: {done.stderr.decode(errors='replace').strip()}")
    elif workload == "W3":
        procs = [
            subprocess.Popen(["cat", *files], cwd=mountpoint, stdout=subprocess.DEVNULL)
            for files in setup.random_lists
        ]
        codes = [p.wait(RUN_TIMEOUT) for p in procs]
        if any(codes):
            raise RuntimeError(f"cat exited with {codes}")
    else:
        subprocess.run(
            ["cat", *setup.keys],
            cwd=mountpoint,
            stdout=subprocess.DEVNULL,
            check=True,
            timeout=RUN_TIMEOUT,
        )
    return time.perf_counter() - began


# -- the run ----------------------------------------------------------------------------

Mounter = Callable[[Setup, Path], Any]


def measure_fuse(
    name: str,
    mounter: Mounter,
    setup: Setup,
    results: dict[str, dict[str, Result]],
    rss: dict[str, int],
) -> None:
    """Each workload on a fresh mount; W4 follows W2 on the same one."""
    mountpoint = Path(tempfile.mkdtemp(prefix=f"mnt-{name}-", dir=setup.work))
    try:
        for group in (("W1",), ("W2", "W4"), ("W3",)):
            with mounter(setup, mountpoint) as pid:
                sampler = RssSampler(pid) if pid else None
                try:
                    for workload in group:
                        seconds = run_commands(mountpoint, setup, workload)
                        results[name][workload].seconds.append(seconds)
                        log.info(
                            "%-11s %s %8.1f MB/s", name, workload, rate(setup, workload, seconds)
                        )
                finally:
                    if sampler is not None:
                        rss[name] = max(rss.get(name, 0), sampler.close())
    finally:
        unmount(mountpoint)
        shutil.rmtree(mountpoint, ignore_errors=True)


def measure_inprocess(
    name: str,
    runner: Callable[[Setup, str], float],
    setup: Setup,
    results: dict[str, dict[str, Result]],
) -> None:
    for workload in WORKLOADS:
        seconds = runner(setup, workload)
        results[name][workload].seconds.append(seconds)
        log.info("%-11s %s %8.1f MB/s", name, workload, rate(setup, workload, seconds))


def measure_tmpfs(setup: Setup, results: dict[str, dict[str, Result]]) -> None:
    """W2 and W4's reader over the same 4000 chunk files as plain files on tmpfs: the
    yardstick of W4 (every byte already in memory, no daemon)."""
    if not is_tmpfs(TMPFS_ROOT):
        raise RuntimeError(f"{TMPFS_ROOT} is not a tmpfs mount")
    root = Path(tempfile.mkdtemp(prefix="refmount-bench-", dir=TMPFS_ROOT))
    try:
        (root / "c").mkdir()
        with open(setup.data / "chunks.bin", "rb") as chunks:
            for key in setup.keys:
                (root / key).write_bytes(chunks.read(CHUNK))
        for workload in ("W2", "W4"):
            seconds = run_commands(root, setup, workload)
            results["tmpfs"][workload].seconds.append(seconds)
            log.info("%-11s %s %8.1f MB/s", "tmpfs", workload, rate(setup, workload, seconds))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def is_tmpfs(path: Path) -> bool:
    with open("/proc/self/mounts") as mounts:
        return any(
            fields[1] == str(path) and fields[2] == "tmpfs"
            for fields in (line.split() for line in mounts)
        )


def rate(setup: Setup, workload: str, seconds: float) -> float:
    return workload_bytes(setup, workload) / seconds / 1e6


def ensure_fusectl() -> str:
    """The kernel knobs refmount tunes live in fusectl; systemd mounts it at boot, a bare
    container may not.  Mount it when we can (root), say what happened."""
    connections = Path("/sys/fs/fuse/connections")
    if os.path.ismount(connections):
        return "fusectl mounted"
    if os.geteuid() != 0:
        return "fusectl not mounted (not root): max_background stays at the kernel default"
    result = subprocess.run(
        ["mount", "-t", "fusectl", "none", str(connections)], capture_output=True
    )
    if result.returncode == 0:
        return "fusectl was not mounted: mounted it"
    return f"fusectl not mounted, mount failed: {result.stderr.decode(errors='replace')}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = Sizes.pick(args.quick)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    systems = [s for s in SYSTEMS if s not in args.skip]
    notes = [ensure_fusectl()] if not args.no_fusectl else []
    if "fsspec.fuse" in systems and (why := fsspec_fuse_available()):
        notes.append(f"fsspec.fuse skipped: {why}")
        systems.remove("fsspec.fuse")
    results = {s: {w: Result() for w in WORKLOADS} for s in SYSTEMS}
    rss: dict[str, int] = {}
    data_root = work / f"data-{sizes.big}-{sizes.chunks}"
    data_root.mkdir(parents=True, exist_ok=True)
    with RangeServer(data_root, delay=args.delay) as server:
        setup = build(work, sizes, server.url, args.cache_size)
        log.info(
            "data in %s, served at %s with %g s per request", setup.data, server.url, args.delay
        )
        for repeat in range(args.repeat):
            log.info("round %d of %d", repeat + 1, args.repeat)
            for name in systems:
                try:
                    if name == "limit":
                        measure_inprocess(name, run_limit, setup, results)
                    elif name == "fsspec":
                        measure_inprocess(name, run_fsspec, setup, results)
                    elif name == "fsspec.fuse":
                        measure_fuse(name, fsspec_fuse_mount, setup, results, rss)
                    elif name == "tmpfs":
                        measure_tmpfs(setup, results)
                    else:
                        measure_fuse(name, refmount_mount, setup, results, rss)
                except Exception as exc:
                    log.error("%s failed: %s", name, exc)
                    for result in results[name].values():
                        result.error = result.error or str(exc)[:500]
    return {
        "delay": args.delay,
        "quick": args.quick,
        "sizes": sizes.__dict__,
        "budget": args.cache_size,
        "notes": notes,
        "mbps": {
            s: {
                w: (None if r.best() is None else workload_bytes(setup, w) / r.best() / 1e6)
                for w, r in results[s].items()
            }
            for s in SYSTEMS
        },
        "errors": {s: {w: r.error for w, r in results[s].items() if r.error} for s in SYSTEMS},
        "peak_rss_mb": {s: kb / 1024 for s, kb in rss.items()},
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
    }


# -- report -----------------------------------------------------------------------------


def fmt(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(report: dict[str, Any]) -> str:
    mbps = report["mbps"]
    lines = [
        f"Latency {report['delay'] * 1000:g} ms per request; refmount --cache-size "
        f"{report['budget']}; {report['machine']['cpus']} CPUs"
        + (" (quick sizes)" if report["quick"] else ""),
        "",
        "| workload | "
        + " | ".join(SYSTEMS)
        + " | refmount/limit | refmount/fsspec | refmount/tmpfs |",
        "|---" * (len(SYSTEMS) + 4) + "|",
    ]
    for w in WORKLOADS:
        row = [f"{w} {TITLES[w]}"] + [fmt(mbps[s][w]) for s in SYSTEMS]
        ours = mbps["refmount"][w]
        for peer in ("limit", "fsspec", "tmpfs"):
            theirs = mbps[peer][w]
            row.append(fmt(ours / theirs, ".2f") if ours and theirs else "-")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append("MB/s (10^6 bytes per second) of useful bytes, median of rounds.")
    for name, mb in report["peak_rss_mb"].items():
        lines.append(f"Peak RSS of the {name} daemon: {mb:.0f} MiB.")
    for note in report["notes"]:
        lines.append(f"Note: {note}.")
    for name, errors in report["errors"].items():
        for w, error in errors.items():
            lines.append(f"Error: {name} {w}: {error}")
    return "\n".join(lines) + "\n"


# A 3x5 pixel font: enough for the chart's labels (upper case, digits, a few marks).
_FONT = {
    "A": "010101111101101", "B": "110101110101110", "C": "011100100100011",
    "D": "110101101101110", "E": "111100110100111", "F": "111100110100100",
    "G": "011100101101011", "H": "101101111101101", "I": "111010010010111",
    "J": "001001001101010", "K": "101101110101101", "L": "100100100100111",
    "M": "101111111101101", "N": "110101101101101", "O": "010101101101010",
    "P": "110101110100100", "Q": "010101101110011", "R": "110101110101101",
    "S": "011100010001110", "T": "111010010010010", "U": "101101101101111",
    "V": "101101101101010", "W": "101101111111101", "X": "101101010101101",
    "Y": "101101010010010", "Z": "111001010100111", "0": "111101101101111",
    "1": "010110010010111", "2": "110001010100111", "3": "110001010001110",
    "4": "101101111001001", "5": "111100110001110", "6": "011100111101111",
    "7": "111001010010010", "8": "111101111101111", "9": "111101111001110",
    ".": "000000000000010", "/": "001001010100100", "-": "000000111000000",
    "(": "010100100100010", ")": "010001001001010", ":": "000010000010000",
    " ": "000000000000000", "_": "000000000000111", "%": "101001010100101",
}  # fmt: skip

_COLOURS = [(120, 120, 120), (70, 130, 180), (230, 150, 40), (60, 170, 90), (170, 90, 160)]


class Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width = width
        self.height = height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def rect(self, x: int, y: int, w: int, h: int, colour: tuple[int, int, int]) -> None:
        row = bytes(colour) * max(w, 0)
        for yy in range(max(y, 0), min(y + h, self.height)):
            start = (yy * self.width + max(x, 0)) * 3
            self.pixels[start : start + len(row)] = row[: (self.width - max(x, 0)) * 3]

    def text(self, x: int, y: int, text: str, scale: int = 2, colour=(0, 0, 0)) -> None:
        for n, char in enumerate(text.upper()):
            glyph = _FONT.get(char, _FONT[" "])
            for bit, on in enumerate(glyph):
                if on == "1":
                    gx, gy = bit % 3, bit // 3
                    self.rect(x + (n * 4 + gx) * scale, y + gy * scale, scale, scale, colour)

    def png(self) -> bytes:
        raw = b"".join(
            b"\x00" + bytes(self.pixels[y * self.width * 3 : (y + 1) * self.width * 3])
            for y in range(self.height)
        )

        def chunk(kind: bytes, body: bytes) -> bytes:
            crc = zlib.crc32(kind + body) & 0xFFFFFFFF
            return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b"")
        )


def png_bar_chart(report: dict[str, Any]) -> bytes:
    """Grouped bars: MB/s per workload, one colour per system, values written on top.

    Drawn with zlib and struct alone (a 3x5 pixel font) rather than matplotlib: the
    benchmark then needs nothing beyond the project's own dependencies."""
    mbps = report["mbps"]
    width, height, left, bottom, top = 900, 420, 70, 60, 60
    canvas = Canvas(width, height)
    values = [v for s in SYSTEMS for v in mbps[s].values() if v]
    vmax = max(values, default=1.0) * 1.1
    plot_h = height - bottom - top
    group_w = (width - left - 20) // len(WORKLOADS)
    bar_w = (group_w - 30) // len(SYSTEMS)
    canvas.text(left, 12, f"MB/S WITH {report['delay'] * 1000:g} MS PER REQUEST", 3)
    canvas.rect(left - 2, top, 2, plot_h, (0, 0, 0))
    canvas.rect(left - 2, top + plot_h, width - left - 10, 2, (0, 0, 0))
    for tick in range(5):
        value = vmax * tick / 4
        y = top + plot_h - int(plot_h * tick / 4)
        canvas.rect(left - 6, y, 4, 1, (0, 0, 0))
        canvas.text(4, y - 5, f"{value:.0f}", 2)
    for g, w in enumerate(WORKLOADS):
        x0 = left + g * group_w + 15
        for n, s in enumerate(SYSTEMS):
            value = mbps[s][w]
            if not value:
                continue
            h = int(plot_h * value / vmax)
            x = x0 + n * bar_w
            canvas.rect(x, top + plot_h - h, bar_w - 4, h, _COLOURS[n])
            canvas.text(x, top + plot_h - h - 12, f"{value:.0f}", 1)
        canvas.text(x0, top + plot_h + 10, f"{w} {TITLES[w]}", 2)
    for n, s in enumerate(SYSTEMS):
        x = left + n * 160
        canvas.rect(x, height - 22, 12, 12, _COLOURS[n])
        canvas.text(x + 18, height - 21, s, 2)
    return canvas.png()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay", type=float, default=0.01, help="seconds per request")
    parser.add_argument("--quick", action="store_true", help="64 MiB and 400 chunks")
    parser.add_argument("--repeat", type=int, default=1, help="rounds; medians are reported")
    parser.add_argument("--out", default=str(REPO / "bench" / "out"))
    parser.add_argument(
        "--workdir",
        default=str(Path(tempfile.gettempdir()) / "refmount-bench"),
        help="data, refs and mount points (data is kept for the next run)",
    )
    parser.add_argument("--cache-size", default="512M", help="refmount's --cache-size")
    parser.add_argument("--skip", nargs="*", default=[], choices=SYSTEMS)
    parser.add_argument(
        "--no-fusectl", action="store_true", help="do not mount fusectl when it is missing"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    report = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(report)
    (out / "results.md").write_text(table)
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "throughput.png").write_bytes(png_bar_chart(report))
    sys.stdout.write(table)
    sys.stdout.write(f"(written to {out})\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

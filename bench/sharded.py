"""Sharded Zarr v3 arrays read whole: the decoded view against the raw view (issue 29).

    python bench/sharded.py [--delay 0.01] [--side 2048] [--shard 1024] [--repeat 2]
                            [--workdir DIR]

Data, built each run: a v3 store zarr 3 writes, ``field`` float32 ``side x side`` in
shards of ``shard x shard`` (4 shards at the default side, 16 at ``--side 4096``)
holding 64 inner chunks each (zstd level 1 over noisy smooth values: about 2/3 of the
bytes stay), served by nginx on 127.0.0.1 with ``--delay`` seconds before each answer;
a JSON reference set maps every key of the store to its URL.

Systems, each read in a fresh process from a fresh mount (cold):

  raw      ``refmount REFS MNT``: zarr 3 opens the v3 array and reads it whole (zarr
           fetches each shard's index, then its inner chunks, through the mount)
  decoded  ``refmount --decode REFS MNT``: zarr reads the v2 array the view presents,
           one file per inner chunk (refmount reads each shard's index once, then, once
           a shard is being read, its inner chunks' bytes in runs of up to 64, decoded
           in jobs of 16, and the next shards ahead); from a fresh daemon (its decode
           workers start at mount, maybe not yet ready), and after one chunk of another
           small array (``warm``) read first, untimed, so the workers run
  second   ``--decode``, the same reader again on the same mount: everything decoded
           already (the daemon's cache, the kernel's page cache): the reader's cost with
           every read answered by the kernel
  dropped  the same, the kernel's page cache of the array's files dropped first
           (``posix_fadvise(DONTNEED)``): every read answered by the daemon from its
           cache, no fetch and no decoding left (lookups still cached by the kernel)
  tmpfs    the decoded v2 tree copied to a tmpfs (``/dev/shm``) and read there: the
           reader's own floor, no FUSE, no network, no decoding by refmount
  one      ``--decode``, one inner chunk only: bytes fetched against the inner chunk
           plus its shard's index (issue 29's target: at most 2x)

Each row: seconds (best of ``--repeat``), the requests and bytes the daemon fetched and
the decoding jobs its workers ran (its ``user.refmount.stats``; for ``second``, over
both reads), the CPU time of the daemon and of its worker processes during the timed
read (that run's; ``/proc/PID/task/*/schedstat``: what a loaded machine changes least),
and the load average beside it.
"""

from __future__ import annotations

import argparse
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

from tests.support.mounting import Mounted, child_env  # noqa: E402
from tests.support.nginx import NginxServer  # noqa: E402

INNER_PER_SIDE = 8  # 64 inner chunks per shard

BUILD = """
import sys, numpy as np, zarr
from zarr.codecs import ZstdCodec
store, side, shard, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
y, x = np.mgrid[0:side, 0:side] / side
rng = np.random.default_rng(29)
values = (280 + 5 * np.sin(6 * x) * np.cos(4 * y) + rng.normal(0, 0.3, (side, side)))
values = (np.round(values * 64) / 64).astype("f4")
array = zarr.create_array(store, name="field", shape=values.shape, dtype="f4", fill_value=0,
    shards=(shard, shard), chunks=(shard // per, shard // per),
    compressors=[ZstdCodec(level=1)], dimension_names=["y", "x"])
array[...] = values
zarr.create_array(store, name="warm", shape=(4,), chunks=(4,), dtype="f4",
                  compressors=[ZstdCodec()])[...] = 1
print(float(values.astype("f8").sum()))
"""

READ = """
import sys, time, warnings, numpy as np, zarr
warnings.simplefilter("ignore")
path, fmt = sys.argv[1], int(sys.argv[2])
start = time.perf_counter()
values = zarr.open_array(path, mode="r", zarr_format=fmt)[...]
print(time.perf_counter() - start, float(values.astype("f8").sum()))
"""


def python(script: str, *args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True, text=True, env=child_env(), timeout=900, cwd="/",
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or ["failed"])[-1])
    return done.stdout.split()


def refs_of(store: Path, base: str) -> dict:
    refs: dict[str, object] = {}
    for path in sorted(store.rglob("*")):
        if path.is_file():
            key = path.relative_to(store).as_posix()
            size = path.stat().st_size
            refs[key] = path.read_text() if path.name == "zarr.json" else [f"{base}/{key}", 0, size]
    return {"version": 1, "refs": refs}


def stats(mnt: Path) -> tuple[int, int, int]:
    found = json.loads(os.getxattr(mnt, "user.refmount.stats"))
    return found["requests"], found["bytes_fetched"], found.get("worker_jobs", 0)


def cpu_ms(pid: int) -> float:
    """Milliseconds of CPU the threads of process ``pid`` have run so far (0 once it is
    gone)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError):
            total += int(task.read_text().split()[0])
    return total / 1e6


def cpu_split(pid: int) -> tuple[float, dict[int, float]]:
    """CPU milliseconds so far of daemon ``pid`` and of each of its child processes."""
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            children += [int(child) for child in task.read_text().split()]
    return cpu_ms(pid), {child: cpu_ms(child) for child in children}


def cpu_during(pid: int, before: tuple[float, dict[int, float]]) -> tuple[float, float]:
    """CPU milliseconds of daemon ``pid`` and of its workers since ``before``."""
    daemon, workers = cpu_split(pid)
    return daemon - before[0], sum(ms - before[1].get(child, 0.0) for child, ms in workers.items())


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def measure(
    refs: Path, work: Path, args: list[str], read: list[str], mode: str
) -> tuple[float, str, int, int, int, float, float]:
    """One read in a fresh process from a fresh mount: seconds, checksum, requests and
    bytes the daemon fetched, decoding jobs, CPU milliseconds of the daemon and of its
    workers during the timed read.  ``mode``: ``fresh`` (the first read of a
    fresh daemon), ``workers`` (after one chunk of another array), ``second`` (the
    second read of the same reader after ``workers``: the second's seconds),
    ``dropped`` (the same, the kernel's page cache of the array's files dropped between
    the two)."""
    mnt = work / "mnt"
    mnt.mkdir(exist_ok=True)
    mounted = Mounted(refs, mnt, [*args, "--xattrs"], work / "refmount.log")
    try:
        if mode != "fresh":  # the decode workers start on their first chunk: another array's
            (mnt / ("warm/0" if "--decode" in args else "warm/c/0")).read_bytes()
        if read[0] == "cat":
            before = cpu_split(mounted.pid)
            start = time.perf_counter()
            subprocess.run(["cat", str(mnt / read[1])], capture_output=True, check=True)
            seconds = time.perf_counter() - start
            return (seconds, "-", *stats(mnt), *cpu_during(mounted.pid, before))
        before = cpu_split(mounted.pid)
        seconds_text, total = python(READ, str(mnt / "field"), read[1])
        if mode in ("second", "dropped"):
            if mode == "dropped":
                drop_page_cache(mnt / "field")
            before = cpu_split(mounted.pid)
            seconds_text, total = python(READ, str(mnt / "field"), read[1])
        return (float(seconds_text), total, *stats(mnt), *cpu_during(mounted.pid, before))
    finally:
        mounted.stop()


def drop_page_cache(root: Path) -> None:
    """Drop the kernel's cached pages of every file below ``root``."""
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def on_tmpfs(refs: Path, work: Path, repeat: int) -> tuple[float, str]:
    """The decoded v2 tree copied to a tmpfs and read there by zarr (best of ``repeat``):
    the reader's own time, without FUSE, the network or decoding."""
    mnt = work / "mnt"
    mnt.mkdir(exist_ok=True)
    copy = Path(tempfile.mkdtemp(prefix="sharded-bench-", dir="/dev/shm"))
    try:
        mounted = Mounted(refs, mnt, ["--decode"], work / "refmount.log")
        try:
            shutil.copytree(mnt / "field", copy / "field")
        finally:
            mounted.stop()
        runs = [python(READ, str(copy / "field"), "2") for _ in range(repeat)]
        seconds, total = min(runs, key=lambda run: float(run[0]))
        return float(seconds), total
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay", type=float, default=0.01, help="nginx delay per request")
    parser.add_argument("--side", type=int, default=2048)
    parser.add_argument("--shard", type=int, default=1024, help="a shard's side")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workdir", type=Path, help="(default: a temporary directory)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sharded-bench-", dir=args.workdir))
    try:
        www = work / "www"
        www.mkdir()
        (total,) = python(BUILD, str(www / "store.zarr"), str(args.side), str(args.shard),
                          str(INNER_PER_SIDE))  # fmt: skip
        stored = sum(p.stat().st_size for p in (www / "store.zarr").rglob("c/*/*"))
        shards = (-(-args.side // args.shard)) ** 2
        print(f"field: {args.side}x{args.side} float32, {stored / 1e6:.1f} MB stored in "
              f"{shards} shards of 64 inner chunks; nginx +{args.delay * 1000:g} ms")  # fmt: skip
        with NginxServer(www, delay=args.delay) as server:
            refs = work / "refs.json"
            refs.write_text(json.dumps(refs_of(www / "store.zarr", f"{server.url}/store.zarr")))
            systems = {
                "raw (zarr 3, v3)": ([], ["zarr", "3"], "fresh"),
                "decoded (zarr, v2)": (["--decode"], ["zarr", "2"], "fresh"),
                "decoded (zarr, v2), workers started": (["--decode"], ["zarr", "2"], "workers"),
                "decoded, warm (second read of the same mount)": (
                    ["--decode"], ["zarr", "2"], "second"),
                "decoded, daemon warm (second read, page cache dropped)": (
                    ["--decode"], ["zarr", "2"], "dropped"),
                "decoded, one inner chunk (cat)": (["--decode"], ["cat", "field/3.5"], "workers"),
            }  # fmt: skip
            print("| system | seconds | requests | MB fetched | decode jobs | daemon CPU ms "
                  "| workers CPU ms | sum equal | load |")  # fmt: skip
            print("|---|---|---|---|---|---|---|---|---|")
            for name, (mount_args, read, mode) in systems.items():
                runs = [measure(refs, work, mount_args, read, mode) for _ in range(args.repeat)]
                seconds, got, requests, fetched, jobs, daemon, workers = min(runs)
                same = "-" if got == "-" else str(abs(float(got) - float(total)) < 1e-3)
                print(f"| {name} | {seconds:.2f} | {requests} | {fetched / 1e6:.3f} | {jobs} "
                      f"| {daemon:.0f} | {workers:.0f} | {same} | {load()} |")  # fmt: skip
            seconds, got = on_tmpfs(refs, work, args.repeat)
            same = str(abs(float(got) - float(total)) < 1e-3)
            print(f"| decoded v2 copy on tmpfs (no FUSE) | {seconds:.2f} | - | - | - | - | - "
                  f"| {same} | {load()} |")  # fmt: skip
        shard = (www / "store.zarr/field/c/0/0").read_bytes()
        index = 64 * 16 + 4
        entries = np.frombuffer(shard[-index:-4], "<u8").reshape(64, 2)
        inner = int(entries[3 * INNER_PER_SIDE + 5][1])
        print(f"inner chunk 3.5: {inner} bytes stored, its shard's index {index} bytes: "
              f"2 x (inner + index) = {2 * (inner + index)} bytes")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

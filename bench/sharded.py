"""Sharded Zarr v3 arrays read whole: the decoded view against the raw view (issue 29).

    python bench/sharded.py [--delay 0.01] [--side 2048] [--repeat 2] [--workdir DIR]

Data, built each run: a v3 store zarr 3 writes, ``field`` float32 ``side x side`` in
shards of ``side/2 x side/2`` holding 64 inner chunks each (zstd level 1 over noisy
smooth values: about 2/3 of the bytes stay), served by nginx on 127.0.0.1 with
``--delay`` seconds before each answer; a JSON reference set maps every key of the
store to its URL.

Systems, each read in a fresh process from a fresh mount (cold):

  raw      ``refmount REFS MNT``: zarr 3 opens the v3 array and reads it whole (zarr
           fetches each shard's index, then its inner chunks, through the mount)
  decoded  ``refmount --decode REFS MNT``: zarr reads the v2 array the view presents,
           one file per inner chunk (refmount reads each shard's index once, then, once
           a shard is being read, its inner chunks' bytes in runs of up to 64, decoded
           in jobs of 16, and the next shard ahead); from a fresh daemon (its decode
           workers start at mount, maybe not yet ready), and after one chunk of another
           small array (``warm``) read first, untimed, so the workers run
  one      ``--decode``, one inner chunk only: bytes fetched against the inner chunk
           plus its shard's index (issue 29's target: at most 2x)

Each row: seconds (best of ``--repeat``), the requests and bytes the daemon fetched and
the decoding jobs its workers ran (its ``user.refmount.stats``), and the load average
beside it.
"""

from __future__ import annotations

import argparse
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
store, side, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
y, x = np.mgrid[0:side, 0:side] / side
rng = np.random.default_rng(29)
values = (280 + 5 * np.sin(6 * x) * np.cos(4 * y) + rng.normal(0, 0.3, (side, side)))
values = (np.round(values * 64) / 64).astype("f4")
array = zarr.create_array(store, name="field", shape=values.shape, dtype="f4", fill_value=0,
    shards=(side // 2, side // 2), chunks=(side // 2 // per, side // 2 // per),
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


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def measure(
    refs: Path, work: Path, args: list[str], read: list[str], warm: bool
) -> tuple[float, str, int, int, int]:
    """One cold read in a fresh process from a fresh mount: seconds, checksum, requests
    and bytes the daemon fetched, decoding jobs (``warm``: after one chunk of another
    array)."""
    mnt = work / "mnt"
    mnt.mkdir(exist_ok=True)
    mounted = Mounted(refs, mnt, [*args, "--xattrs"], work / "refmount.log")
    try:
        if warm:  # the decode workers start on their first chunk: another array's
            (mnt / ("warm/0" if "--decode" in args else "warm/c/0")).read_bytes()
        if read[0] == "cat":
            start = time.perf_counter()
            subprocess.run(["cat", str(mnt / read[1])], capture_output=True, check=True)
            seconds, total = time.perf_counter() - start, "-"
        else:
            seconds_text, total = python(READ, str(mnt / "field"), read[1])
            seconds = float(seconds_text)
        return (seconds, total, *stats(mnt))
    finally:
        mounted.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay", type=float, default=0.01, help="nginx delay per request")
    parser.add_argument("--side", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workdir", type=Path, help="(default: a temporary directory)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sharded-bench-", dir=args.workdir))
    try:
        www = work / "www"
        www.mkdir()
        (total,) = python(BUILD, str(www / "store.zarr"), str(args.side), str(INNER_PER_SIDE))
        stored = sum(p.stat().st_size for p in (www / "store.zarr").rglob("c/*/*"))
        print(f"field: {args.side}x{args.side} float32, {stored / 1e6:.1f} MB stored in 4 "
              f"shards of 64 inner chunks; nginx +{args.delay * 1000:g} ms")  # fmt: skip
        with NginxServer(www, delay=args.delay) as server:
            refs = work / "refs.json"
            refs.write_text(json.dumps(refs_of(www / "store.zarr", f"{server.url}/store.zarr")))
            systems = {
                "raw (zarr 3, v3)": ([], ["zarr", "3"], False),
                "decoded (zarr, v2)": (["--decode"], ["zarr", "2"], False),
                "decoded (zarr, v2), workers started": (["--decode"], ["zarr", "2"], True),
                "decoded, one inner chunk (cat)": (["--decode"], ["cat", "field/3.5"], True),
            }
            print("| system | seconds | requests | MB fetched | decode jobs | sum equal | load |")
            print("|---|---|---|---|---|---|---|")
            for name, (mount_args, read, warm) in systems.items():
                runs = [measure(refs, work, mount_args, read, warm) for _ in range(args.repeat)]
                seconds, got, requests, fetched, jobs = min(runs)
                same = "-" if got == "-" else str(abs(float(got) - float(total)) < 1e-3)
                print(f"| {name} | {seconds:.2f} | {requests} | {fetched / 1e6:.3f} | {jobs} "
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

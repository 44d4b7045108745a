"""Catalog benchmark: one mount of N sets next to one mount per set, against nginx.

    python bench/catalog.py [--sets 1000] [--per-set-mounts 20] [--max-loaded-sets 5]

Builds N small JSON reference sets (each: ``.zgroup``, ``v/.zarray``, one 1000-byte
chunk ``v/0`` of a shared ``data.bin``) in a temporary directory, serves refs and data
with nginx on 127.0.0.1 (index pages on: the catalog lists them), and measures, each on
a fresh mount made as a user makes it (``refmount SOURCE MNT``, backgrounded):

  catalog.local  ``refmount DIR MNT --max-loaded-sets K`` over the local directory
  catalog.http   ``refmount http://127.0.0.1:PORT/refs/ MNT --max-loaded-sets K``
  per-set        one ``refmount SET.json MNT_i`` per set for the first M sets (the way
                 without catalogs), data over HTTP

Figures: the mount's start (command to first root listing); ``ls -l`` of the catalog's
root; a first read (``cat SET/v/0``) in 20 sets never touched before (median); ``find``
over the whole mount followed by reading ``v/0`` of every set (bytes checked); the
daemon's resident memory after ``ls`` and its peak over the ``find``.  For per-set: the
time and summed memory of M mounts, and a first read in each.  Everything mounted is
unmounted at exit, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.mounting import RssSampler, mount_background, rss_kib  # noqa: E402
from tests.support.nginx import NginxServer  # noqa: E402

CHUNK = 1000


def refs_doc(data_url: str, n: int) -> bytes:
    zarray = {"shape": [CHUNK], "chunks": [CHUNK], "dtype": "|u1", "compressor": None,
              "fill_value": 0, "filters": None, "order": "C", "zarr_format": 2}  # fmt: skip
    refs = {
        ".zgroup": '{"zarr_format":2}',
        "v/.zarray": json.dumps(zarray),
        "v/0": [data_url, n * CHUNK, CHUNK],
    }
    return json.dumps({"version": 1, "refs": refs}).encode()


def timed(*argv: str, input: bytes | None = None) -> tuple[float, bytes]:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, input=input, timeout=1800, check=True)
    return time.perf_counter() - start, done.stdout


def measure_catalog(
    name: str, source: str, work: Path, count: int, data: bytes, args: list[str]
) -> dict[str, object]:
    mnt = work / f"mnt-{name}"
    with mount_background(source, mnt, args) as mounted:
        assert mounted.pid is not None
        ls_seconds, out = timed("ls", "-l", str(mnt))
        assert out.count(b"\n") == count + 1, out[:200]
        rss_ls = rss_kib(mounted.pid)
        firsts = []
        for n in random.Random(1).sample(range(count), 20):
            seconds, got = timed("cat", str(mnt / f"s{n:05d}" / "v" / "0"))
            assert got == data[n * CHUNK : (n + 1) * CHUNK]
            firsts.append(seconds)
        sampler = RssSampler(mounted.pid)
        try:
            find_seconds, found = timed("find", str(mnt))
            files = sorted(
                (line for line in found.decode().splitlines() if line.endswith("/v/0")),
                key=lambda path: int(Path(path).parts[-3][1:]),
            )
            assert len(files) == count
            read_seconds, got = timed("xargs", "-d", "\n", "cat", input="\n".join(files).encode())
            assert got == data, "wrong bytes through the catalog"
        finally:
            peak = sampler.close()
    return {
        "system": name,
        "start_s": round(mounted.ready, 3),
        "ls_s": round(ls_seconds, 3),
        "rss_after_ls_mib": round(rss_ls / 1024, 1),
        "first_read_median_s": round(statistics.median(firsts), 4),
        "find_s": round(find_seconds, 2),
        "read_all_s": round(read_seconds, 2),
        "peak_rss_mib": round(peak / 1024, 1),
    }


def measure_per_set(
    work: Path, refs: Path, server_url: str, mounts: int, data: bytes
) -> dict[str, object]:
    with ExitStack() as stack:
        start = time.perf_counter()
        pids = []
        for n in range(mounts):
            mounted = stack.enter_context(
                mount_background(f"{server_url}/refs/s{n:05d}.json", work / f"single{n}")
            )
            pids.append(mounted.pid)
        start_seconds = time.perf_counter() - start
        rss = sum(rss_kib(pid) for pid in pids if pid is not None)
        firsts = []
        for n in range(mounts):
            seconds, got = timed("cat", str(work / f"single{n}" / "v" / "0"))
            assert got == data[n * CHUNK : (n + 1) * CHUNK]
            firsts.append(seconds)
    return {
        "system": f"per-set x{mounts}",
        "start_s": round(start_seconds, 3),
        "rss_sum_mib": round(rss / 1024, 1),
        "first_read_median_s": round(statistics.median(firsts), 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=int, default=1000)
    parser.add_argument("--per-set-mounts", type=int, default=20)
    parser.add_argument("--max-loaded-sets", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="refmount-bench-catalog-") as tmp:
        work = Path(tmp)
        www = work / "www"
        (www / "refs").mkdir(parents=True)
        data = random.Random(0).randbytes(args.sets * CHUNK)
        (www / "data.bin").write_bytes(data)
        with NginxServer(www, autoindex=True) as server:
            for n in range(args.sets):
                (www / "refs" / f"s{n:05d}.json").write_bytes(refs_doc(f"{server.url}/data.bin", n))
            limit = ["--max-loaded-sets", str(args.max_loaded_sets)]
            rows = [
                measure_catalog("catalog.local", str(www / "refs"), work, args.sets, data, limit),
                measure_catalog(
                    "catalog.http", f"{server.url}/refs/", work, args.sets, data, limit
                ),
                measure_per_set(work, www / "refs", server.url, args.per_set_mounts, data),
            ]
    print(f"# {' '.join(sys.argv)}  ({args.sets} sets, --max-loaded-sets {args.max_loaded_sets})")
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())

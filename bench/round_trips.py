"""FUSE requests per file: which round trips a workload costs the refmount daemon.

    python bench/round_trips.py [--files 400] [--stock] [--refmount-args "..."]

Mounts a set of ``--files`` 256 KiB chunk files (local data: no server is involved; with
``--stock`` the daemon runs as on a stock pyfuse3), then runs, each under ``strace``
attached to the daemon, ``cat`` of every file (cold), the same ``cat`` again (warm) and
``find``, and prints the FUSE requests of each per file, by opcode
(``tests/support/fuse_requests.py`` counts them).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.fuse_requests import count_requests  # noqa: E402
from tests.support.mounting import REFMOUNT, STOCK_PYFUSE3, Mounted  # noqa: E402

CHUNK = 256 << 10


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(pid: int, command: list[str], cwd: Path) -> tuple[float, float, float]:
    """Wall seconds, the daemon's CPU seconds and the command's CPU seconds of one run:
    CPU time is what a loaded machine changes least."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    daemon = cpu_seconds(pid)
    began = time.perf_counter()
    subprocess.run(command, cwd=cwd, stdout=subprocess.DEVNULL, check=True, timeout=600)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reader = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu_seconds(pid) - daemon, reader


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--refmount-args", default="")
    parser.add_argument(
        "--stock", action="store_true", help="the daemon as on a stock pyfuse3 (patch hidden)"
    )
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "refmount-rt"))
    args = parser.parse_args(argv)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    data = work / "chunks.bin"
    if not data.exists() or data.stat().st_size != args.files * CHUNK:
        data.write_bytes(os.urandom(args.files * CHUNK))
    keys = [f"c/{k:05d}" for k in range(args.files)]
    refs = {key: [str(data), k * CHUNK, CHUNK] for k, key in enumerate(keys)}
    refs_path = work / "refs.json"
    refs_path.write_text(json.dumps({"version": 1, "refs": refs}))
    mountpoint = work / "mnt"
    mountpoint.mkdir(exist_ok=True)
    extra = ["--allow-local", *args.refmount_args.split()]
    rows = []
    command = STOCK_PYFUSE3 if args.stock else REFMOUNT
    workloads = (("cat, cold", ["cat", *keys]), ("cat, warm", ["cat", *keys]),
                 ("find", ["find", "."]))  # fmt: skip
    times = []
    log = work / "refmount.log"
    with Mounted(refs_path, mountpoint, extra, log, command=command) as mounted:
        for name, argv in workloads:
            times.append((name, timed(mounted.pid, argv, mountpoint)))
    with Mounted(refs_path, mountpoint, extra, log, command=command) as mounted:
        for name, argv in workloads:
            rows.append((name, count_requests(mounted.pid, argv, mountpoint)))
    names = sorted({op for _, counts in rows for op in counts})
    kind = "stock pyfuse3" if args.stock else "pyfuse3 as installed"
    print(f"FUSE requests per file ({args.files} files; {kind}; refmount {' '.join(extra)})")
    print("| workload | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for name, counts in rows:
        cells = [f"{counts[op] / args.files:.2f}" for op in names]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\nPer file, without strace (a fresh mount): wall time, and CPU time of each side")
    print("| workload | wall µs | daemon CPU µs | reader CPU µs |")
    print("|---|---|---|---|")
    for name, (wall, daemon, reader) in times:
        per = [f"{1e6 * x / args.files:.0f}" for x in (wall, daemon, reader)]
        print(f"| {name} | " + " | ".join(per) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Daemon memory after plain listings of a large directory, and the file inodes it counts
as held by the kernel.

    python bench/listing_memory.py [--keys 1000000] [--workdir DIR] [--listings 1]

Builds (once per workdir and size) bench/scale.py's JSON set, mounts it with the command
line, and prints one JSON line: the daemon's RSS once mounted, after ``--listings`` plain
``ls`` of ``big/`` (no entry stat'ed: the kernel lists with READDIRPLUS at the start of
each listing only), and after ``ls -l`` (every entry looked up), with ``kernel_files``
from ``refmount status`` after each (absent from versions that do not report it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.scale import build_json  # noqa: E402
from tests.support.mounting import REFMOUNT, child_env, mount_background, rss_kib  # noqa: E402


def status(mountpoint: Path) -> dict[str, Any]:
    done = subprocess.run(
        [*REFMOUNT, "status", "--json", str(mountpoint)],
        capture_output=True, text=True, check=True, env=child_env(), timeout=60,
    )  # fmt: skip
    return json.loads(done.stdout)


def listed(command: str) -> int:
    """Lines ``command`` printed (run by the shell, its output to a pipe, not a tty)."""
    done = subprocess.run(command, shell=True, capture_output=True, text=True, check=True)
    return int(done.stdout.strip())


def measure(refs: Path, mountpoint: Path, listings: int) -> dict[str, Any]:
    with mount_background(refs, mountpoint) as m:
        assert m.pid is not None, "no daemon found for the mount"
        figures: dict[str, Any] = {"rss_ready_mib": rss_kib(m.pid) / 1024}
        for n in range(listings):
            figures[f"ls_{n + 1}_entries"] = listed(f"ls {mountpoint}/big | wc -l")
            figures[f"rss_after_ls_{n + 1}_mib"] = rss_kib(m.pid) / 1024
        figures["kernel_files_after_ls"] = status(mountpoint).get("kernel_files")
        figures["ls_l_entries"] = listed(f"ls -l {mountpoint}/big | wc -l") - 1  # "total"
        figures["rss_after_ls_l_mib"] = rss_kib(m.pid) / 1024
        figures["kernel_files_after_ls_l"] = status(mountpoint).get("kernel_files")
        return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="chunk keys in big/")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/refmount-listing-memory"))
    parser.add_argument("--listings", type=int, default=1, help="plain ls runs before ls -l")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    refs = args.workdir / f"refs-{args.keys}.json"
    if not refs.exists():
        partial = refs.with_suffix(".partial")
        build_json(partial, args.keys)
        partial.rename(refs)
    figures = measure(refs, args.workdir / "mnt", args.listings)
    print(json.dumps({"keys": args.keys, **figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

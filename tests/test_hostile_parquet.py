"""Hostile Parquet reference sets: each is refused with a message naming the key or file,
or its keys are EIO, within stated seconds and megabytes, the daemon alive.

Bounds asserted here (the daemon's peak RSS is its ``VmHWM``; a refused start's is the
child's ``ru_maxrss``):

* a hostile ``.zmetadata`` is refused at start in under 20 s and 200 MB;
* a record file with more rows than ``record_size`` (a row bomb), or whose columns take
  more than the record budget (64 MiB) once decompressed (an inline-data bomb that would
  take 512 MiB), is EIO for its keys in under 20 s, its file named in the log once, the
  daemon's peak RSS under 200 MB (about 110 MB here; decoding the inline-data bomb would
  take 512 MiB more).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import trio
from fsspec.implementations.local import LocalFileSystem

from refmount.errors import FetchError, RefsError
from refmount.refs.parquet import ParquetRefSet
from tests.support.parquet_sets import write_record, write_set, zarray

MB = 1 << 20
PEAK_RSS_LIMIT = 200 * MB
SECONDS = 20.0
BOMB_ROWS = 5_000_000
BOMB_RAW = 512 * MB


def peak_rss(pid: int) -> int:
    """A live process's peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


#: runs argv[1:] and prints its exit status and peak RSS (kB) as a last line: a child
#: forked from a small process, whose peak is not inflated by pytest's pages before exec
_MEASURE = (
    "import os, subprocess, sys\n"
    "child = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL)\n"
    "_, status, usage = os.wait4(child.pid, 0)\n"
    "sys.stdout.flush()\n"
    "print(f'\\nEXIT {os.waitstatus_to_exitcode(status)} MAXRSS {usage.ru_maxrss}')\n"
)


def start_refused(refs: Path, mountpoint: Path) -> tuple[int, str, float, int]:
    """Start refmount on ``refs`` as a user would: exit status, output, seconds and the
    process's peak RSS in bytes."""
    argv = [sys.executable, "-m", "refmount", str(refs), str(mountpoint), "-f"]
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", _MEASURE, *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    seconds = time.monotonic() - started
    output, _, last = result.stdout.rstrip().rpartition("\n")
    _, status, _, maxrss = last.split()
    return int(status), output, seconds, int(maxrss) * 1024


def bomb_set(root: Path) -> Path:
    """Arrays ``rows`` (a row bomb), ``raw`` (an inline-data bomb), ``groups`` (5000 row
    groups), ``paths`` (70 MB of distinct paths) and ``good`` (one inline chunk), record
    size 10,000."""
    write_set(
        root,
        {
            ".zgroup": {"zarr_format": 2},
            "rows/.zarray": zarray([10_000], [1]),
            "raw/.zarray": zarray([10_000], [1]),
            "groups/.zarray": zarray([10_000], [1]),
            "paths/.zarray": zarray([10_000], [1]),
            "good/.zarray": zarray([10_000], [1]),
        },
        record_size=10_000,
    )
    (root / "rows").mkdir()
    nulls = pa.nulls(BOMB_ROWS, pa.int64())
    pq.write_table(
        pa.table({"path": pa.nulls(BOMB_ROWS, pa.string()), "offset": nulls, "size": nulls}),
        root / "rows" / "refs.0.parq",
        compression="zstd",
    )
    (root / "raw").mkdir()
    piece = 32 * MB
    schema = pa.schema([("raw", pa.binary())])
    with pq.ParquetWriter(root / "raw" / "refs.0.parq", schema, compression="zstd") as writer:
        for _ in range(BOMB_RAW // piece):
            writer.write_table(pa.table({"raw": pa.array([bytes(piece)], pa.binary())}))
    write_record(
        root / "groups" / "refs.0.parq", ["f"] * 5000, [0] * 5000, [1] * 5000, row_group_size=1
    )
    long_paths = [f"{i:08d}" + "p" * 100_000 for i in range(700)]  # 70 MB of distinct paths
    write_record(root / "paths" / "refs.0.parq", long_paths, [0] * 700, [1] * 700)
    write_record(root / "good" / "refs.0.parq", None, None, None, [b"fine"])
    return root


def test_row_and_inline_bombs_are_eio(tmp_path: Path, mount) -> None:
    root = bomb_set(tmp_path / "bombs.parq")
    assert (root / "raw" / "refs.0.parq").stat().st_size < 2 * MB  # small on disk
    mounted = mount(root, "--timeout", "30")
    mnt = mounted.mountpoint
    for name, reason in [
        ("rows", f"{BOMB_ROWS} rows, more than the record size 10000"),
        ("raw", "bytes of inline data, more than"),
        ("groups", "5000 row groups and 3 columns, more than 4096 row groups"),
        ("paths", "bytes once decompressed, more than 67108864"),
    ]:
        for _ in range(2):  # the second answer comes from memory
            started = time.monotonic()
            result = subprocess.run(["cat", str(mnt / name / "0")], capture_output=True, text=True)
            assert time.monotonic() - started < SECONDS
            assert result.returncode != 0 and "Input/output error" in result.stderr, name
            ls = subprocess.run(["ls", str(mnt / name)], capture_output=True, text=True)
            assert ls.returncode != 0 and "Input/output error" in ls.stderr, name
        log = mounted.log()
        record = f"{name}/refs.0.parq"
        # Once where the record was read, once naming the first key it failed: not once
        # per key, request or waiter.
        assert log.count(f"{record}: over the record budget: ") == 2, log
        assert reason in log, (reason, log)
        assert mounted.process.poll() is None
    assert (mnt / "good" / "0").read_bytes() == b"fine"
    hwm = peak_rss(mounted.process.pid)
    assert hwm < PEAK_RSS_LIMIT, f"daemon peak RSS {hwm / MB:.0f} MB"


ZMETA_CASES: list[tuple[dict[str, Any], int, str]] = [
    ({"a/.zarray": {"shape": [2**70], "chunks": [1]}}, 10, "'a/.zarray': more than"),
    ({"a/.zarray": {"shape": [2**40, 2**40], "chunks": [1, 1]}}, 10, "'a/.zarray': more than"),
    ({"a/.zarray": {"shape": [2**62] * 3, "chunks": [1] * 3}}, 10, "'a/.zarray': more than"),
    ({"a/.zarray": {"shape": [4], "chunks": [0]}}, 10, "'a/.zarray': chunks must be positive"),
    ({"a/.zarray": {"shape": [-4], "chunks": [1]}}, 10, "'a/.zarray': shape must be"),
    ({"a/.zarray": {"shape": [4], "chunks": [-1]}}, 10, "'a/.zarray': chunks must be"),
    ({"a/.zarray": {"shape": [4.5], "chunks": [1]}}, 10, "'a/.zarray': shape must be"),
    ({"a/.zarray": {"shape": ["4"], "chunks": [1]}}, 10, "'a/.zarray': shape must be"),
    ({"a/.zarray": {"shape": [1] * 100, "chunks": [1] * 100}}, 10, "more than 64 dimensions"),
    ({"a/.zarray": {"shape": [4], "chunks": [1]}}, 2**40, "'record_size' must be"),
    ({"a/.zarray": {"shape": [4], "chunks": [1]}}, -5, "'record_size' must be"),
    (
        {f"a{i}/.zarray": {"shape": [2**47], "chunks": [1]} for i in range(3)},
        10,
        "too many chunks",
    ),
]


@pytest.mark.parametrize(("metadata", "record_size", "message"), ZMETA_CASES)
def test_hostile_zmetadata_is_refused(
    tmp_path: Path, mountpoint: Path, metadata: dict[str, Any], record_size: int, message: str
) -> None:
    root = tmp_path / "hostile.parq"
    root.mkdir()
    (root / ".zmetadata").write_text(json.dumps({"metadata": metadata, "record_size": record_size}))
    status, output, seconds, rss = start_refused(root, mountpoint)
    assert status != 0
    assert message in output, output
    assert seconds < SECONDS and rss < PEAK_RSS_LIMIT, (seconds, rss / MB)
    assert not os.path.ismount(mountpoint)


def test_a_huge_zmetadata_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "huge.parq"
    root.mkdir()
    with open(root / ".zmetadata", "w") as f:
        f.write('{"record_size": 10, "metadata": {"k": "')
        f.write("x" * (257 * MB))
        f.write('"}}')
    with pytest.raises(RefsError, match="larger than 256 MiB"):
        ParquetRefSet.open(LocalFileSystem(), str(root), resolve=str, mtime=0)


# --- the record store's rules, without a mount -----------------------------------------


def test_an_error_is_decoded_once_for_all_waiters(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Twenty lookups of keys in one over-budget record: one read, one decode, one log
    line, twenty FetchErrors; later lookups are answered from memory."""
    root = tmp_path / "bomb.parq"
    write_set(root, {"a/.zarray": zarray([100], [1])}, record_size=100)
    write_record(root / "a" / "refs.0.parq", None, None, None, [bytes(2 * MB)] * 4)
    rs = ParquetRefSet.open(LocalFileSystem(), str(root), resolve=str, mtime=0, record_bytes=MB)
    errors: list[str] = []

    async def lookup(key: str) -> None:
        try:
            await rs.find_file(key)
        except FetchError as exc:
            errors.append(str(exc))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(lookup, f"a/{i}")

    with caplog.at_level(logging.WARNING, logger="refmount.refs"):
        trio.run(main)
        trio.run(main)
    assert len(errors) == 40 and all("a/refs.0.parq: over the record budget" in e for e in errors)
    assert rs.record_reads == 1
    assert sum("refs.0.parq" in r.getMessage() for r in caplog.records) == 1


def test_a_record_file_over_budget_is_refused_by_its_size(tmp_path: Path) -> None:
    """3 MB of incompressible inline data with a 1 MB budget: refused by the file's size,
    and again from memory."""
    root = tmp_path / "big.parq"
    write_set(root, {"a/.zarray": zarray([4], [1])}, record_size=4)
    write_record(root / "a" / "refs.0.parq", None, None, None, [os.urandom(3 * MB)])
    rs = ParquetRefSet.open(LocalFileSystem(), str(root), resolve=str, mtime=0, record_bytes=MB)
    for _ in range(2):
        with pytest.raises(FetchError, match=r"parq: over the record budget: 3\d{6} bytes"):
            trio.run(rs.find_file, "a/0")
    assert rs.record_reads == 1


def test_held_records_are_bounded_with_their_inline_bytes(tmp_path: Path) -> None:
    """The LRU counts inline bytes: 10 records of 1 MB of raw data each, 3 MB held."""
    root = tmp_path / "raw.parq"
    write_set(root, {"a/.zarray": zarray([10], [1])}, record_size=1)
    for i in range(10):
        write_record(root / "a" / f"refs.{i}.parq", None, None, None, [bytes([i]) * MB])
    rs = ParquetRefSet.open(
        LocalFileSystem(), str(root), resolve=str, mtime=0, record_cache_bytes=3 * MB
    )

    async def main() -> None:
        for i in range(10):
            fid = await rs.find_file(f"a/{i}")
            assert fid is not None
            assert (await rs.file_ref(fid)).data == bytes([i]) * MB
            assert rs.cache_bytes <= 3 * MB

    trio.run(main)
    assert rs.cached_records == 2 and rs.cache_bytes > 2 * MB

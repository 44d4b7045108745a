"""Parquet reference sets read over HTTP, through a real mount, with the store failing
after the mount: found without directory listings; a record file or a listing that
fails (500, 404, reset, stall) fails only the keys it holds, with EIO, retried, within
the deadline, the daemon alive and right again once the store is."""

from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path

import pytest
import zarr

from tests.support.parquet_sets import write_ranges, write_record, write_set, zarray

CHUNK = 1000


def data_file(http_root: Path, name: str, size: int) -> bytes:
    data = bytes(range(256)) * (size // 256 + 1)
    (http_root / name).write_bytes(data)
    return data


def build(http_root: Path, name: str, data_url: str, nchunks: int = 6) -> str:
    """A 1-D array ``x`` of ``nchunks`` chunks in records of 2; returns the set's name."""
    root = http_root / name
    write_set(
        root,
        {".zgroup": {"zarr_format": 2}, "x/.zarray": zarray([nchunks * CHUNK], [CHUNK])},
        record_size=2,
    )
    write_ranges(root, "x", data_url, CHUNK, nchunks, record_size=2)
    return name


def run(*argv: str | Path) -> subprocess.CompletedProcess[bytes]:
    """A command's result, stdout as bytes (chunk contents), stderr as bytes too."""
    return subprocess.run([str(a) for a in argv], capture_output=True, timeout=120)


def assert_eio(*argv: str | Path) -> None:
    result = run(*argv)
    assert result.returncode != 0, result.stdout
    assert b"Input/output error" in result.stderr, result.stderr


def test_parquet_over_http_and_a_stalled_record(http, http_root: Path, mount) -> None:
    data = data_file(http_root, "pq-data.bin", 6 * CHUNK)
    name = build(http_root, "pq.parq", f"{http.url}/pq-data.bin")
    mounted = mount(f"{http.url}/{name}", "--timeout", "2", "--retries", "0")
    root = mounted.mountpoint
    assert sorted(p.name for p in (root / "x").iterdir()) == [
        ".zarray", "0", "1", "2", "3", "4", "5",
    ]  # fmt: skip
    mounted.stop()
    http.fault(f"/{name}/x/refs.1.parq", "stall", count=-1)
    root = mount(f"{http.url}/{name}", "--timeout", "2", "--retries", "0").mountpoint
    assert (root / "x" / "0").read_bytes() == data[:CHUNK]  # record 0 answers
    assert_eio("stat", root / "x" / "2")  # the record's deadline, not a hang
    assert (root / "x" / "5").read_bytes() == data[5 * CHUNK : 6 * CHUNK]  # record 2


@pytest.mark.parametrize("mode", ["500", "404", "reset"])
def test_a_failing_record_is_eio_then_recovers(http, http_root: Path, mount, mode: str) -> None:
    data = data_file(http_root, "pqf-data.bin", 6 * CHUNK)
    name = build(http_root, f"pqf-{mode}.parq", f"{http.url}/pqf-data.bin")
    mounted = mount(f"{http.url}/{name}", "--timeout", "10")
    root = mounted.mountpoint
    assert (root / "x" / "0").read_bytes() == data[:CHUNK]
    http.fault(f"/{name}/x/refs.1.parq", mode, count=-1)
    assert_eio("cat", root / "x" / "2")
    assert_eio("stat", root / "x" / "3")
    assert mounted.process.poll() is None
    # the other records still answer, and so does the failed one once the store does
    assert run("cat", root / "x" / "5").stdout == data[5 * CHUNK : 6 * CHUNK]
    http.clear_faults()
    assert (root / "x" / "2").read_bytes() == data[2 * CHUNK : 3 * CHUNK]
    assert (root / "x" / "3").stat().st_size == CHUNK
    assert mounted.process.poll() is None
    assert "refs.1.parq" in mounted.log()


def test_a_transient_record_error_is_retried(http, http_root: Path, mount) -> None:
    data = data_file(http_root, "pqt-data.bin", 6 * CHUNK)
    name = build(http_root, "pqt.parq", f"{http.url}/pqt-data.bin")
    root = mount(f"{http.url}/{name}", "--timeout", "10").mountpoint
    http.fault(f"/{name}/x/refs.2.parq", "500", count=2)
    assert run("cat", root / "x" / "4").stdout == data[4 * CHUNK : 5 * CHUNK]
    assert http.stats()["faults_left"] == []


def test_a_failing_listing_is_eio_then_recovers(http, http_root: Path, mount) -> None:
    data = data_file(http_root, "pql-data.bin", 6 * CHUNK)
    name = build(http_root, "pql.parq", f"{http.url}/pql-data.bin")
    mounted = mount(f"{http.url}/{name}", "--timeout", "10")
    root = mounted.mountpoint
    http.fault(f"/{name}/x", "500", count=-1)
    assert_eio("ls", root / "x")
    # a lookup needs no listing
    assert (root / "x" / "1").read_bytes() == data[CHUNK : 2 * CHUNK]
    http.clear_faults()
    assert run("ls", root / "x").stdout.split() == [b"0", b"1", b"2", b"3", b"4", b"5"]
    assert mounted.process.poll() is None


def test_a_listing_of_a_huge_grid_does_not_stall_lookups(http, http_root: Path, mount) -> None:
    """An `ls` of a 10**7-chunk array over a store that cannot list loads its records one
    readdir call at a time, in worker threads: while one stalls, another array's chunk
    answers at once; the listing ends with EIO at the deadline."""
    data = data_file(http_root, "pqb-data.bin", 4 * CHUNK)
    url = f"{http.url}/pqb-data.bin"
    root_dir = http_root / "pqb.parq"
    size = 100_000
    write_set(
        root_dir,
        {"big/.zarray": zarray([10**7], [1]), "y/.zarray": zarray([4 * CHUNK], [CHUNK])},
        record_size=size,
    )
    for record in range(8):  # short records: 3 chunks each
        write_record(root_dir / "big" / f"refs.{record}.parq", [url] * 3, [0, 1, 2], [1] * 3)
    write_ranges(root_dir, "y", url, CHUNK, 4, record_size=size)
    http.fault("/pqb.parq/big/refs.5.parq", "stall", count=-1)
    mounted = mount(f"{http.url}/pqb.parq", "--timeout", "8")
    root = mounted.mountpoint
    listing = subprocess.Popen(
        ["ls", "-U", "-1", str(root / "big")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.5)
        result = run("stat", "-c", "%s", root / "y" / "2")
        # Not timed: the lookup was answered while the listing still waits.
        assert listing.poll() is None, "the listing should still wait on the stalled record"
        assert result.stdout.strip() == str(CHUNK).encode()
        out, err = listing.communicate(timeout=60)
    finally:
        if listing.poll() is None:
            listing.kill()
            listing.wait()
    assert listing.returncode != 0 and "Input/output error" in err
    shown = out.split()
    assert shown[:15] == [str(r * size + i) for r in range(5) for i in range(3)]
    assert (root / "y" / "3").read_bytes() == data[3 * CHUNK : 4 * CHUNK]
    assert mounted.process.poll() is None


def test_refused_rows_are_eio_never_fill_values(http, http_root: Path, mount) -> None:
    """Rows whose reference refmount refuses (a negative offset, a local file in a set
    read over HTTP, a negative size) are keys all the same: they list and stat, their
    reads are EIO with a log line naming the key and the reason, and zarr raises instead
    of printing the fill value; the other chunks read exactly."""
    (http_root / "pqr-data.bin").write_bytes(bytes([1, 2, 3, 4]))
    url = f"{http.url}/pqr-data.bin"
    root = http_root / "pqr.parq"
    meta = {".zgroup": {"zarr_format": 2}, "b/.zarray": zarray([1], [1], fill_value=7)}
    write_set(root, {**meta, "a/.zarray": zarray([4], [1], fill_value=7)}, record_size=4)
    local = str(http_root / "pqr-data.bin")  # the right bytes, but local: refused
    write_record(root / "a" / "refs.0.parq", [url, url, local, url], [0, -1, 2, 3], [1, 1, 1, 1])
    write_record(root / "b" / "refs.0.parq", [url], [0], [-1])
    mounted = mount(f"{http.url}/pqr.parq")
    mnt = mounted.mountpoint
    assert sorted(os.listdir(mnt / "a")) == [".zarray", "0", "1", "2", "3"]
    assert [os.stat(mnt / "a" / str(i)).st_size for i in range(4)] == [1, 1, 1, 1]
    assert os.stat(mnt / "b" / "0").st_size == 1  # no usable size: 1 byte, so reads ask
    for key in ["a/1", "a/2", "b/0"]:
        assert_eio("cat", mnt / key)
    assert [(mnt / "a" / str(i)).read_bytes() for i in (0, 3)] == [b"\x01", b"\x04"]
    for name in ["a", "b"]:
        with pytest.raises(OSError) as raised:
            zarr.open_array(mnt / name, mode="r")[:]
        assert raised.value.errno == errno.EIO, name
    log = mounted.log()
    record = "pqr.parq/a/refs.0.parq"
    assert f"a/1: row 1 of {http.url}/{record}: negative offset or size (-1, 1): refused" in log
    assert f"a/2: row 2 of {http.url}/{record}: target {local!r} is a local file" in log
    assert "b/0: row 0 of " in log and "negative offset or size (0, -1): refused" in log
    assert log.count("negative offset or size (-1, 1)") == 1  # once, however often read
    assert mounted.process.poll() is None

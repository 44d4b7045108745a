"""--disk-cache through real mounts: bytes kept across remounts, never stale, never
corrupt, bounded, shared by several daemons at once; read with real processes (cat)
against the range server, whose request log says what crossed the network."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from refmount.cache.disk.tier import UNIT
from tests.support.mounting import Mounted, unmount
from tests.support.remote_files import write_refs
from tests.support.servers import RangeServer
from tests.support.watching import Sampled, eventually, free_bytes

#: Mounting a tmpfs and giving a directory to another user need root.
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (tmpfs, chown)")
CHUNK = 100_000  # bytes per chunk key (whole references: one entry each)
CHUNKS = 24
BIG = 3 << 20  # one file read whole by a stream (block parts: 256 KiB entries)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[RangeServer]:
    """A range server that sends ETag and Last-Modified, over a fresh directory."""
    root = tmp_path / "www"
    root.mkdir()
    with RangeServer(root, validators=True) as server:
        yield server


@pytest.fixture
def data_set(served: RangeServer, tmp_path: Path) -> Callable[[int], dict[str, bytes]]:
    """``data_set(seed)`` writes the data files and a reference set ``refs.json`` of
    chunk keys and one big whole file; returns what each key must read as."""

    def make(seed: int) -> dict[str, bytes]:
        rng = random.Random(seed)
        blob = rng.randbytes(CHUNK * CHUNKS)
        big = rng.randbytes(BIG)
        (served.root / "chunks.bin").write_bytes(blob)
        (served.root / "big.bin").write_bytes(big)
        refs: dict[str, object] = {".zgroup": '{"zarr_format": 2}'}
        expected = {}
        for i in range(CHUNKS):
            refs[f"c/{i}"] = [f"{served.url}/chunks.bin", i * CHUNK, CHUNK]
            expected[f"c/{i}"] = blob[i * CHUNK : (i + 1) * CHUNK]
        refs["big"] = [f"{served.url}/big.bin", 0, BIG]
        expected["big"] = big
        write_refs(tmp_path, refs)
        return expected

    return make


class Mounts:
    """Mounts made by a test, each on a fresh directory; all stopped at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[Mounted] = []

    def __call__(self, *args: str, refs: Path | None = None) -> Mounted:
        n = len(self.started)
        mountpoint = self.tmp_path / f"mnt{n}"
        mountpoint.mkdir()
        mounted = Mounted(
            refs or self.tmp_path / "refs.json",
            mountpoint,
            ["--xattrs", *args],
            self.tmp_path / f"refmount{n}.log",
        )
        self.started.append(mounted)
        return mounted

    def stop_all(self) -> None:
        for mounted in self.started:
            mounted.stop()


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[Mounts]:
    made = Mounts(tmp_path)
    yield made
    made.stop_all()


def cat(path: Path) -> bytes:
    return subprocess.run(["cat", str(path)], capture_output=True, check=True).stdout


def read_all(mnt: Path, expected: dict[str, bytes]) -> None:
    for key, want in expected.items():
        got = cat(mnt / key)
        assert len(got) == len(want), key
        assert got == want, key


def stats(mnt: Path) -> dict[str, int]:
    return json.loads(os.getxattr(mnt, "user.refmount.stats"))


def entries(cache: Path) -> list[Path]:
    return [p for p in (cache / "data").glob("*/*") if p.is_file()]


def entry_bytes(cache: Path) -> int:
    """Bytes the entries take (those another process evicts meanwhile count nothing)."""
    total = 0
    for path in entries(cache):
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_blocks * 512
    return total


def stop(mounted: Mounted) -> None:
    assert mounted.stop() == 0, mounted.log()


def test_a_remount_reads_yesterdays_bytes_without_fetching_them(
    served: RangeServer, data_set: Callable[[int], dict[str, bytes]], mounts: Mounts, tmp_path: Path
) -> None:
    expected = data_set(1)
    cache = tmp_path / "cache"
    first = mounts("--disk-cache", str(cache))
    read_all(first.mountpoint, expected)
    stop(first)  # a clean stop flushes nothing that matters: entries are written as fetched
    assert entries(cache), "nothing was kept"
    served.reset_stats()

    second = mounts("--disk-cache", str(cache))
    read_all(second.mountpoint, expected)
    log = served.stats()
    assert log["ranges"] == [], "bytes crossed the network again"
    assert log["requests"] <= 2  # one HEAD per object: its version
    counters = stats(second.mountpoint)
    assert counters["disk_hits"] > 0
    assert counters["disk_hit_bytes"] >= CHUNK * CHUNKS + BIG
    assert counters["disk_corrupt"] == 0
    status = subprocess.run(
        [sys.executable, "-m", "refmount", "status", str(second.mountpoint)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "disk hits" in status and "disk corrupt found" in status


def test_two_sets_referencing_the_same_bytes_share_entries(
    served: RangeServer, data_set: Callable[[int], dict[str, bytes]], mounts: Mounts, tmp_path: Path
) -> None:
    expected = data_set(2)
    other = tmp_path / "other"
    other.mkdir()
    refs = json.loads((tmp_path / "refs.json").read_text())["refs"]
    # The same chunks under other names, in another set.
    write_refs(other, {f"again/{k}": v for k, v in refs.items() if k.startswith("c/")})
    cache = tmp_path / "cache"
    first = mounts("--disk-cache", str(cache))
    read_all(first.mountpoint, {k: v for k, v in expected.items() if k.startswith("c/")})
    stop(first)
    served.reset_stats()
    second = mounts("--disk-cache", str(cache), refs=other / "refs.json")
    read_all(
        second.mountpoint, {f"again/{k}": v for k, v in expected.items() if k.startswith("c/")}
    )
    assert served.stats()["ranges"] == []


def test_a_replaced_object_reads_new_bytes_never_old(
    served: RangeServer, data_set: Callable[[int], dict[str, bytes]], mounts: Mounts, tmp_path: Path
) -> None:
    old = data_set(3)
    cache = tmp_path / "cache"
    first = mounts("--disk-cache", str(cache))
    read_all(first.mountpoint, old)
    stop(first)
    time.sleep(0.01)  # a new mtime even on a coarse clock
    new = data_set(4)  # same names, same sizes, new bytes: new ETag and mtime
    assert new["c/0"] != old["c/0"]
    second = mounts("--disk-cache", str(cache))
    read_all(second.mountpoint, new)


@pytest.mark.parametrize("damage", ["flip", "truncate", "zero", "empty"])
def test_a_damaged_entry_is_detected_removed_and_refetched(
    damage: str,
    served: RangeServer,
    data_set: Callable[[int], dict[str, bytes]],
    mounts: Mounts,
    tmp_path: Path,
) -> None:
    expected = data_set(7)
    chunks = {k: v for k, v in expected.items() if k.startswith("c/")}
    cache = tmp_path / "cache"
    first = mounts("--disk-cache", str(cache))
    read_all(first.mountpoint, chunks)
    stop(first)
    damaged = entries(cache)
    assert damaged
    for path in damaged:
        blob = bytearray(path.read_bytes())
        if damage == "flip":
            blob[len(blob) // 2] ^= 0x01
        elif damage == "truncate":
            del blob[len(blob) - 1000 :]
        elif damage == "zero":
            blob[-4096:] = bytes(4096)
        else:
            blob = bytearray()
        path.write_bytes(bytes(blob))
    served.reset_stats()
    second = mounts("--disk-cache", str(cache))
    read_all(second.mountpoint, chunks)
    counters = stats(second.mountpoint)
    assert counters["disk_corrupt"] == len(damaged)
    assert counters["disk_hits"] == 0
    refetched = sum(end - start for _, start, end in served.stats()["ranges"])
    assert refetched >= CHUNK * CHUNKS
    stop(second)
    # Rewritten whole: a third mount reads them from disk.
    served.reset_stats()
    third = mounts("--disk-cache", str(cache))
    read_all(third.mountpoint, chunks)
    assert served.stats()["ranges"] == []


def test_objects_without_a_validator_are_kept_only_when_declared_immutable(
    tmp_path: Path, mounts: Mounts
) -> None:
    root = tmp_path / "plain"
    root.mkdir()
    data = random.Random(8).randbytes(CHUNK * 4)
    (root / "x.bin").write_bytes(data)
    with RangeServer(root) as server:  # no ETag, no Last-Modified
        refs = {f"c/{i}": [f"{server.url}/x.bin", i * CHUNK, CHUNK] for i in range(4)}
        write_refs(tmp_path, refs)
        expected = {f"c/{i}": data[i * CHUNK : (i + 1) * CHUNK] for i in range(4)}
        cache = tmp_path / "cache"
        plain = mounts("--disk-cache", str(cache))
        read_all(plain.mountpoint, expected)
        assert stats(plain.mountpoint)["disk_bypassed"] > 0
        stop(plain)
        assert entries(cache) == []
        immutable = mounts("--disk-cache", str(cache), "--disk-cache-immutable")
        read_all(immutable.mountpoint, expected)
        stop(immutable)
        assert entries(cache)
        server.reset_stats()
        again = mounts("--disk-cache", str(cache), "--disk-cache-immutable")
        read_all(again.mountpoint, expected)
        assert server.stats()["ranges"] == []


def test_sigkill_while_filling_leaves_only_whole_entries(
    served: RangeServer, data_set: Callable[[int], dict[str, bytes]], mounts: Mounts, tmp_path: Path
) -> None:
    expected = data_set(9)
    cache = tmp_path / "cache"
    rng = random.Random(9)
    keys = list(expected)
    for round_ in range(8):
        mounted = mounts("--disk-cache", str(cache))
        killer = ThreadPoolExecutor(1)
        # Kill at a different moment each round, while reads fill the cache.
        delay = rng.uniform(0.0, 0.4)
        killed = killer.submit(lambda m=mounted, d=delay: (time.sleep(d), m.process.kill()))
        for key in rng.sample(keys, len(keys)):
            try:
                got = (mounted.mountpoint / key).read_bytes()
            except OSError:
                break  # the daemon is gone
            assert got == expected[key], f"round {round_}: {key}"
        killed.result()
        killer.shutdown()
        mounted.process.wait(10)
        unmount(mounted.mountpoint)
    final = mounts("--disk-cache", str(cache))
    read_all(final.mountpoint, expected)
    counters = stats(final.mountpoint)
    assert counters["disk_corrupt"] == 0
    stop(final)  # its own temporary files and lock go with it; the dead ones' went at start
    assert list((cache / "tmp").iterdir()) == []
    assert list((cache / "locks").iterdir()) == []


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str, inodes: int, mounts: Mounts) -> Iterator[Path]:
    """A tmpfs of ``size`` and ``inodes`` mounted on ``path`` while the block runs; the
    ``mounts`` (which may use it) stopped before it goes."""
    path.mkdir()
    options = f"size={size},nr_inodes={inodes}"
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        mounts.stop_all()
        subprocess.run(["umount", str(path)], check=True)


def read_at_once(mnts: list[Path], expected: dict[str, bytes], readers: int = 8) -> None:
    """Every key read twice through each mount by ``readers`` threads at once (cat)."""
    reads = [(mnt, key) for mnt in mnts for key in expected] * 2
    random.Random(len(reads)).shuffle(reads)
    with ThreadPoolExecutor(readers) as pool:
        for (_, key), got in zip(reads, pool.map(lambda r: cat(r[0] / r[1]), reads), strict=True):
            assert len(got) == len(expected[key]), key
            assert got == expected[key], key


def total_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


#: How far the free space may fall below ``--disk-cache-min-free``: the one entry a
#: writer may have on its way (a whole unit and its header), and the index's growth.
FLOOR_SLACK = UNIT + 8192


def held_floor(cache: Path, mnts: list[Path], expected: dict[str, bytes]) -> None:
    """Read every key through ``mnts`` at once with the free space of ``cache`` (half of
    it the floor) sampled all along, as a user would see it: the least seen stays within
    one entry of the floor."""
    floor = total_bytes(cache) // 2
    # A start finds the disk as it was left; it evicts down to the floor in the background.
    eventually(lambda: free_bytes(cache) >= floor, f"{cache} freed down to the floor")
    with Sampled(lambda: free_bytes(cache)) as free:
        read_at_once(mnts, expected)
    assert free.least is not None
    assert free.least >= floor - FLOOR_SLACK, (
        f"{free.least >> 10} KiB free at least (of {free.samples} samples): the floor is "
        f"{floor >> 10} KiB"
    )


def wrote_and_evicted(mnts: list[Path], evictions: int = 1) -> bool:
    """Whether every mount has written entries, and ``evictions`` at least were made."""
    counters = [stats(mnt) for mnt in mnts]
    written = all(c["disk_written_entries"] > 0 for c in counters)
    return written and sum(c["disk_evictions"] for c in counters) >= evictions


@needs_root
def test_a_full_small_tmpfs_never_reaches_the_reader(
    served: RangeServer, data_set: Callable[[int], dict[str, bytes]], mounts: Mounts, tmp_path: Path
) -> None:
    expected = data_set(10)
    with small_tmpfs(tmp_path / "tmpfs", "1m", 64, mounts) as cache:
        # Limits beyond what the filesystem has: the disk says ENOSPC first.
        mounted = mounts(
            "--disk-cache", str(cache), "--disk-cache-size", "100M", "--disk-cache-min-free", "0"
        )
        read_all(mounted.mountpoint, expected)
        read_all(mounted.mountpoint, expected)
        eventually(lambda: wrote_and_evicted([mounted.mountpoint], 0), "entries written")
        stop(mounted)
        assert entry_bytes(cache) <= 1 << 20
        # The free-space floor: half of it kept free while readers fill the cache.
        limited = mounts(
            "--disk-cache", str(cache), "--disk-cache-size", "100M", "--disk-cache-min-free", "50%"
        )
        held_floor(cache, [limited.mountpoint], expected)
        # The floor let some in, evicting others (the writer's work, behind the reads).
        eventually(lambda: wrote_and_evicted([limited.mountpoint]), "entries written, evicted")
        stop(limited)


@needs_root
def test_two_mounts_sharing_a_small_tmpfs_hold_its_floor_together(
    served: RangeServer, data_set: Callable[[int], dict[str, bytes]], mounts: Mounts, tmp_path: Path
) -> None:
    """Each process reserves what it writes in the shared index: the other sees it."""
    expected = data_set(12)
    with small_tmpfs(tmp_path / "tmpfs", "2m", 512, mounts) as cache:
        args = ["--disk-cache", str(cache), "--disk-cache-size", "100M"]
        both = [mounts(*args, "--disk-cache-min-free", "50%") for _ in range(2)]
        mnts = [m.mountpoint for m in both]
        held_floor(cache, mnts, expected)
        eventually(lambda: wrote_and_evicted(mnts), "entries written by both, evicted")
        assert all(stats(mnt)["disk_corrupt"] == 0 for mnt in mnts)
        for m in both:
            stop(m)


@pytest.mark.parametrize("processes", [2, 4])
def test_mounts_sharing_a_directory_with_a_tiny_limit(
    processes: int,
    served: RangeServer,
    data_set: Callable[[int], dict[str, bytes]],
    mounts: Mounts,
    tmp_path: Path,
) -> None:
    expected = data_set(11)
    cache = tmp_path / "cache"
    limit = 6 * CHUNK
    mounted = [
        mounts("--disk-cache", str(cache), "--disk-cache-size", str(limit), "--cache-size", "1M")
        for _ in range(processes)
    ]
    keys = [k for k in expected if k.startswith("c/")]

    def reader(n: int) -> int:
        rng = random.Random(n)
        checked = 0
        for _ in range(60):
            key = rng.choice(keys)
            mnt = mounted[rng.randrange(processes)].mountpoint
            assert cat(mnt / key) == expected[key], key
            checked += 1
        return checked

    # What the entries take, sampled all through the reads: the limit and one entry.
    with Sampled(lambda: entry_bytes(cache)) as held, ThreadPoolExecutor(processes * 2) as pool:
        assert sum(pool.map(reader, range(processes * 2))) == 60 * processes * 2
    assert held.greatest is not None and held.greatest <= limit + UNIT + 8192, held.greatest
    for m in mounted:
        assert stats(m.mountpoint)["disk_corrupt"] == 0
    # Evictions are the writers' (behind the reads): counted once they are done.
    eventually(
        lambda: sum(stats(m.mountpoint)["disk_evictions"] for m in mounted) > 0, "an eviction"
    )
    assert entry_bytes(cache) <= limit + UNIT + 8192


@needs_root
def test_a_directory_of_another_user_is_a_clear_error_at_start(tmp_path: Path) -> None:
    cache = tmp_path / "theirs"
    cache.mkdir()
    os.chown(cache, 65534, 65534)
    (tmp_path / "refs.json").write_text(json.dumps({"version": 1, "refs": {"a": "x"}}))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "refmount", str(tmp_path / "refs.json"), str(mnt),
         "--disk-cache", str(cache)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    unmount(mnt)
    assert done.returncode == 1
    assert "belongs to uid 65534" in done.stderr


@needs_root
def test_a_read_only_directory_is_a_clear_error_at_start(tmp_path: Path) -> None:
    cache = tmp_path / "ro"
    cache.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(cache)], check=True)
    try:
        (tmp_path / "refs.json").write_text(json.dumps({"version": 1, "refs": {"a": "x"}}))
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        done = subprocess.run(
            [sys.executable, "-m", "refmount", str(tmp_path / "refs.json"), str(mnt),
             "-o", f"disk_cache={cache}"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        unmount(mnt)
        assert done.returncode == 1
        assert "Read-only file system" in done.stderr
    finally:
        subprocess.run(["umount", str(cache)], check=False)

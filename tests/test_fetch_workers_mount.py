"""Fetch worker processes (``--fetch-workers``) through real mounts, against real servers
on 127.0.0.1: a worker killed mid-read gives EIO or the right bytes and is replaced, 200
readers at once get every byte right, no worker outlives its daemon however it ends, a
stalled store is EIO after its attempts, and a changed object is EIO at once."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from refmount.service.status import mount_status, render
from tests.support.direct import read_once
from tests.support.mounting import Mounted, mount_background
from tests.support.nginx import NginxServer
from tests.support.servers import RangeServer
from tests.test_checksums_mount import cat, mount_checksummed
from tests.test_workers import alive

CHUNK = 256 << 10


def chunked_set(directory: Path, url: str, count: int, name: str = "refs.json") -> Path:
    """A reference set of ``count`` keys ``c/<k>``, chunk ``k`` of the file at ``url``."""
    refs = {f"c/{k}": [url, k * CHUNK, CHUNK] for k in range(count)}
    path = directory / name
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path


def put(root: Path, name: str, size: int) -> bytes:
    data = random.Random(name).randbytes(size)
    (root / name).write_bytes(data)
    return data


def chunk(data: bytes, k: int) -> bytes:
    return data[k * CHUNK : (k + 1) * CHUNK]


def fetch_status(mounted: Mounted) -> dict:
    return mount_status(str(mounted.mountpoint))["fetch"]


def until(condition: Callable[[], bool], attempts: int = 2000) -> None:
    """Wait for ``condition``, looking every 10 ms (bounded by attempts, not by time)."""
    for _ in range(attempts):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError("the condition never held")


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.update(int(c) for c in (task / "children").read_text().split())
    return found


def started_workers(mounted: Mounted, count: int = 2) -> list[int]:
    until(lambda: len(fetch_status(mounted)["fetch_worker_pids"]) == count)
    pids = fetch_status(mounted)["fetch_worker_pids"]
    assert set(pids) <= children(mounted.pid)
    return pids


def test_a_fetch_worker_killed_mid_read_gives_eio_or_the_bytes_and_is_replaced(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    www = tmp_path / "www"
    www.mkdir()
    data = put(www, "killed.bin", 24 * CHUNK)
    with RangeServer(www, delay=0.5) as slow:
        refs = chunked_set(tmp_path, f"{slow.url}/killed.bin", 24)
        mounted = mount(refs, "--fetch-workers", "2", "--read-ahead-kb", "0")
        victim, survivor = started_workers(mounted)
        results: dict[int, bytes | OSError] = {}

        def read(k: int) -> None:
            try:
                results[k] = read_once(mounted.mountpoint / "c" / str(k))
            except OSError as exc:
                results[k] = exc

        readers = [threading.Thread(target=read, args=(k,)) for k in range(12)]
        for reader in readers:
            reader.start()
        until(lambda: fetch_status(mounted)["fetch_worker_requests"] >= 4)
        os.kill(victim, signal.SIGKILL)
        for reader in readers:
            reader.join()
        for k, got in results.items():
            if isinstance(got, OSError):
                assert got.errno == errno.EIO, got
            else:
                assert got == chunk(data, k)
        for k in range(24):  # every chunk, the killed ones again, from fresh reads
            assert read_once(mounted.mountpoint / "c" / str(k)) == chunk(data, k)
        status = fetch_status(mounted)
        assert status["fetch_worker_deaths"] == 1
        assert status["fetch_worker_starts"] == 3
        assert victim not in status["fetch_worker_pids"]
        assert survivor in status["fetch_worker_pids"]
        assert not alive(victim)
        assert mounted.process.poll() is None
        shown = render(mount_status(str(mounted.mountpoint)))
        new = next(pid for pid in status["fetch_worker_pids"] if pid != survivor)
        assert f"2 running (pids {', '.join(map(str, sorted([new, survivor])))})" in shown
        assert "3 started, 1 died" in shown


def test_200_readers_at_once_read_every_byte(
    tmp_path: Path, nginx: NginxServer, mount: Callable[..., Mounted]
) -> None:
    name = f"fw-200-{os.getpid()}.bin"
    data = put(nginx.root, name, 100 * CHUNK)
    refs = chunked_set(tmp_path, f"{nginx.url}/{name}", 100)
    mounted = mount(refs, "-o", "fetch_workers=2")  # as an fstab line gives it
    order = [k % 100 for k in range(200)]
    random.Random(7).shuffle(order)

    def read(k: int) -> bool:
        return (mounted.mountpoint / "c" / str(k)).read_bytes() == chunk(data, k)

    with ThreadPoolExecutor(200) as readers:
        assert all(readers.map(read, order))
    started_workers(mounted)  # the second may still be starting on a loaded machine
    status = fetch_status(mounted)
    assert status["fetch_worker_deaths"] == 0
    assert status["bytes_fetched"] >= len(data)


@pytest.mark.parametrize("end", ["unmount", "SIGTERM", "SIGKILL"])
def test_no_fetch_worker_outlives_its_daemon(
    tmp_path: Path, nginx: NginxServer, mount: Callable[..., Mounted], end: str
) -> None:
    name = f"fw-end-{end}-{os.getpid()}.bin"
    data = put(nginx.root, name, 4 * CHUNK)
    mounted = mount(chunked_set(tmp_path, f"{nginx.url}/{name}", 4), "--fetch-workers", "2")
    assert (mounted.mountpoint / "c" / "1").read_bytes() == chunk(data, 1)
    pids = started_workers(mounted)
    if end == "unmount":
        os.system(f"fusermount3 -u {mounted.mountpoint}")
    else:
        mounted.process.send_signal(getattr(signal, end))
    mounted.process.wait(30)
    until(lambda: not [pid for pid in pids if alive(pid)])
    mounted.stop()


def test_a_background_mount_returns_with_its_workers_started(
    tmp_path: Path, nginx: NginxServer
) -> None:
    name = f"fw-background-{os.getpid()}.bin"
    data = put(nginx.root, name, 2 * CHUNK)
    refs = chunked_set(tmp_path, f"{nginx.url}/{name}", 2)
    with mount_background(refs, tmp_path / "mnt", ["--fetch-workers", "2"]) as mounted:
        assert mounted.pid is not None
        pids = mount_status(str(mounted.path))["fetch"]["fetch_worker_pids"]
        assert len(pids) == 2  # at once: the first reads need not wait for them
        assert set(pids) <= children(mounted.pid)
        assert (mounted.path / "c" / "1").read_bytes() == chunk(data, 1)
    until(lambda: not [pid for pid in pids if alive(pid)])


def test_a_stalled_store_is_eio_after_its_attempts_and_the_daemon_keeps_answering(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    www = tmp_path / "www"
    www.mkdir()
    stalled = put(www, "stalled.bin", 2 * CHUNK)
    fine = put(www, "fine.bin", 2 * CHUNK)
    with RangeServer(www) as server:
        refs = {
            "stalled": [f"{server.url}/stalled.bin", 0, CHUNK],
            "fine": [f"{server.url}/fine.bin", CHUNK, CHUNK],
        }
        (tmp_path / "refs.json").write_text(json.dumps({"version": 1, "refs": refs}))
        mounted = mount(
            tmp_path / "refs.json", "--fetch-workers", "2", "--timeout", "1", "--retries", "2"
        )
        started_workers(mounted)
        server.fault("/stalled.bin", "stall", count=-1)
        errors: list[OSError] = []

        def read_stalled() -> None:
            try:
                read_once(mounted.mountpoint / "stalled")
            except OSError as exc:
                errors.append(exc)

        reader = threading.Thread(target=read_stalled)
        reader.start()
        until(lambda: fetch_status(mounted)["fetch_worker_requests"] >= 1)
        assert read_once(mounted.mountpoint / "fine") == fine[CHUNK:]  # answered meanwhile
        reader.join()
        assert [e.errno for e in errors] == [errno.EIO]
        ranges = [r for r in server.stats()["ranges"] if r[0] == "/stalled.bin"]
        requests = server.stats()["requests"]
        assert ranges == []  # a stalled request never starts its body
        assert requests == 3 + 1  # three attempts at the stalled file, one for the fine one
        assert fetch_status(mounted)["fetch_worker_deaths"] == 0
        assert stalled  # written, never served


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_changed_object_is_eio_without_retries_as_in_process(
    tmp_path: Path, workers: str
) -> None:
    www = tmp_path / "www"
    www.mkdir()
    data = put(www, "data.bin", 4 * CHUNK)
    with RangeServer(www, validators=True) as server:
        refs = {"changed": [f"{server.url}/data.bin", 0, CHUNK]}
        refs["unchecked"] = [f"{server.url}/data.bin", CHUNK, CHUNK]
        checksums = {"changed": {"etag": '"not-its-etag"'}}
        with mount_checksummed(
            tmp_path, "changed", refs, checksums, "--fetch-workers", workers, "--retries", "3"
        ) as mounted:
            server.reset_stats()
            with pytest.raises(OSError) as failed:
                read_once(mounted.mountpoint / "changed")
            assert failed.value.errno == errno.EIO
            assert server.stats()["requests"] == 1
            assert cat(mounted.mountpoint / "unchecked").stdout == chunk(data, 1)

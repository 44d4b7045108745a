"""Reloading REFS while mounted: SIGHUP, --reload-interval, and what readers see.

The kernel caches entries and attributes for an hour; each check here goes through the
mount with separate processes (``stat``, ``ls``, ``cat``, a Python reader) and expects
the new tree within :data:`SETTLE` seconds of the signal.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from refmount.refs import RefSet, open_refset
from refmount.tree import Owner, StaleInode, Tree
from tests.conftest import REFMOUNT, Mounted, is_mounted, unmount
from tests.support.servers import RangeServer

SETTLE = 15.0  # seconds within which a reload shows through the mount


def write_refs(path: Path, refs: dict[str, object]) -> Path:
    # Written whole then renamed, as a generator of reference sets should.
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({"version": 1, "refs": refs}))
    partial.rename(path)
    return path


def run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def cat(path: Path) -> bytes:
    return subprocess.run(["cat", str(path)], capture_output=True, timeout=60).stdout


def inode(path: Path) -> int:
    return int(run(["stat", "-c", "%i", str(path)]).stdout)


def eventually(check: Callable[[], bool], what: str, timeout: float = SETTLE) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.1)


def test_sighup_shows_added_removed_and_changed_keys(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    refs = write_refs(
        tmp_path / "refs.json",
        {"same": "unchanged", "changed": "old bytes", "gone": "bye", "d/x": "in d", "e/y": "e"},
    )
    m = mount(refs)
    root = m.mountpoint
    same_inode = inode(root / "same")
    assert cat(root / "changed") == b"old bytes"
    assert run(["stat", str(root / "new")]).returncode != 0  # cached as missing
    assert run(["stat", str(root / "d" / "z")]).returncode != 0
    assert sorted(os.listdir(root)) == ["changed", "d", "e", "gone", "same"]
    opened = open(root / "changed", "rb")  # noqa: SIM115 - held across the reload
    try:
        write_refs(
            refs,
            {"same": "unchanged", "changed": "new and longer bytes", "new": "fresh",
             "d/z": "also new", "d/x": "in d"},
        )  # fmt: skip
        m.process.send_signal(signal.SIGHUP)

        eventually(lambda: cat(root / "new") == b"fresh", "a new key")
        eventually(lambda: cat(root / "changed") == b"new and longer bytes", "a changed key")
        assert run(["stat", "-c", "%s", str(root / "changed")]).stdout.strip() == "20"
        assert cat(root / "d" / "z") == b"also new"
        assert sorted(os.listdir(root)) == ["changed", "d", "new", "same"]
        for removed in ("gone", "e", "e/y"):
            result = run(["stat", str(root / removed)])
            assert "No such file or directory" in result.stderr, (removed, result)
        assert inode(root / "same") == same_inode  # unchanged: same inode
        assert cat(root / "same") == b"unchanged"
        assert opened.read() == b"old bytes"  # opened before: the bytes it opened
    finally:
        opened.close()
    assert m.process.poll() is None
    assert "reloaded" in m.log()


def test_a_broken_reload_keeps_the_old_tree(tmp_path: Path, mount: Callable[..., Mounted]) -> None:
    refs = write_refs(tmp_path / "refs.json", {"a": "alpha"})
    m = mount(refs)
    for broken in ('{"version": 1, "refs": {"a": ', json.dumps({"version": 7, "refs": {}})):
        refs.write_text(broken)
        m.process.send_signal(signal.SIGHUP)
        eventually(lambda: m.log().count("reload of") >= 1, "the failure logged")
        assert cat(m.mountpoint / "a") == b"alpha"
        assert os.listdir(m.mountpoint) == ["a"]
    assert "still serving the previous set" in m.log()
    write_refs(refs, {"b": "beta"})
    m.process.send_signal(signal.SIGHUP)
    eventually(lambda: os.listdir(m.mountpoint) == ["b"], "a good set after broken ones")
    assert m.process.poll() is None


def test_reload_interval_follows_a_regenerated_set(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    refs = write_refs(tmp_path / "refs.json", {"t/0": "day one"})
    m = mount(refs, "--reload-interval", "1")
    assert os.listdir(m.mountpoint / "t") == ["0"]
    write_refs(refs, {"t/0": "day one", "t/1": "day two"})
    eventually(lambda: cat(m.mountpoint / "t" / "1") == b"day two", "the polled change")
    assert sorted(os.listdir(m.mountpoint / "t")) == ["0", "1"]


# -- reads in flight over HTTP -----------------------------------------------------------------

READER = """
import hashlib, sys
path, step = sys.argv[1], int(sys.argv[2])
with open(path, "rb") as f:
    first = f.read(step)
    print("opened", flush=True)
    sys.stdin.readline()
    print(hashlib.sha256(first + f.read()).hexdigest(), flush=True)
"""


@pytest.fixture
def slow_http(tmp_path: Path) -> Iterator[RangeServer]:
    root = tmp_path / "www"
    root.mkdir()
    with RangeServer(root, delay=0.3) as server:
        yield server


def test_reads_in_flight_finish_on_what_they_opened(
    tmp_path: Path, slow_http: RangeServer, mount: Callable[..., Mounted]
) -> None:
    size, keys = 300_000, 6
    old_data, new_data = os.urandom(size * keys), os.urandom(size * keys)
    (slow_http.root / "old.bin").write_bytes(old_data)
    (slow_http.root / "new.bin").write_bytes(new_data)

    def refs_of(name: str) -> dict[str, object]:
        refs: dict[str, object] = {f"k{i}": [f"{slow_http.url}/{name}", i * size, size]
                                   for i in range(keys)}  # fmt: skip
        refs["kept"] = [f"{slow_http.url}/old.bin", 0, size]
        return refs

    def digest(data: bytes, i: int) -> str:
        return hashlib.sha256(data[i * size : (i + 1) * size]).hexdigest()

    refs = write_refs(tmp_path / "refs.json", refs_of("old.bin"))
    m = mount(refs, "--cache-size", "64M")
    held = subprocess.Popen(
        [sys.executable, "-c", READER, str(m.mountpoint / "k0"), "1000"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert held.stdout is not None and held.stdin is not None
    assert held.stdout.readline().strip() == "opened"
    readers = [
        subprocess.Popen(["cat", str(m.mountpoint / f"k{i}")], stdout=subprocess.PIPE)
        for i in range(1, keys)
    ]
    write_refs(refs, refs_of("new.bin"))
    m.process.send_signal(signal.SIGHUP)  # while the readers wait on the slow server

    for i, reader in enumerate(readers, start=1):
        out, _ = reader.communicate(timeout=60)
        assert reader.returncode == 0
        assert hashlib.sha256(out).hexdigest() in (digest(old_data, i), digest(new_data, i)), i
    held.stdin.write("go\n")
    held.stdin.flush()
    assert held.stdout.readline().strip() == digest(old_data, 0)  # never a mix
    assert held.wait(30) == 0
    for i in range(keys):
        eventually(
            lambda i=i: (
                hashlib.sha256(cat(m.mountpoint / f"k{i}")).hexdigest() == digest(new_data, i)
            ),
            f"k{i} from the new set",
        )
    assert cat(m.mountpoint / "kept") == old_data[:size]
    assert m.process.poll() is None


# -- systemd: RELOADING=1 and READY=1 around a reload ------------------------------------------


def test_notify_reloading_then_ready(tmp_path: Path) -> None:
    refs = write_refs(tmp_path / "refs.json", {"a": "alpha"})
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    address = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(address)
    listener.settimeout(30)
    daemon = subprocess.Popen(
        [*REFMOUNT, str(refs), str(mountpoint), "--foreground"],
        env={**os.environ, "NOTIFY_SOCKET": address},
        stderr=subprocess.DEVNULL,
    )

    def until(text: str) -> list[str]:
        seen = []
        while not any(text in m for m in seen):
            seen.append(listener.recv(4096).decode())
        return seen

    try:
        until("READY=1")
        write_refs(refs, {"a": "alpha", "b": "beta"})
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        daemon.send_signal(signal.SIGHUP)
        (reloading,) = [m for m in until("RELOADING=1") if "RELOADING=1" in m]
        usec = re.search(r"^MONOTONIC_USEC=(\d+)$", reloading, re.MULTILINE)
        assert usec and before <= int(usec[1]) <= before + 30_000_000, reloading
        ready = until("READY=1")[-1]
        assert "STATUS=serving" in ready, ready
        assert (mountpoint / "b").read_bytes() == b"beta"

        refs.write_text("{ not json")
        daemon.send_signal(signal.SIGHUP)
        until("RELOADING=1")
        failed = until("READY=1")[-1]
        assert "reload failed" in failed and "refs.json" in failed, failed
        assert (mountpoint / "b").read_bytes() == b"beta"
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(20) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        listener.close()
        unmount(mountpoint)
    assert not is_mounted(mountpoint)


# -- inode numbers across reloads (the tree alone) ---------------------------------------------


def test_inodes_across_two_reloads(tmp_path: Path) -> None:
    def refset(refs: dict[str, object]) -> RefSet:
        return open_refset(str(write_refs(tmp_path / f"r{len(refs)}.json", refs)))

    async def no_remote(url: str) -> int:
        raise AssertionError(url)

    async def lookup(tree: Tree, key: str) -> int | None:
        parent = 1
        *dirs, name = key.split("/")
        for part in dirs:
            found = await tree.lookup(parent, part)
            assert found is not None
            parent = found
        return await tree.lookup(parent, name)

    async def main() -> None:
        first = Tree(refset({"a": "1", "b": "2", "d/c": "3"}), Owner(0, 0), no_remote)
        a, b, c = [await lookup(first, k) for k in ("a", "b", "d/c")]
        # The kernel knows a, b and d/c; "0" sorts first and shifts every file id.
        second, changes = first.successor(
            refset({"0": "new", "a": "1", "b": "changed", "d/c": "3", "d/e": "4"}), [a, b, c]
        )
        assert (await lookup(second, "a"), await lookup(second, "d/c")) == (a, c)
        new_b = await lookup(second, "b")
        assert new_b not in (None, a, b, c)
        assert (await second.ref(new_b)).data == b"changed"
        with pytest.raises(StaleInode):
            await second.ref(b)
        assert changes.pinned == 2 and changes.entries == [(1, "b")]
        inodes = {await lookup(second, k) for k in ("0", "a", "b", "d/c", "d/e")}
        assert len(inodes) == 5  # none shared
        # A third set: a is still known and unchanged, d is gone with d/c.
        third, changes = second.successor(refset({"a": "1", "z": "9"}), [a, new_b, c])
        assert await lookup(third, "a") == a
        assert await lookup(third, "d") is None and third.file_id(c) is None
        d = await lookup(second, "d")
        assert set(changes.entries) == {(1, "b"), (d, "c"), (1, "d")}
        assert (await third.ref(a)).data == b"1"

    trio.run(main)


def test_a_stalled_reload_neither_blocks_reads_nor_the_stop(
    tmp_path: Path, http: RangeServer, mount: Callable[..., Mounted]
) -> None:
    (http.root / "stalling-refs.json").write_text(json.dumps({"version": 1, "refs": {"a": "x"}}))
    m = mount(f"{http.url}/stalling-refs.json")
    http.fault("/stalling-refs.json", "stall", count=-1)
    m.process.send_signal(signal.SIGHUP)
    eventually(lambda: "reloading" in m.log(), "the reload to start")
    for _ in range(3):  # the loop serves while the reload waits on the store (forever)
        assert cat(m.mountpoint / "a") == b"x"
        assert run(["ls", str(m.mountpoint)]).stdout.split() == ["a"]
    m.process.send_signal(signal.SIGTERM)
    assert m.process.wait(SETTLE) == 0
    assert not is_mounted(m.mountpoint)

"""Fixtures for tests that mount for real and read through separate processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.nginx import NginxServer
from tests.support.servers import MotoServer, RangeServer

REFMOUNT = [sys.executable, "-m", "refmount"]


def is_mounted(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/mounts") as mounts:
        return any(line.split()[1] == target for line in mounts)


def unmount(path: Path) -> None:
    """Unmount, lazily if a plain unmount fails: a test never leaves a mount behind."""
    if not is_mounted(path):
        return
    subprocess.run(["fusermount3", "-u", str(path)], capture_output=True)
    if is_mounted(path):
        subprocess.run(["fusermount3", "-u", "-z", str(path)], capture_output=True)


def daemon_pids(mountpoint: Path) -> list[int]:
    """Pids of refmount daemons serving ``mountpoint`` (ours: the path is a tmp_path)."""
    pids = []
    needle = str(mountpoint).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        is_daemon = b"refmount" in argv or os.path.basename(argv[0]) == b"refmount"
        if is_daemon and needle in argv:  # not libfuse's fusermount3 auto_unmount helper
            pids.append(int(entry.name))
    return pids


class Mounted:
    """A refmount daemon started by a test, in the foreground (so the test owns its pid)."""

    def __init__(self, refs: str | Path, mountpoint: Path, args: list[str], log: Path) -> None:
        self.mountpoint = mountpoint
        self.log_path = log
        self._log = log.open("wb")
        self.process = subprocess.Popen(
            [*REFMOUNT, str(refs), str(mountpoint), "-f", *args],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while not is_mounted(mountpoint):
            if self.process.poll() is not None:
                raise RuntimeError(f"refmount exited {self.process.returncode}: {self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"refmount did not mount within 60 s: {self.log()}")
            time.sleep(0.02)
        os.stat(mountpoint)  # answers once the daemon's loop runs

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        unmount(self.mountpoint)
        self._log.close()
        return self.process.returncode


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Callable[..., Mounted]]:
    """``mount(refs, *args)`` mounts ``refs`` on a fresh directory; all are unmounted after."""
    started: list[Mounted] = []

    def _mount(refs: str | Path, *args: str) -> Mounted:
        mountpoint = tmp_path / f"mnt{len(started)}"
        mountpoint.mkdir()
        mounted = Mounted(refs, mountpoint, list(args), tmp_path / f"refmount{len(started)}.log")
        started.append(mounted)
        return mounted

    yield _mount
    for mounted in started:
        mounted.stop()


@pytest.fixture
def mountpoint(tmp_path: Path) -> Iterator[Path]:
    """An empty directory for tests that run refmount themselves; cleaned up after."""
    path = tmp_path / "mnt"
    path.mkdir()
    yield path
    for pid in daemon_pids(path):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while daemon_pids(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    unmount(path)


@pytest.fixture(scope="session")
def http_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("http-root")


@pytest.fixture(scope="session")
def http_server(http_root: Path) -> Iterator[RangeServer]:
    """An HTTP server on 127.0.0.1 that honours Range, serving ``http_root``."""
    with RangeServer(http_root) as server:
        yield server


@pytest.fixture
def http(http_server: RangeServer) -> Iterator[RangeServer]:
    """The HTTP server with no faults and fresh statistics."""
    http_server.clear_faults()
    http_server.reset_stats()
    yield http_server
    http_server.clear_faults()


@pytest.fixture(scope="session")
def nginx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NginxServer]:
    """nginx on 127.0.0.1 (ranges honoured, no delay) serving a fresh directory, ``.root``."""
    with NginxServer(tmp_path_factory.mktemp("nginx-root")) as server:
        yield server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


def refmount_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the command line as a user would, capturing what it says."""
    return subprocess.run(
        [*REFMOUNT, *args], capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


assert shutil.which("fusermount3"), "fusermount3 is needed: apt-get install fuse3"

"""Fixtures for tests that mount for real and read through separate processes."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.azurite import Azurite
from tests.support.gcs import FakeGcsServer

# Re-exported: test modules import these names from here.
from tests.support.mounting import (  # noqa: F401
    REFMOUNT,
    Mounted,
    daemon_pids,
    is_mounted,
    unmount,
)
from tests.support.nginx import NginxServer
from tests.support.rawserver import Answer, RawServer
from tests.support.remote_files import Remote
from tests.support.servers import MotoServer, RangeServer


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


@pytest.fixture
def raw_server() -> Iterator[Callable[[Answer], RawServer]]:
    """``raw_server(answer)`` starts a :class:`RawServer` on 127.0.0.1, closed after."""
    servers: list[RawServer] = []

    def start(answer: Answer) -> RawServer:
        servers.append(RawServer(answer))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture(scope="session")
def nginx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NginxServer]:
    """nginx on 127.0.0.1 (ranges honoured, no delay) serving a fresh directory, ``.root``."""
    with NginxServer(tmp_path_factory.mktemp("nginx-root")) as server:
        yield server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[FakeGcsServer]:
    """fake-gcs-server on 127.0.0.1 (Google Cloud Storage)."""
    with FakeGcsServer() as server:
        yield server


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    """Azurite's blob service on 127.0.0.1 (Azure Blob Storage)."""
    with Azurite() as server:
        yield server


def refmount_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the command line as a user would, capturing what it says."""
    return subprocess.run(
        [*REFMOUNT, *args], capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


assert shutil.which("fusermount3"), "fusermount3 is needed: apt-get install fuse3"


@pytest.fixture
def remote(http: RangeServer, request: pytest.FixtureRequest) -> Callable[..., Remote]:
    """``remote(suffix, size)`` writes a file of random bytes on the range server, named
    after the test."""
    prefix = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)

    def put(suffix: str, size: int = 1000) -> Remote:
        name = f"{prefix}-{suffix}.bin"
        data = random.Random(name).randbytes(size)
        (http.root / name).write_bytes(data)
        return Remote(name, f"{http.url}/{name}", data)

    return put

"""The opt-in per-READ timer (``REFMOUNT_REQUEST_TIMING``): off, it logs nothing; on, it
logs a summary every N READs while the bytes read stay exact."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Mounted
from tests.support.remote_files import write_refs
from tests.support.servers import RangeServer

CHUNK = 4096


@pytest.fixture
def chunk_refs(tmp_path: Path, http: RangeServer, http_root: Path) -> tuple[Path, bytes]:
    data = bytes(range(256)) * (8 * CHUNK // 256)
    (http_root / "timed.bin").write_bytes(data)
    refs = {f"c/{k}": [f"{http.url}/timed.bin", k * CHUNK, CHUNK] for k in range(8)}
    return write_refs(tmp_path, refs), data


def read_all(mountpoint: Path) -> bytes:
    names = [f"c/{k}" for k in range(8)]
    done = subprocess.run(["cat", *names], cwd=mountpoint, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_timer_logs_a_summary_every_n_reads(
    chunk_refs: tuple[Path, bytes],
    mount: Callable[..., Mounted],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REFMOUNT_REQUEST_TIMING", "4")
    m = mount(chunk_refs[0])
    assert read_all(m.mountpoint) == chunk_refs[1]
    lines = [line for line in m.log().splitlines() if "READs in" in line]
    assert len(lines) == 2, m.log()  # eight READs, a summary every four
    for line in lines:
        assert re.search(r"4 READs in [\d.]+ s \(\d+ fetches through", line), line
        assert re.search(r"read \d+ \(tree \d+, cache \d+\)", line), line
        assert "MainThread" in line, line  # CPU per READ, by thread
    assert "request timing on: a summary every 4 READs" in m.log()


@pytest.mark.parametrize("value", ["", "0", "many"])
def test_the_timer_is_off_unless_asked(
    value: str,
    chunk_refs: tuple[Path, bytes],
    mount: Callable[..., Mounted],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REFMOUNT_REQUEST_TIMING", value)
    m = mount(chunk_refs[0])
    assert read_all(m.mountpoint) == chunk_refs[1]
    assert "READs in" not in m.log()
    assert ("is not a number of READs" in m.log()) == (value == "many")

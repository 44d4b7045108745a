"""The file inodes the daemon believes the kernel holds (``kernel_files`` in ``refmount
status``), after listings, stats, forgets and reloads.

The kernel takes a lookup reference for each entry of a READDIRPLUS reply and none for a
plain READDIR entry.  With ``readdirplus_auto`` (refmount's pyfuse3 patch) it asks for
READDIRPLUS at the start of a listing only, so a plain ``ls`` of a large directory gets
its first reply's entries (as many as fit in one reply buffer, thousands) with lookups
and the rest without; ``ls -l`` looks up every entry.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Mounted, refmount_cli
from tests.support.mounting import STOCK_PYFUSE3

#: Far more entries than one READDIRPLUS reply holds (about 6,500 of these per MiB).
FILES = 20_000
NAMES = [f"f{k:05d}" for k in range(FILES)]
SETTLE = 15.0  # seconds for the kernel's FORGETs, or a reload, to arrive


def write_refs(path: Path, content: str) -> Path:
    refs = {f"d/{name}": content for name in NAMES}
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({"version": 1, "refs": refs}))
    partial.rename(path)
    return path


def kernel_files(mountpoint: Path) -> int:
    result = refmount_cli("status", "--json", str(mountpoint))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["kernel_files"]


def ls(*args: str) -> list[str]:
    result = subprocess.run(["ls", *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def drop_dentries_and_inodes() -> None:
    """The kernel forgets the inodes nobody uses: FORGET for each of the mount's."""
    Path("/proc/sys/vm/drop_caches").write_text("2")


def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + SETTLE
    while not check():
        assert time.monotonic() < deadline, f"not within {SETTLE:g} s: {what}"
        time.sleep(0.1)


@pytest.fixture
def refs(tmp_path: Path) -> Path:
    return write_refs(tmp_path / "refs.json", "old")


def test_plain_listing_counts_only_what_the_kernel_looked_up(
    refs: Path, mount: Callable[..., Mounted]
) -> None:
    m = mount(refs)
    directory = m.mountpoint / "d"
    assert kernel_files(m.mountpoint) == 0
    assert ls(directory) == NAMES
    # The first reply is READDIRPLUS (its entries are looked up); the rest are plain.
    after_ls = kernel_files(m.mountpoint)
    assert 0 < after_ls < FILES // 2, after_ls
    assert ls(directory) == NAMES
    assert kernel_files(m.mountpoint) == after_ls  # the same first entries again
    long_listing = ls("-l", directory)
    assert len(long_listing) == FILES + 1 and long_listing[-1].split()[4] == "3"
    assert kernel_files(m.mountpoint) == FILES  # every entry stat'ed: looked up


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping the kernel's caches needs root")
def test_forgotten_inodes_leave_the_count(refs: Path, mount: Callable[..., Mounted]) -> None:
    m = mount(refs)
    assert len(ls("-l", m.mountpoint / "d")) == FILES + 1
    assert kernel_files(m.mountpoint) == FILES
    drop_dentries_and_inodes()
    eventually(lambda: kernel_files(m.mountpoint) == 0, "every FORGET")


def test_stock_pyfuse3_lists_with_readdirplus_and_counts_every_entry(
    refs: Path, tmp_path: Path
) -> None:
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    with Mounted(refs, mountpoint, [], tmp_path / "log", command=STOCK_PYFUSE3) as m:
        assert "without refmount's patch" in m.log()
        assert ls(mountpoint / "d") == NAMES
        assert kernel_files(mountpoint) == FILES


def test_reload_after_a_plain_listing_invalidates_the_entries_the_kernel_holds(
    refs: Path, mount: Callable[..., Mounted]
) -> None:
    m = mount(refs)
    directory = m.mountpoint / "d"
    assert ls(directory) == NAMES
    held = kernel_files(m.mountpoint)
    assert 0 < held < FILES // 2, held
    first, last = directory / NAMES[0], directory / NAMES[-1]
    assert first.stat().st_size == 3  # attributes from the READDIRPLUS reply

    write_refs(refs, "new and longer")
    m.process.send_signal(signal.SIGHUP)
    eventually(lambda: "reloaded" in m.log(), "the reload")
    assert first.stat().st_size == len("new and longer")
    assert last.stat().st_size == len("new and longer")
    assert first.read_bytes() == b"new and longer"
    found = re.search(r"reloaded .*: (\d+) entries invalidated", m.log())
    assert found is not None, m.log()
    assert int(found.group(1)) < FILES // 2  # what the kernel held, not every entry

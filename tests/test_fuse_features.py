"""Fewer FUSE round trips with refmount's pyfuse3 patch, and the same bytes without it.

``bash .ci/setup`` builds pyfuse3 with ``.ci/pyfuse3-refmount.patch``.  The requests the
daemon receives are counted with strace (``tests/support/fuse_requests.py``); the stock
path runs the same daemon with the patch hidden (``STOCK_PYFUSE3``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from refmount import tuning
from tests.support.fuse_requests import count_requests
from tests.support.mounting import STOCK_PYFUSE3, Mounted

FILES = 40
SIZE = 100_000


@pytest.fixture
def chunk_refs(tmp_path: Path) -> tuple[Path, bytes]:
    data = os.urandom(FILES * SIZE)
    (tmp_path / "data.bin").write_bytes(data)
    refs = {f"c/{k:03d}": [str(tmp_path / "data.bin"), k * SIZE, SIZE] for k in range(FILES)}
    refs["d/e/.zattrs"] = "{}"
    path = tmp_path / "refs.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path, data


def cat_all(mountpoint: Path) -> bytes:
    keys = [f"c/{k:03d}" for k in range(FILES)]
    return subprocess.run(["cat", *keys], cwd=mountpoint, capture_output=True, check=True).stdout


def test_setup_installed_the_patched_pyfuse3() -> None:
    assert tuning.PYFUSE3_PATCHED, "bash .ci/setup did not build pyfuse3 with refmount's patch"


def test_patched_pyfuse3_reads_files_without_open_or_release(
    tmp_path: Path, chunk_refs: tuple[Path, bytes]
) -> None:
    refs, data = chunk_refs
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    with Mounted(refs, mountpoint, ["--allow-local"], tmp_path / "log") as m:
        assert "with refmount's patch" in m.log()
        cold = count_requests(m.pid, ["cat", *[f"c/{k:03d}" for k in range(FILES)]], mountpoint)
        assert cat_all(mountpoint) == data  # again, warm: from the page cache
        warm = count_requests(m.pid, ["cat", *[f"c/{k:03d}" for k in range(FILES)]], mountpoint)
        listing = count_requests(m.pid, ["find", ".", "-type", "f"], mountpoint)
        assert subprocess.run(["stat", "-c", "%s", "c/007"], cwd=mountpoint, capture_output=True,
                              text=True, check=True).stdout.strip() == str(SIZE)  # fmt: skip
    # One OPEN (and FLUSH) per mount: answered ENOSYS, the kernel stops sending them.
    assert cold["OPEN"] == cold["FLUSH"] == 1 and cold["RELEASE"] == 0, cold
    assert cold["LOOKUP"] == FILES + 1 and cold["READ"] >= FILES, cold  # c/ and its files
    assert warm["OPEN"] == warm["RELEASE"] == warm["LOOKUP"] == 0, warm
    assert warm["READ"] < FILES, warm
    assert listing["READDIR"] >= 1, listing  # plain listings where nobody stats


def test_stock_pyfuse3_path_opens_and_releases_and_reads_the_same_bytes(
    tmp_path: Path, chunk_refs: tuple[Path, bytes]
) -> None:
    refs, data = chunk_refs
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    with Mounted(refs, mountpoint, ["--allow-local"], tmp_path / "log", command=STOCK_PYFUSE3) as m:
        assert "without refmount's patch" in m.log()
        warm_up = cat_all(mountpoint)
        counts = count_requests(m.pid, ["cat", *[f"c/{k:03d}" for k in range(FILES)]], mountpoint)
        listing = count_requests(m.pid, ["find", ".", "-type", "f"], mountpoint)
        files = subprocess.run(["find", ".", "-type", "f"], cwd=mountpoint, capture_output=True,
                               text=True, check=True).stdout.split()  # fmt: skip
    assert warm_up == data
    assert counts["OPEN"] == counts["RELEASE"] == FILES, counts
    assert listing["READDIR"] == 0 and listing["READDIRPLUS"] >= 1, listing
    assert len(files) == FILES + 1

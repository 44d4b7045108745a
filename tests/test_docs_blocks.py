"""Every shell block of README.md and docs/ marked runnable, run against real mounts.

A block runs as a user would run it from the checkout, with this checkout's refmount
first on the PATH; where the page shows the block's output, the output must be that.  A
block must leave nothing mounted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.doc_blocks import Block, blocks_in, output_matches
from tests.support.mounting import REPO, child_env, unmount

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCKS = [block for page in PAGES for block in blocks_in(page)]


#: Set in a block's environment, so that the daemons it starts (and only those: other
#: tests may be mounting at the same time) can be told apart.
MARKER = "REFMOUNT_DOCS_BLOCK"


def refmount_mounts() -> set[str]:
    with open("/proc/mounts") as mounts:
        return {line.split()[1] for line in mounts if line.split()[2] == "fuse.refmount"}


def daemons_of(marker: str) -> dict[int, list[str]]:
    """The processes still running with ``MARKER=marker`` in their environment, and their
    arguments."""
    found = {}
    needle = f"{MARKER}={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                argv = (entry / "cmdline").read_bytes().decode(errors="replace")
                found[int(entry.name)] = argv.split("\0")
        except OSError:
            continue
    return found


def left_mounted(marker: str) -> list[str]:
    """Mount points still served by a daemon the block started."""
    mounted = refmount_mounts()
    return sorted(
        {
            os.path.realpath(arg)
            for argv in daemons_of(marker).values()
            for arg in argv
            if arg and os.path.realpath(arg) in mounted
        }
    )


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``refmount`` and ``python`` as a user has them once set up: this checkout's."""
    path = tmp_path_factory.mktemp("bin")
    # Scripts, not links: a venv's python is itself only when run by its own path.
    for name, command in (("refmount", "-m refmount "), ("python", "")):
        (path / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" {command}"$@"\n')
        (path / name).chmod(0o755)
    return path


def test_the_readme_runs_its_main_examples() -> None:
    marked = [block for block in BLOCKS if block.page.name == "README.md"]
    assert len(marked) >= 4, [block.name for block in marked]
    assert all(block.output for block in marked)


@pytest.mark.parametrize("block", BLOCKS, ids=[block.name for block in BLOCKS])
def test_block_runs(block: Block, bin_dir: Path) -> None:
    env = child_env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env[MARKER] = marker = uuid.uuid4().hex
    try:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block.code],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        left = left_mounted(marker)
        for mountpoint in left:
            unmount(Path(mountpoint))
    assert done.returncode == 0, f"{block.name} failed:\n{done.stdout}\n{done.stderr}"
    assert not left, f"{block.name} left mounted: {sorted(left)}"
    if block.output is not None:
        assert output_matches(block.output, done.stdout), (
            f"{block.name} printed:\n{done.stdout}\nwhere the page shows:\n{block.output}"
        )


def test_output_matching() -> None:
    assert output_matches("a\n...\nd\n", "a\nb\nc\nd\n")
    assert output_matches("a  \n...\n", "a\n")
    assert not output_matches("a\nd\n", "a\nb\nd\n")
    assert not output_matches("a\n", "a\nb\n")

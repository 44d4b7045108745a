"""Every shell block of README.md and docs/ marked runnable, run against real mounts.

A block runs as a user would run it from the checkout, with this checkout's refmount
first on the PATH; where the page shows the block's output, the output must be that.  A
block must leave nothing mounted and nothing running: the servers it starts (moto,
nginx, on 127.0.0.1) it stops by the pid it started them with.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.support.doc_blocks import Block, blocks_in, output_matches
from tests.support.mounting import REPO, child_env, unmount

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCKS = [block for page in PAGES for block in blocks_in(page)]


#: Set in a block's environment, so that the daemons and servers it starts (and only
#: those: other tests may be mounting at the same time) can be told apart.
MARKER = "REFMOUNT_DOCS_BLOCK"
#: How long the processes a block started may take to leave once it is done: a daemon
#: exits after its unmount, a server after its SIGTERM, each in its own time.
LEAVING_TIMEOUT = 30.0


def refmount_mounts() -> set[str]:
    with open("/proc/mounts") as mounts:
        return {line.split()[1] for line in mounts if line.split()[2] == "fuse.refmount"}


def _session_of(entry: Path) -> int:
    """The session id of ``/proc/PID``'s process (after its parenthesised name)."""
    return int((entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[3])


def daemons_of(marker: str, session: int | None = None) -> dict[int, list[str]]:
    """The processes still running with ``MARKER=marker`` in their environment, or in
    ``session``, and their arguments.  Both, since a daemon starts a session of its own
    and nginx writes its process title over its environment."""
    found = {}
    needle = f"{MARKER}={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ours = needle in (entry / "environ").read_bytes().split(b"\0")
            if ours or (session is not None and _session_of(entry) == session):
                argv = (entry / "cmdline").read_bytes().decode(errors="replace")
                if argv:  # not a zombie
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


def left_running(marker: str, session: int) -> dict[int, list[str]]:
    """The processes the block started that are still running once given
    :data:`LEAVING_TIMEOUT` to leave; SIGTERMed, so that a failing block leaves nothing."""
    deadline = time.monotonic() + LEAVING_TIMEOUT
    while (running := daemons_of(marker, session)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    return running


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
def test_block_runs(block: Block, bin_dir: Path, tmp_path: Path) -> None:
    env = child_env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env[MARKER] = marker = uuid.uuid4().hex
    # Files, not pipes: a server the block failed to stop would hold a pipe open, and
    # the test would wait for its end instead of reporting it.
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    try:
        with stdout.open("w") as out, stderr.open("w") as err:
            shell = subprocess.Popen(
                ["bash", "-euo", "pipefail", "-c", block.code],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=err,
                start_new_session=True,  # its session id: its pid
            )
            try:
                returncode = shell.wait(timeout=600)
            except subprocess.TimeoutExpired:
                shell.kill()
                returncode = shell.wait()
    finally:
        left = left_mounted(marker)
        for mountpoint in left:
            unmount(Path(mountpoint))
        running = left_running(marker, shell.pid)
    printed = stdout.read_text()
    assert returncode == 0, f"{block.name} failed:\n{printed}\n{stderr.read_text()}"
    assert not left, f"{block.name} left mounted: {sorted(left)}"
    assert not running, f"{block.name} left running: {running}"
    if block.output is not None:
        assert output_matches(block.output, printed), (
            f"{block.name} printed:\n{printed}\nwhere the page shows:\n{block.output}"
        )


def test_output_matching() -> None:
    assert output_matches("a\n...\nd\n", "a\nb\nc\nd\n")
    assert output_matches("a  \n...\n", "a\n")
    assert not output_matches("a\nd\n", "a\nb\nd\n")
    assert not output_matches("a\n", "a\nb\n")

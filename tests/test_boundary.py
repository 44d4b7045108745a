"""The daemon's boundaries: one request never takes it down, a key never looks missing,
options it cannot hold are refused, a failed start leaves nothing behind, one mount per
directory, and REFS credentials shown nowhere.  Everything through real mounts and
processes."""

from __future__ import annotations

import contextlib
import fcntl
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import REFMOUNT, Mounted, daemon_pids, is_mounted, refmount_cli, unmount
from tests.support.servers import RangeServer

FAST = ["--timeout", "5", "--retries", "0"]


def run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, **kwargs
    )  # type: ignore[call-overload]


def write_refs(directory: Path, refs: dict[str, object], name: str = "refs.json") -> Path:
    path = directory / name
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path


def processes_mentioning(text: str) -> list[int]:
    """Live processes (not zombies) whose command line mentions ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if text.encode() not in (entry / "cmdline").read_bytes():
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state not in ("Z", "X"):
                found.append(int(entry.name))
    return found


def assert_eio(path: Path) -> None:
    result = run(["cat", str(path)])
    assert result.returncode != 0, path
    assert "Input/output error" in result.stderr, (path, result.stderr)


# -- one request never takes the daemon down ---------------------------------------------------


def test_odd_protocols_answer_eio_and_the_daemon_lives(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    """Protocols fsspec knows but that fail in ways nobody expected (a filesystem that
    needs arguments, a chained URL over a file that is no archive, a refused FTP
    connection) end as EIO for their key only."""
    not_a_zip = tmp_path / "not-a.zip"
    not_a_zip.write_bytes(b"plain bytes, no archive")
    odd = {
        "reference": ["reference://x", 0, 10],
        "ftp": ["ftp://127.0.0.1:1/x", 0, 10],
        "tar": [f"tar::file://{not_a_zip}", 0, 3],
        "dir": [f"dir::file://{not_a_zip}", 0, 3],
        "zip": [f"zip://a::file://{not_a_zip}", 0, 3],
        "whole-reference": ["reference://y"],
    }
    m = mount(write_refs(tmp_path, {"good": "hello", **odd}), *FAST)

    for key in odd:
        assert_eio(m.mountpoint / key)
        assert m.process.poll() is None, m.log()
        assert run(["cat", str(m.mountpoint / "good")]).stdout == "hello"
    stat = run(["stat", str(m.mountpoint / "whole-reference")])
    assert stat.returncode != 0 and "Input/output error" in stat.stderr, stat.stderr
    listing = run(["ls", str(m.mountpoint)])
    assert sorted(listing.stdout.split()) == sorted(["good", *odd]), listing
    log = m.log()
    # Each distinct failure is logged, naming the first key it met; "whole-reference"
    # fails exactly as "reference" does (the same filesystem cannot be made).
    for key in odd.keys() - {"whole-reference"}:
        assert f"of {key!r} failed" in log, key


class _HugeHead(http.server.BaseHTTPRequestHandler):
    """A store that says its file is 2**63 bytes: more than ``st_size`` can hold."""

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(1 << 63))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_GET(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def huge_store() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HugeHead)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_size_beyond_st_size_is_eio(
    tmp_path: Path, huge_store: str, mount: Callable[..., Mounted]
) -> None:
    m = mount(write_refs(tmp_path, {"huge": [f"{huge_store}/huge.bin"], "ok": "fine"}), *FAST)
    stat = run(["stat", "-c", "%s", str(m.mountpoint / "huge")])
    assert stat.returncode != 0 and "Input/output error" in stat.stderr, stat
    assert_eio(m.mountpoint / "huge")
    assert run(["cat", str(m.mountpoint / "ok")]).stdout == "fine"
    assert m.process.poll() is None
    assert str(1 << 63) in m.log()


def test_a_missing_target_is_eio_never_enoent(
    tmp_path: Path, http: RangeServer, mount: Callable[..., Mounted]
) -> None:
    """ENOENT would tell zarr the key does not exist (it reads fill values): a key of the
    set whose target is gone, remote or local, whole or a range, is EIO everywhere."""
    (http.root / "present.bin").write_bytes(b"0123456789")
    refs = {
        "whole-404": [f"{http.url}/gone.bin"],
        "range-404": [f"{http.url}/gone.bin", 0, 5],
        "local-missing": [str(tmp_path / "gone.bin"), 0, 5],
        "whole-local-missing": [str(tmp_path / "gone.bin")],
        "present": [f"{http.url}/present.bin", 2, 3],
    }
    m = mount(write_refs(tmp_path, refs), *FAST)
    for key in ("whole-404", "range-404", "local-missing", "whole-local-missing"):
        path = m.mountpoint / key
        assert_eio(path)
        probe = run([sys.executable, "-c", "import os, sys; os.stat(sys.argv[1])", str(path)])
        assert "FileNotFoundError" not in probe.stderr, (key, probe.stderr)
    assert run(["cat", str(m.mountpoint / "present")]).stdout == "234"
    missing = run(["stat", str(m.mountpoint / "not-a-key")])
    assert "No such file or directory" in missing.stderr  # ENOENT only for no such key


# -- options the kernel cannot hold ------------------------------------------------------------


@pytest.mark.parametrize(
    "option",
    [["--uid", "4294967296"], ["--gid", "4294967295"], ["--max-background", "65536"],
     ["--read-ahead-kb", str(1 << 40)], ["--cache-size", "100T"], ["--cache-size", "10"],
     ["--retries", "100000"], ["--timeout", "1e300"], ["--ready-timeout", "1e20"],
     ["--max-requests", str(1 << 40)], ["-o", "uid=-1"], ["--reload-interval", "0"]],
    ids=lambda o: " ".join(o),
)  # fmt: skip
def test_option_values_the_kernel_cannot_hold_are_refused(
    option: list[str], tmp_path: Path, mountpoint: Path
) -> None:
    refs = write_refs(tmp_path, {"a": "alpha"})
    result = refmount_cli(str(refs), str(mountpoint), *option)
    assert result.returncode == 2, result
    name = option[1].split("=")[0] if option[0] == "-o" else option[0].lstrip("-")
    assert name.replace("_", "-") in result.stderr.replace("_", "-"), result.stderr
    assert "Traceback" not in result.stderr
    assert not is_mounted(mountpoint)


# -- a failed start leaves nothing behind ------------------------------------------------------

INJECT = """
import sys, trio
import refmount.tree as tree

original = tree.Tree.node

async def node(self, inode):
    if inode == tree.ROOT_INODE:
        if sys.argv[1] == "hang":
            await trio.sleep_forever()
        raise RuntimeError("injected root failure")
    return await original(self, inode)

tree.Tree.node = node
from refmount.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("fault", ["raise", "hang"])
@pytest.mark.parametrize("mode", ["background", "foreground"])
def test_a_mount_that_does_not_answer_is_taken_down(
    fault: str, mode: str, tmp_path: Path, mountpoint: Path
) -> None:
    """The root's first stat fails (an exception: EIO) or never answers: the start
    fails within the deadline, with a message, nothing mounted and no process left."""
    refs = write_refs(tmp_path, {"a": "alpha"})
    args = [str(refs), str(mountpoint), "--ready-timeout", "4"]
    if mode == "foreground":
        args.append("-f")
    result = run([sys.executable, "-c", INJECT, fault, *args])
    assert result.returncode == 1, result
    assert "refmount:" in result.stderr, result.stderr
    if fault == "raise":
        expected = f"refmount: the new mount on {mountpoint} fails: Input/output error"
        assert expected in result.stderr, result.stderr
    else:
        assert "within 4 s" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr.partition("injected root failure")[2], result.stderr
    deadline = time.monotonic() + 20
    while processes_mentioning(str(mountpoint)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_mentioning(str(mountpoint)) == []
    assert not is_mounted(mountpoint)
    assert os.listdir(mountpoint) == []


# -- one refmount per directory ----------------------------------------------------------------


def test_a_mountpoint_being_mounted_is_refused(tmp_path: Path, mountpoint: Path) -> None:
    refs = write_refs(tmp_path, {"a": "alpha"})
    fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what a refmount starting there holds
        result = refmount_cli(str(refs), str(mountpoint))
    finally:
        os.close(fd)
    assert result.returncode == 1
    assert f"another refmount is mounting on {mountpoint}" in result.stderr, result.stderr
    assert not is_mounted(mountpoint)


def test_two_refmounts_started_at_once_mount_once(tmp_path: Path, mountpoint: Path) -> None:
    refs = write_refs(tmp_path, {"a": "alpha"})
    starts = [
        subprocess.Popen(
            [*REFMOUNT, str(refs), str(mountpoint)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = [(p.wait(60), p.stderr.read()) for p in starts if p.stderr]
    assert sorted(code for code, _ in results) == [0, 1, 1, 1], results
    for code, message in results:
        if code:
            assert "another refmount is mounting" in message or "already" in message, message
    with open("/proc/mounts") as mounts:
        rows = [line.split() for line in mounts if line.split()[1] == str(mountpoint)]
    assert len(rows) == 1, rows
    assert run(["cat", str(mountpoint / "a")]).stdout == "alpha"


def test_a_non_empty_mountpoint_is_refused_unless_allowed(tmp_path: Path, mountpoint: Path) -> None:
    refs = write_refs(tmp_path, {"a": "alpha"})
    (mountpoint / "precious").write_text("mine")
    refused = refmount_cli(str(refs), str(mountpoint))
    assert refused.returncode == 1
    assert "not empty" in refused.stderr and "--nonempty" in refused.stderr, refused.stderr
    assert not is_mounted(mountpoint)

    allowed = refmount_cli(str(refs), str(mountpoint), "-o", "nonempty")
    assert allowed.returncode == 0, allowed.stderr
    assert os.listdir(mountpoint) == ["a"]
    unmount(mountpoint)
    assert (mountpoint / "precious").read_text() == "mine"


# -- REFS credentials are shown nowhere --------------------------------------------------------

SECRETS = ("hunter22", "s3cr3tvalue", "user1")


@pytest.mark.parametrize("how", ["env", "@file"])
def test_refs_credentials_are_shown_nowhere(
    how: str, tmp_path: Path, http: RangeServer, mountpoint: Path
) -> None:
    (http.root / "cred-refs.json").write_text(
        json.dumps({"version": 1, "refs": {"a": "alpha", "t": ["cred-data.bin", 2, 3]}})
    )
    (http.root / "cred-data.bin").write_bytes(b"0123456789")
    secret_url = http.url.replace("http://", "http://user1:hunter22@") + "/cred-refs.json"
    env = dict(os.environ)
    log = tmp_path / "daemon.log"
    args = [str(mountpoint), "--xattrs", "--log-level", "debug", "--log-file", str(log)]
    if how == "env":
        env["REFMOUNT_REFS"] = secret_url
    else:
        (tmp_path / "refs-url").write_text(secret_url + "\n")
        args.insert(0, f"@{tmp_path / 'refs-url'}")

    result = run([*REFMOUNT, *args], env=env)

    assert result.returncode == 0, result.stderr
    assert run(["cat", str(mountpoint / "t")]).stdout == "234"
    xattrs = run(["getfattr", "-d", "-m", "-", str(mountpoint / "t")]).stdout
    assert "cred-data.bin" in xattrs
    with open("/proc/mounts") as mounts:
        (row,) = [line for line in mounts if f" {mountpoint} " in line]
    assert row.split()[0] == f"{http.url}/cred-refs.json"
    (pid,) = daemon_pids(mountpoint)
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    for secret in SECRETS:
        for text in (row, cmdline, log.read_text(), xattrs, result.stderr):
            assert secret not in text, (secret, text)
    assert "mounted" in log.read_text()


def test_credentials_stay_out_of_errors(
    tmp_path: Path, http: RangeServer, mountpoint: Path
) -> None:
    secret_url = http.url.replace("http://", "http://user1:hunter22@") + "/no-such-refs.json"
    for args in ([secret_url, str(mountpoint)], [secret_url, str(mountpoint), "-f"]):
        result = refmount_cli(*args)
        assert result.returncode == 1, result
        assert "no-such-refs.json" in result.stderr, result.stderr
        for secret in SECRETS:
            assert secret not in result.stderr, result.stderr
        assert not is_mounted(mountpoint)


def test_refs_must_be_given_somehow(mountpoint: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REFMOUNT_REFS"}
    result = run([*REFMOUNT, str(mountpoint)], env=env)
    assert result.returncode == 2
    assert "REFMOUNT_REFS" in result.stderr

"""``refmount status MOUNTPOINT`` on live mounts, and how target URLs are shown.

The status is asked the way a user asks it (``python -m refmount status`` in its own
process) of daemons started by the ``mount`` fixture, reading over HTTP from the range
server on 127.0.0.1 so that the counters have something to count.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from refmount.redaction import display_url
from refmount.service.control import socket_path
from tests.conftest import Mounted, is_mounted, refmount_cli
from tests.support.servers import RangeServer


def status_json(mountpoint: Path) -> dict:
    result = refmount_cli("status", "--json", str(mountpoint))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def http_refs(tmp_path: Path, http: RangeServer) -> tuple[Path, bytes]:
    data = os.urandom(300_000)
    (http.root / "status.bin").write_bytes(data)
    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps({"version": 1, "refs": {
        "inline": "hello",
        "d/range": [f"{http.url}/status.bin", 1000, 200_000],
        "d/whole": [f"{http.url}/status.bin"],
        "stall": [f"{http.url}/status-stall.bin", 0, 10],
    }}))  # fmt: skip
    return refs, data


@pytest.mark.parametrize("options", [[], ["--xattrs"]], ids=["default", "xattrs"])
def test_counters_move_when_a_file_is_read(
    options: list[str], http_refs: tuple[Path, bytes], mount: Callable[..., Mounted]
) -> None:
    refs, data = http_refs
    m = mount(refs, *options)
    started = time.time()
    before = status_json(m.mountpoint)
    assert before["mountpoint"] == str(m.mountpoint)
    assert before["refs"] == f"file://{refs}"
    assert before["keys"] == 4
    assert before["last_reload"] is None
    assert before["reads_in_flight"] == 0
    assert before["pid"] == m.process.pid
    assert started - 120 < before["mounted_since"] <= time.time()

    read = subprocess.run(["cat", str(m.mountpoint / "d" / "range")], capture_output=True)
    assert read.stdout == data[1000:201_000]
    after = status_json(m.mountpoint)
    assert after["fetch"]["requests"] > before["fetch"]["requests"]
    assert after["fetch"]["bytes_fetched"] >= before["fetch"]["bytes_fetched"] + 200_000
    assert after["cache"]["misses"] > before["cache"]["misses"]
    assert after["fetch"]["errors"] == 0 and after["reads_in_flight"] == 0

    human = refmount_cli("status", str(m.mountpoint))
    assert human.returncode == 0, human.stderr
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in human.stdout.splitlines())
    assert rows["requests"] == f"{after['fetch']['requests']:,}"
    assert rows["keys"] == "4"
    assert rows["reads in flight"] == "0"
    assert rows["last reload"] == "never"
    assert rows["reference set"] == f"file://{refs}"


def test_reads_in_flight_and_errors(
    tmp_path: Path, http: RangeServer, mount: Callable[..., Mounted]
) -> None:
    (http.root / "status-stall.bin").write_bytes(b"s" * 10)
    refs = tmp_path / "stall.json"
    refs.write_text(json.dumps({"stall": [f"{http.url}/status-stall.bin", 0, 10]}))
    m = mount(refs, "--timeout", "3", "--retries", "0")
    os.stat(m.mountpoint / "stall")  # the size is in the reference: no request yet
    http.fault("/status-stall.bin", "stall", count=-1)
    reader = subprocess.Popen(["cat", str(m.mountpoint / "stall")], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while (now := status_json(m.mountpoint))["reads_in_flight"] < 1:
            assert time.monotonic() < deadline, now
            time.sleep(0.1)
        _, err = reader.communicate(timeout=30)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert reader.returncode != 0 and b"Input/output error" in err
    after = status_json(m.mountpoint)
    assert after["reads_in_flight"] == 0
    assert after["fetch"]["errors"] >= 1


def test_the_socket_is_private_and_removed_at_exit(
    http_refs: tuple[Path, bytes], mount: Callable[..., Mounted]
) -> None:
    m = mount(http_refs[0])
    path = socket_path(os.path.realpath(m.mountpoint), os.geteuid())
    st = os.stat(path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.geteuid()
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert m.stop() == 0
    assert not path.exists()


def test_a_killed_daemon_leaves_a_socket_the_next_one_replaces(
    http_refs: tuple[Path, bytes], mount: Callable[..., Mounted]
) -> None:
    refs = http_refs[0]
    m = mount(refs)
    path = socket_path(os.path.realpath(m.mountpoint), os.geteuid())
    m.process.send_signal(signal.SIGKILL)
    m.process.wait(20)
    deadline = time.monotonic() + 20
    while is_mounted(m.mountpoint):  # libfuse's auto_unmount clears the mount
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert path.exists()  # nobody removed the killed daemon's socket
    gone = refmount_cli("status", str(m.mountpoint))
    assert gone.returncode == 1 and "is not a refmount mount" in gone.stderr
    again = Mounted(refs, m.mountpoint, [], m.log_path.with_suffix(".again.log"))
    try:
        assert status_json(m.mountpoint)["pid"] == again.process.pid
    finally:
        again.stop()
    assert not path.exists()


def test_a_daemon_that_does_not_answer_is_named(
    http_refs: tuple[Path, bytes], mount: Callable[..., Mounted]
) -> None:
    m = mount(http_refs[0])
    m.process.send_signal(signal.SIGSTOP)
    try:
        hung = refmount_cli("status", str(m.mountpoint))
    finally:
        m.process.send_signal(signal.SIGCONT)
    assert hung.returncode == 1
    assert "did not answer within 10 s" in hung.stderr
    assert status_json(m.mountpoint)["pid"] == m.process.pid


def test_status_of_what_is_not_a_refmount_mount(tmp_path: Path) -> None:
    plain = refmount_cli("status", str(tmp_path))
    assert plain.returncode == 1
    assert plain.stderr.strip() == (
        f"refmount status: {tmp_path} is not a refmount mount (mounted there: nothing)"
    )
    proc = refmount_cli("status", "/proc")
    assert proc.returncode == 1 and "(mounted there: proc)" in proc.stderr
    missing = refmount_cli("status", str(tmp_path / "nowhere"))
    assert missing.returncode == 1 and "is not a refmount mount" in missing.stderr
    assert refmount_cli("status").returncode == 2


# -- how URLs are shown --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("/data/x.nc", "file:///data/x.nc"),
        ("file:///data/x.nc", "file:///data/x.nc"),
        ("local:///data/x.nc", "file:///data/x.nc"),
        ("/data/my file.nc", "file:///data/my file.nc"),
        ("https://user:pw@host:8443/x.nc?X-Amz-Signature=abc", "https://host:8443/x.nc"),
        ("s3://bucket/key.nc", "s3://bucket/key.nc"),
        ("gs://bucket/a/b", "gs://bucket/a/b"),
    ],
)
def test_display_url(url: str, shown: str) -> None:
    assert display_url(url) == shown


def test_display_url_makes_a_relative_path_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert display_url("x/y.nc") == f"file://{tmp_path}/x/y.nc"

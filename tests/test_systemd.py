"""The daemon under systemd: a valid unit, and the notify protocol spoken for real."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import is_mounted, unmount

UNIT = Path(__file__).parent.parent / "systemd" / "refmount@.service"


def test_unit_file_verifies_cleanly(tmp_path: Path) -> None:
    # Verify a copy whose ExecStart binary exists on this machine.
    unit = tmp_path / "refmount@.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/refmount", sys.executable))
    result = subprocess.run(
        ["systemd-analyze", "verify", f"{unit}"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == ""


def test_unit_keeps_the_mount_visible() -> None:
    settings = [line for line in UNIT.read_text().splitlines() if not line.startswith("#")]
    text = "\n".join(settings)
    assert "Type=notify" in text and "ExecStopPost=-/bin/fusermount3 -u -z %f" in text
    assert "ExecReload=/bin/kill -HUP $MAINPID" in text  # systemctl reload
    assert "${REFS}" not in text  # REFS comes by $REFMOUNT_REFS: not in the process list
    for forbidden in ("PrivateTmp", "ProtectSystem", "ProtectHome", "PrivateDevices"):
        assert forbidden not in text


def test_notify_ready_status_and_stopping(tmp_path: Path) -> None:
    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps({"a": "hello"}))
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    address = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(address)
    listener.settimeout(30)
    env = {**os.environ, "NOTIFY_SOCKET": address}
    daemon = subprocess.Popen(
        [sys.executable, "-m", "refmount", str(refs), str(mountpoint), "--foreground"],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        messages = []
        while not any("READY=1" in m for m in messages):
            messages.append(listener.recv(4096).decode())
        # READY comes only once the mount answers
        assert is_mounted(mountpoint)
        assert (mountpoint / "a").read_bytes() == b"hello"
        assert any(m.startswith("STATUS=loading") for m in messages)
        daemon.send_signal(signal.SIGTERM)
        assert "STOPPING=1" in listener.recv(4096).decode()
        assert daemon.wait(20) == 0
        deadline = time.monotonic() + 10
        while is_mounted(mountpoint) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not is_mounted(mountpoint)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        listener.close()
        unmount(mountpoint)


def test_fstab_style_mount_through_mount_fuse3(tmp_path: Path) -> None:
    """``mount -t fuse.refmount`` (what fstab does) runs ``refmount`` from the system PATH
    with ``-o`` options, mount-only ones included."""
    link = Path("/usr/local/bin/refmount")
    installed_here = not link.exists()
    if installed_here:
        link.symlink_to(Path(sys.executable).parent / "refmount")
    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps({"d/a": "hello"}))
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    try:
        result = subprocess.run(
            ["mount", "-t", "fuse.refmount", str(refs), str(mountpoint), "-o",
             "nofail,_netdev,x-systemd.automount,allow_other,uid=1234,umask=027,cache_size=64M"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        line = next(
            x for x in Path("/proc/mounts").read_text().splitlines() if str(mountpoint) in x
        )
        source, _, fstype, options = line.split()[:4]
        assert (source, fstype) == (str(refs), "fuse.refmount")
        assert {"ro", "nosuid", "nodev", "allow_other", "default_permissions"} <= set(
            options.split(",")
        )
        st = (mountpoint / "d" / "a").stat()
        assert (st.st_uid, oct(st.st_mode & 0o777)) == (1234, "0o440")
        assert (mountpoint / "d" / "a").read_bytes() == b"hello"
    finally:
        unmount(mountpoint)
        if installed_here:
            link.unlink()

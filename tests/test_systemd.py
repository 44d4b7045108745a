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

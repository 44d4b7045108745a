"""The service pieces a sysadmin installs: every unit verifies cleanly, the examples do
what their comments say, and loading reports progress to systemd and to a terminal."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from refmount.options import parse_args
from refmount.service.progress import LoadProgress
from tests.conftest import REFMOUNT, is_mounted, unmount

ROOT = Path(__file__).parent.parent
SYSTEM_UNIT = ROOT / "systemd" / "refmount@.service"
USER_UNIT = ROOT / "systemd" / "refmount-user@.service"
EXAMPLES = ROOT / "examples" / "systemd"
REFMOUNT_BIN = str(Path(sys.executable).parent / "refmount")


def unit_settings(path: Path) -> dict[str, list[str]]:
    """``Key=value`` lines of a unit (comments dropped), values by key."""
    settings: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def environment_file(path: Path) -> dict[str, str]:
    """A systemd EnvironmentFile= as systemd reads these simple ones: KEY=VALUE lines."""
    values = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


# -- systemd-analyze verify ----------------------------------------------------------------


UNITS = [
    (SYSTEM_UNIT, "system"),
    (USER_UNIT, "user"),
    (EXAMPLES / "mnt-data.mount", "system"),
    (EXAMPLES / "mnt-data.automount", "system"),
    (EXAMPLES / "refmount-refresh@.service", "system"),
    (EXAMPLES / "refmount-refresh@.timer", "system"),
]


@pytest.mark.parametrize(("unit", "manager"), UNITS, ids=[u.name for u, _ in UNITS])
def test_unit_verifies_cleanly(unit: Path, manager: str, tmp_path: Path) -> None:
    """Exit status 0 and nothing on stderr (verify exits 0 on some warnings)."""
    copy = tmp_path / unit.name  # the same name: a mount unit's name must match Where=
    text = unit.read_text()
    text = text.replace("/usr/local/bin/refmount", REFMOUNT_BIN)
    copy.write_text(text.replace("%h/.local/bin/refmount", REFMOUNT_BIN))
    env = dict(os.environ)
    argv = ["systemd-analyze", "verify", str(copy)]
    if manager == "user":  # the user manager needs a runtime directory, even to verify
        runtime = tmp_path / "runtime"
        runtime.mkdir(mode=0o700)
        env["XDG_RUNTIME_DIR"] = str(runtime)
        argv.insert(1, "--user")
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == ""


def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: a misspelt key is reported on stderr."""
    broken = tmp_path / "refmount@.service"
    broken.write_text(SYSTEM_UNIT.read_text().replace("ExecReload=", "ExecRelaod="))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(broken)], capture_output=True, text=True, timeout=60
    )
    assert "Unknown key 'ExecRelaod'" in result.stderr


def test_units_reload_with_sighup_and_keep_the_mount_visible() -> None:
    for unit in (SYSTEM_UNIT, USER_UNIT):
        settings = unit_settings(unit)
        assert settings["Type"] == ["notify"]
        assert settings["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
        assert settings["ExecStopPost"] == ["-/bin/fusermount3 -u -z %f"]
        text = "\n".join(f"{k}={v}" for k, values in settings.items() for v in values)
        for forbidden in ("PrivateTmp", "ProtectSystem", "ProtectHome", "PrivateDevices"):
            assert forbidden not in text, (unit, forbidden)


def test_the_user_unit_lets_setuid_fusermount3_work() -> None:
    settings = unit_settings(USER_UNIT)
    for forbidden in ("NoNewPrivileges", "RestrictSUIDSGID", "SystemCallFilter", "User"):
        assert forbidden not in settings
    assert settings["EnvironmentFile"] == ["%E/refmount/%i.conf"]
    assert settings["WantedBy"] == ["default.target"]


# -- the examples do what they say ---------------------------------------------------------


def test_the_example_conf_is_a_valid_refmount_command(tmp_path: Path) -> None:
    conf = environment_file(EXAMPLES / "mnt-data.conf")
    assert set(conf) == {"REFMOUNT_REFS", "REFMOUNT_OPTIONS"}
    remote = tmp_path / "remote.json"
    remote.write_text(json.dumps({"anon": True}))
    options = conf["REFMOUNT_OPTIONS"].replace("@/etc/refmount/remote.json", f"@{remote}")
    config = parse_args([*shlex.split(options), conf["REFMOUNT_REFS"], "/mnt/data"])
    assert config.allow_other and config.cache_size == 2 << 30 and config.timeout == 20
    assert config.remote_options == {"*": {"anon": True}}


def test_the_example_mount_unit_mounts(tmp_path: Path) -> None:
    """``mount -t fuse.refmount WHAT WHERE -o OPTIONS`` with the unit's Type= and
    Options=, as systemd runs it (refmount from the system PATH)."""
    settings = unit_settings(EXAMPLES / "mnt-data.mount")
    assert settings["Where"] == ["/mnt/data"]
    assert unit_settings(EXAMPLES / "mnt-data.automount")["Where"] == ["/mnt/data"]
    refs = tmp_path / "data.json"
    refs.write_text(json.dumps({"d/a": "mounted by the unit's options"}))
    where = tmp_path / "data"
    where.mkdir()
    link = Path("/usr/local/bin/refmount")
    installed_here = not link.exists()
    if installed_here:
        link.symlink_to(REFMOUNT_BIN)
    try:
        result = subprocess.run(
            ["mount", "-t", settings["Type"][0], str(refs), str(where), "-o",
             settings["Options"][0]],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert (where / "d" / "a").read_text() == "mounted by the unit's options"
        status = subprocess.run(
            [*REFMOUNT, "status", "--pid", str(where)], capture_output=True, text=True, timeout=30
        )
        assert status.returncode == 0 and int(status.stdout) > 1
    finally:
        unmount(where)
        if installed_here:
            link.unlink()


def refresh_command() -> str:
    """The refresh unit's shell command, as systemd hands it to /bin/sh ($$ -> $)."""
    exec_start = unit_settings(EXAMPLES / "refmount-refresh@.service")["ExecStart"][0]
    match = re.fullmatch(r"/bin/sh -euc '(.*)'", exec_start)
    assert match, exec_start
    return match[1].replace("$$", "$").replace("/usr/local/bin/refmount", REFMOUNT_BIN)


def test_the_daily_refresh_replaces_a_set_only_when_it_checks(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "2026").mkdir(parents=True)
    (data / "2026" / "day1.nc").write_bytes(b"one")
    refs = tmp_path / "refs.json"
    generator = f"{sys.executable} {EXAMPLES / 'files-to-refs.py'}"
    env = {**os.environ, "REFMOUNT_REFS": str(refs), "REFRESH": f"{generator} {data}"}

    def refresh(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["/bin/sh", "-euc", refresh_command()], env={**env, **extra},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    first = refresh()
    assert first.returncode == 0, first.stderr
    assert json.loads(refs.read_text())["refs"] == {"2026/day1.nc": [str(data / "2026/day1.nc")]}
    assert "problems: none" in first.stdout
    (data / "2026" / "day2.nc").write_bytes(b"two")
    assert refresh().returncode == 0
    assert set(json.loads(refs.read_text())["refs"]) == {"2026/day1.nc", "2026/day2.nc"}

    before = refs.read_bytes()
    broken = refresh(REFRESH="echo {not json")
    assert broken.returncode != 0 and "not loaded" in broken.stdout
    assert refs.read_bytes() == before  # the old set stays
    failed = refresh(REFRESH="false")
    assert failed.returncode != 0 and refs.read_bytes() == before


# -- progress while loading ----------------------------------------------------------------


@pytest.fixture
def many_keys(tmp_path: Path) -> Path:
    refs = tmp_path / "many.json"
    refs.write_text(json.dumps({f"k/{i}": "v" for i in range(2000)}))
    return refs


def test_progress_and_timeout_extension_under_systemd(
    many_keys: Path, tmp_path: Path, mountpoint: Path
) -> None:
    address = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(address)
    listener.settimeout(60)
    daemon = subprocess.Popen(
        [*REFMOUNT, str(many_keys), str(mountpoint), "--foreground"],
        env={**os.environ, "NOTIFY_SOCKET": address},
        stderr=subprocess.DEVNULL,
    )
    try:
        messages: list[str] = []
        while not any("READY=1" in m for m in messages):
            messages.append(listener.recv(4096).decode())
        lines = [line for m in messages for line in m.splitlines()]
        ready = lines.index("READY=1")
        extend = [i for i, line in enumerate(lines) if line.startswith("EXTEND_TIMEOUT_USEC=")]
        assert extend and extend[0] < ready
        assert lines[extend[0]] == "EXTEND_TIMEOUT_USEC=120000000"
        statuses = [line for line in lines[:ready] if line.startswith("STATUS=")]
        assert any(re.fullmatch(r"STATUS=loading: 2,000 keys.*", s) for s in statuses), statuses
        assert f"STATUS=loaded 2,000 keys from {many_keys}" in statuses
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        listener.close()
        unmount(mountpoint)


def test_progress_line_on_a_terminal_only(many_keys: Path, mountpoint: Path) -> None:
    primary, secondary = pty.openpty()
    daemon = subprocess.Popen(
        [*REFMOUNT, str(many_keys), str(mountpoint), "--foreground"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=secondary,
    )  # fmt: skip
    os.close(secondary)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while not is_mounted(mountpoint) or b"mounted" not in seen:
            assert time.monotonic() < deadline, seen
            ready, _, _ = select.select([primary], [], [], 1)
            if ready:
                seen += os.read(primary, 65536)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        os.close(primary)
        unmount(mountpoint)
    text = seen.decode(errors="replace")
    assert f"\r\x1b[Krefmount: {many_keys}: loading: 2,000 keys" in text
    # the line is cleared before the log goes on
    assert "\r\x1b[K" in text.split("loading: 2,000 keys", 1)[1]

    piped = subprocess.run(
        [*REFMOUNT, "check", str(many_keys)], capture_output=True, text=True, timeout=60
    )
    assert piped.returncode == 0 and piped.stderr == ""  # no terminal, no progress line


def test_progress_redacts_and_reports_a_failed_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(address)
    listener.settimeout(10)
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    terminal = io.StringIO()
    secret = "https://user:pw@example.org/refs.json?sig=s3cr3t"
    with (
        pytest.raises(RuntimeError),
        LoadProgress(secret, terminal=terminal, systemd=True) as progress,
    ):
        progress("parsing", 0, 5_000_000)
        progress("indexing", 1234, 5_000_000)
        raise RuntimeError("the load failed")
    messages = []
    with listener:
        while not messages or not messages[-1].startswith("STATUS=loading failed"):
            messages.append(listener.recv(4096).decode())
    assert messages[0].endswith("\nEXTEND_TIMEOUT_USEC=120000000")
    assert any(
        m.startswith("STATUS=loading: 1,234 keys, 5.0 MB read (indexing, ") for m in messages
    )
    assert messages[-1] == "STATUS=loading failed from https://example.org/refs.json"
    shown = terminal.getvalue()
    assert "refmount: https://example.org/refs.json: loading: 5.0 MB read (parsing, " in shown
    assert shown.endswith("\r\x1b[K")  # the line is cleared at the end
    assert "pw" not in shown + "".join(messages) and "s3cr3t" not in shown + "".join(messages)


def _abort_connections_of(pid: int) -> None:
    """End a daemon that cannot be killed because one of its threads waits on its own
    mount (what the test below guards against): abort its FUSE connection."""
    for fdinfo in Path(f"/proc/{pid}").glob("task/*/fdinfo/*"):
        try:
            match = re.search(r"^fuse_connection:\s*(\d+)", fdinfo.read_text(), re.M)
        except OSError:
            continue
        if match:
            Path(f"/sys/fs/fuse/connections/{match[1]}/abort").write_text("1")
            return


def test_a_stop_right_after_the_mount_appears_ends_the_daemon(
    tmp_path: Path, mountpoint: Path
) -> None:
    """``systemctl stop`` just after the start: SIGTERM before the daemon's own readiness
    check was answered once hung the daemon for good (4 times in 20 on this machine)."""
    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps({"a": "b"}))
    for _ in range(10):
        daemon = subprocess.Popen(
            [*REFMOUNT, str(refs), str(mountpoint), "--foreground"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not is_mounted(mountpoint):
                assert daemon.poll() is None and time.monotonic() < deadline
                time.sleep(0.001)
            daemon.send_signal(signal.SIGTERM)
            assert daemon.wait(20) == 0
        finally:
            if daemon.poll() is None:
                _abort_connections_of(daemon.pid)
                daemon.kill()
                daemon.wait(20)
            unmount(mountpoint)

"""tuning: the kernel settings written after mounting, and fusectl mounted when missing."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest

from refmount import tuning


def test_tune_kernel_writes_sysfs_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    minor = os.minor(os.stat(mnt).st_dev)
    bdi = tmp_path / "bdi" / f"0:{minor}"
    conn = tmp_path / "conn" / str(minor)
    bdi.mkdir(parents=True)
    conn.mkdir(parents=True)
    monkeypatch.setattr(tuning, "BDI_ROOT", tmp_path / "bdi")
    monkeypatch.setattr(tuning, "CONNECTIONS_ROOT", tmp_path / "conn")
    tuning.tune_kernel(str(mnt), read_ahead_kb=16384, max_background=64)
    assert (bdi / "read_ahead_kb").read_text() == "16384\n"
    assert (conn / "max_background").read_text() == "64\n"
    assert (conn / "congestion_threshold").read_text() == "48\n"


def test_tune_kernel_never_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tuning, "BDI_ROOT", tmp_path / "nothing")
    monkeypatch.setattr(tuning, "CONNECTIONS_ROOT", tmp_path / "nothing")
    with caplog.at_level(logging.DEBUG, logger="refmount.tuning"):
        tuning.tune_kernel(str(tmp_path), read_ahead_kb=1024, max_background=64)
        tuning.tune_kernel(str(tmp_path / "missing"), read_ahead_kb=1024, max_background=64)
    assert any("stat failed" in r.getMessage() for r in caplog.records)
    assert sum("could not set" in r.getMessage() for r in caplog.records) == 3


def test_mount_fusectl_leaves_a_non_empty_directory_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "something").write_text("here")
    with caplog.at_level(logging.DEBUG, logger="refmount.tuning"):
        assert tuning.mount_fusectl(tmp_path) is False
    assert not os.path.ismount(tmp_path)
    assert "not an empty directory" in caplog.text


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can mount fusectl")
def test_mount_fusectl_mounts_the_control_filesystem(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An empty directory gets fusectl (the same one the kernel shows everywhere); a
    second call sees the mount and does nothing."""
    target = tmp_path / "connections"
    target.mkdir()
    try:
        with caplog.at_level(logging.INFO, logger="refmount.tuning"):
            assert tuning.mount_fusectl(target) is True
            assert tuning.mount_fusectl(target) is True
        with open("/proc/mounts") as mounts:
            types = [f[2] for f in (line.split() for line in mounts) if f[1] == str(target)]
        assert types == ["fusectl"]
        assert caplog.text.count("mounted it on") == 1
    finally:
        subprocess.run(["umount", str(target)], capture_output=True)
    assert not os.path.ismount(target)

"""The throughput benchmark measures a row's systems alike (issue 28's bench question)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.throughput import PROTOCOL_WORKLOADS, PROTOCOLS, ROWS, cold, page_reporting


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cold_rows_are_cold_over_every_protocol(protocol: str) -> None:
    """W2c and W3d start with the page cache dropped over https:// and s3:// as over
    http://, for the limit as for the mounts: the limit's TLS rows used to read the
    server's file warm from the http row and stood above it."""
    suffix = "" if protocol == "http" else f"@{protocol}"
    for workload in PROTOCOL_WORKLOADS:
        row = workload + suffix
        assert row in ROWS
        assert cold(row) == (workload in ("W2c", "W3d")), row


def _balloon(root: Path, name: str, device: str, features: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "device").write_text(device + "\n")
    (root / name / "features").write_text(features + "\n")


def test_page_reporting_read_from_the_balloon_features(tmp_path: Path) -> None:
    """Free page reporting is bit 5 of a virtio balloon's (device 0x0005) features."""
    with_reporting = tmp_path / "on"
    _balloon(with_reporting, "virtio0", "0x0002", "0" * 5 + "1" + "0" * 58)  # a disk: no
    assert not page_reporting(with_reporting)
    _balloon(with_reporting, "virtio1", "0x0005", "011001" + "0" * 58)
    assert page_reporting(with_reporting)
    without = tmp_path / "off"
    _balloon(without, "virtio0", "0x0005", "011100" + "0" * 58)  # stats, deflate, hint
    assert not page_reporting(without)
    assert not page_reporting(tmp_path / "absent")

"""Hostile GRIB, TIFF and FITS chunks through a real ``--decode`` mount: a message cut
short, one whose header claims a huge grid, random bytes for each codec, a decoding
worker killed or hung mid-chunk, the daemon killed.  Each bad chunk is EIO, the daemon
lives, the next chunk reads right, and no worker is left behind."""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.format_builders import GRID, field, grib_message, message_values
from tests.support.direct import read_once, stats
from tests.support.mounting import Mounted, child_env

pytest.importorskip("eccodes")

CHUNK = GRID[0] * GRID[1] * 8


def grib_zarray(var: str = "t", codec: str = "grib") -> str:
    config = {"id": codec, "var": var, "dtype": "float64"} if codec == "grib" else {"id": codec}
    return json.dumps(
        {
            "zarr_format": 2,
            "shape": [*GRID],
            "chunks": [*GRID],
            "dtype": "<f8",
            "fill_value": None,
            "order": "C",
            "compressor": None,
            "filters": [config],
        }
    )


def huge_grid(message: bytes) -> bytes:
    """The message with its grid (section 3: points, Ni, Nj) claiming 60000 x 60000."""
    patched = bytearray(message)
    section1 = 16 + int.from_bytes(message[16:20], "big")
    at = section1
    if message[at + 4] == 2:  # a local use section
        at += int.from_bytes(message[at : at + 4], "big")
    assert message[at + 4] == 3
    patched[at + 6 : at + 10] = (60000 * 60000).to_bytes(4, "big")
    patched[at + 30 : at + 34] = (60000).to_bytes(4, "big")
    patched[at + 34 : at + 38] = (60000).to_bytes(4, "big")
    return bytes(patched)


def inline(data: bytes) -> str:
    return "base64:" + base64.b64encode(data).decode()


def workers_of(pid: int) -> list[int]:
    """The daemon's decoding workers (not, say, fusermount3's auto_unmount helper)."""
    workers = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(FileNotFoundError):
                if b"refmount.workers.child" in Path(f"/proc/{child}/cmdline").read_bytes():
                    workers.append(int(child))
    return workers


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def wait_for(condition: Callable[[], bool], attempts: int = 3000) -> None:
    for _ in range(attempts):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError("the condition never held")


@pytest.fixture
def grib_set(tmp_path: Path) -> tuple[Path, np.ndarray]:
    message = grib_message("t", "isobaricInhPa", 500, "grid_complex", field(9))
    data = tmp_path / "one.grib2"
    data.write_bytes(message)
    rng = random.Random(23)
    refs = {
        ".zgroup": json.dumps({"zarr_format": 2}),
        "good/.zarray": grib_zarray(),
        "good/0.0": [str(data), 0, len(message)],
        "cut/.zarray": grib_zarray(),
        "cut/0.0": [str(data), 0, len(message) - 50],
        "huge/.zarray": grib_zarray(),
        "huge/0.0": inline(huge_grid(message)),
        "noise/.zarray": grib_zarray(),
        "noise/0.0": inline(b"GRIB" + rng.randbytes(2000)),
        "gribberish/.zarray": grib_zarray(codec="gribberish"),
        "gribberish/0.0": inline(rng.randbytes(3000)),
    }
    for codec in ("imagecodecs_lzw", "imagecodecs_packbits", "imagecodecs_zstd",
                  "imagecodecs_jpeg", "imagecodecs_webp", "imagecodecs_deflate"):  # fmt: skip
        refs[f"{codec}/.zarray"] = json.dumps(
            {
                "zarr_format": 2, "shape": [64, 64], "chunks": [64, 64], "dtype": "|u1",
                "fill_value": 0, "order": "C", "compressor": {"id": codec}, "filters": None,
            }
        )  # fmt: skip
        refs[f"{codec}/0.0"] = inline(rng.randbytes(rng.randint(10, 5000)))
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path, message_values(message)


def test_broken_messages_and_random_bytes_are_eio_and_the_next_chunk_reads_right(
    mount: Callable[..., Mounted], grib_set: tuple[Path, np.ndarray]
) -> None:
    path, values = grib_set
    mounted = mount(path, "--decode", "--allow-local", "--xattrs")
    root = mounted.mountpoint
    bad = sorted(name for name in os.listdir(root) if name not in ("good", ".zgroup"))
    assert len(bad) == 10
    for name in bad:
        with pytest.raises(OSError) as failed:
            read_once(root / name / "0.0")
        assert failed.value.errno == errno.EIO, name
        assert read_once(root / "good" / "0.0") == values.tobytes(), name
    assert mounted.process.poll() is None
    counters = stats(mounted)
    assert (counters["worker_jobs"], counters["worker_job_errors"]) == (11, 10)
    assert counters["worker_deaths"] == 0
    log = mounted.log()
    assert "cut short" in log and "holds" in log  # the two GRIB checks, by their words


def two_messages(tmp_path: Path) -> tuple[Path, list[bytes]]:
    messages = [grib_message("t", "isobaricInhPa", level, "grid_simple", field(level))
                for level in (500, 850)]  # fmt: skip
    data = tmp_path / "two.grib2"
    data.write_bytes(b"".join(messages))
    refs = {
        ".zgroup": json.dumps({"zarr_format": 2}),
        "a/.zarray": grib_zarray(),
        "a/0.0": [str(data), 0, len(messages[0])],
        "b/.zarray": grib_zarray(),
        "b/0.0": [str(data), len(messages[0]), len(messages[1])],
    }
    path = tmp_path / "two.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path, messages


def test_a_worker_killed_mid_chunk_fails_that_read_and_is_replaced(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    path, messages = two_messages(tmp_path)
    mounted = mount(path, "--decode", "--allow-local", "--xattrs", "--decode-workers", "1")
    root = mounted.mountpoint
    assert read_once(root / "a" / "0.0") == message_values(messages[0]).tobytes()
    (worker,) = workers_of(mounted.pid)
    os.kill(worker, signal.SIGSTOP)  # the next decoding waits in it until it is killed
    outcome: list[BaseException | bytes] = []

    def read() -> None:
        try:
            outcome.append(read_once(root / "b" / "0.0"))
        except OSError as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    wait_for(lambda: stats(mounted)["workers_busy"] == 1)
    os.kill(worker, signal.SIGKILL)
    reader.join(60)
    assert isinstance(outcome[0], OSError) and outcome[0].errno == errno.EIO
    assert not alive(worker) and mounted.process.poll() is None
    assert read_once(root / "b" / "0.0") == message_values(messages[1]).tobytes()
    (replacement,) = workers_of(mounted.pid)
    assert replacement != worker
    counters = stats(mounted)
    assert (counters["worker_deaths"], counters["worker_starts"]) == (1, 2)
    assert "killed by SIGKILL" in mounted.log()
    status = subprocess.run(
        [sys.executable, "-m", "refmount", "status", str(root)],
        capture_output=True, text=True, check=True, env=child_env(),
    ).stdout  # fmt: skip
    assert re.search(r"decode workers +1 running \(0 busy\), 2 started, 1 killed or died", status)
    assert re.search(r"decode jobs +3, 1 failed", status)


def test_a_hung_worker_is_killed_at_the_deadline_and_the_next_chunk_reads_right(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    path, messages = two_messages(tmp_path)
    mounted = mount(
        path, "--decode", "--allow-local", "--decode-workers", "1", "--decode-deadline", "2"
    )
    root = mounted.mountpoint
    assert read_once(root / "a" / "0.0") == message_values(messages[0]).tobytes()
    (worker,) = workers_of(mounted.pid)
    os.kill(worker, signal.SIGSTOP)
    with pytest.raises(OSError) as failed:
        read_once(root / "b" / "0.0")
    assert failed.value.errno == errno.EIO
    assert not alive(worker)
    assert read_once(root / "b" / "0.0") == message_values(messages[1]).tobytes()
    assert "did not finish within 2 s" in mounted.log()


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_no_worker_outlives_its_daemon(
    mount: Callable[..., Mounted], grib_set: tuple[Path, np.ndarray], how: signal.Signals
) -> None:
    path, values = grib_set
    mounted = mount(path, "--decode", "--allow-local", "--decode-workers", "2")
    root = mounted.mountpoint
    assert (root / "good" / "0.0").read_bytes() == values.tobytes()
    wait_for(lambda: len(workers_of(mounted.pid)) == 2)  # both started at mount
    workers = workers_of(mounted.pid)
    os.kill(mounted.pid, how)
    mounted.process.wait(30)
    wait_for(lambda: not any(alive(worker) for worker in workers))
    mounted.stop()

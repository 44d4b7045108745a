"""Remote faults as readers of the mount see them, against a real HTTP server.

Every test reads through the mount from separate processes (``cat``, ``dd``, a Python
child) while tests/support/rangeserver.py fails, stalls, truncates or lies on purpose.
Each test serves its own freshly written data files (named after the test), so neither
the kernel's page cache nor refmount's block cache can answer from an earlier test.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Mounted, is_mounted
from tests.support.remote_files import Remote, write_refs
from tests.support.servers import RangeServer

FAST = ["--timeout", "2", "--retries", "0"]
QUICK_OP = 5.0  # seconds an operation that needs no stalled request may take, at most


def run(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(args, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


def cat(path: Path, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return run(["cat", str(path)], timeout)


def timed_cat(path: Path) -> tuple[subprocess.CompletedProcess[bytes], float]:
    start = time.monotonic()
    result = cat(path)
    return result, time.monotonic() - start


def assert_reads(path: Path, expected: bytes) -> None:
    result = cat(path, timeout=QUICK_OP * 4)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected


def assert_fails(path: Path, message: str) -> subprocess.CompletedProcess[bytes]:
    result = cat(path)
    assert result.returncode != 0, f"{path} read {len(result.stdout)} bytes instead of failing"
    assert message in result.stderr.decode(), result.stderr
    return result


def wait_for(condition: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        time.sleep(0.02)


def python_reads(path: Path, reads: list[tuple[int, int]]) -> list[bytes]:
    """Bytes of ``read(size)`` after ``seek(offset)`` for each pair, from a child process."""
    code = (
        "import json, sys\n"
        "out = []\n"
        "with open(sys.argv[1], 'rb') as f:\n"
        "    for offset, size in json.loads(sys.argv[2]):\n"
        "        f.seek(offset)\n"
        "        out.append(f.read(size).hex())\n"
        "print(json.dumps(out))\n"
    )
    result = run([sys.executable, "-c", code, str(path), json.dumps(reads)])
    assert result.returncode == 0, result.stderr
    return [bytes.fromhex(h) for h in json.loads(result.stdout)]


# -- deadlines ---------------------------------------------------------------------------


def test_stalled_read_fails_with_eio_within_a_bound(
    mount: Callable[..., Mounted], remote: Callable[..., Remote], http: RangeServer, tmp_path: Path
) -> None:
    stalled, good = remote("stalled"), remote("good")
    refs = write_refs(tmp_path, {"stalled": [stalled.url, 100, 200], "good": [good.url, 100, 200]})
    m = mount(refs, *FAST)
    http.fault(stalled.path, "stall", count=-1)

    result, elapsed = timed_cat(m.mountpoint / "stalled")

    assert result.returncode != 0
    assert "Input/output error" in result.stderr.decode()
    assert result.stdout == b""
    # The deadline of 2 s was waited out (a deadline never fires early); that it ended at
    # all is `cat`'s own timeout, and the message below names the deadline.
    assert elapsed > 1.5, elapsed
    assert m.process.poll() is None, m.log()
    assert_reads(m.mountpoint / "good", good.data[100:300])
    assert "no answer within 2 s" in m.log()


def test_one_slow_read_blocks_no_listing_stat_or_other_read(
    mount: Callable[..., Mounted], remote: Callable[..., Remote], http: RangeServer, tmp_path: Path
) -> None:
    slow = remote("slow")
    others = [remote(f"other{i}") for i in range(3)]
    refs = {"slow": [slow.url, 0, 500], "sub/inline": "hello"}
    refs.update({f"sub/k{i}": [r.url, 10, 300] for i, r in enumerate(others)})
    # Long enough to outlast every other operation below, short enough that stopping the
    # daemon (which waits for requests in flight) does not take long.
    m = mount(write_refs(tmp_path, refs), "--timeout", "10", "--retries", "0")
    http.fault(slow.path, "stall", count=-1)

    reader = subprocess.Popen(
        ["cat", str(m.mountpoint / "slow")], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        wait_for(lambda: http.stats()["requests"] >= 1, what="the stalled request")
        listing = run(["ls", "-l", str(m.mountpoint), str(m.mountpoint / "sub")], QUICK_OP)
        assert listing.returncode == 0, listing.stderr
        names = listing.stdout.decode()
        for name in ("slow", "sub", "inline", "k0", "k1", "k2"):
            assert re.search(rf"\s{name}$", names, re.MULTILINE), names
        stat = run(["stat", "-c", "%n %s", str(m.mountpoint / "slow")], QUICK_OP)
        assert stat.stdout.decode().split()[-1] == "500"
        for i, other in enumerate(others):
            result = cat(m.mountpoint / "sub" / f"k{i}", timeout=QUICK_OP)
            assert result.returncode == 0, result.stderr
            assert result.stdout == other.data[10:310]
        # Not a duration: every operation above ended while the stalled read still waits.
        assert reader.poll() is None, "the stalled read ended before the others were done"
    finally:
        reader.kill()
        m.stop()  # ends the stalled request, so the reader can be reaped
        reader.communicate(timeout=30)


# -- retries and persistent failures --------------------------------------------------------


@pytest.mark.parametrize("mode", ["503", "500", "429", "reset", "truncate"])
def test_transient_failure_is_retried(
    mode: str,
    mount: Callable[..., Mounted],
    remote: Callable[..., Remote],
    http: RangeServer,
    tmp_path: Path,
) -> None:
    target = remote("data", 4000)
    m = mount(write_refs(tmp_path, {"k": [target.url, 1000, 2000]}), "--timeout", "5",
              "--retries", "2")  # fmt: skip
    http.fault(target.path, mode, count=1)

    assert_reads(m.mountpoint / "k", target.data[1000:3000])

    stats = http.stats()
    assert stats["faults_left"] == []
    assert stats["requests"] >= 2, stats
    whole = [r for r in stats["ranges"] if r[0] == target.path and r[2] - r[1] >= 2000]
    assert whole, stats


def test_persistent_503_gives_eio_and_the_daemon_lives_on(
    mount: Callable[..., Mounted], remote: Callable[..., Remote], http: RangeServer, tmp_path: Path
) -> None:
    bad, good = remote("bad"), remote("good")
    refs = write_refs(tmp_path, {"bad": [bad.url, 0, 700], "good": [good.url, 0, 700]})
    m = mount(refs, "--timeout", "2", "--retries", "2")
    http.fault(bad.path, "503", count=-1)

    result = cat(m.mountpoint / "bad")

    assert result.returncode != 0
    assert "Input/output error" in result.stderr.decode()
    requests = http.stats()["requests"]
    assert requests >= 3 and requests % 3 == 0, requests  # 1 + 2 retries per READ
    assert m.process.poll() is None, m.log()
    assert_reads(m.mountpoint / "good", good.data[:700])


@pytest.mark.parametrize(
    ("fault", "message"), [("403", "Input/output error"), ("404", "Input/output error")]
)  # a key's forbidden or missing target is EIO: ENOENT would mean "no such key" to zarr
def test_permanent_http_errors_map_to_errno_without_retry(
    mount: Callable[..., Mounted],
    remote: Callable[..., Remote],
    http: RangeServer,
    tmp_path: Path,
    fault: str,
    message: str,
) -> None:
    target = remote(f"permanent-{fault}")
    m = mount(write_refs(tmp_path, {"k": [target.url, 0, 100]}), "--timeout", "2", "--retries", "3")
    http.fault(target.path, fault, count=-1)

    result = assert_fails(m.mountpoint / "k", message)

    assert result.stdout == b""
    # 403 and 404 are not transient: no retry (one request per READ, never four).
    assert 1 <= http.stats()["requests"] <= 2
    assert m.process.poll() is None


def test_missing_whole_file_key_is_eio_never_enoent(
    mount: Callable[..., Mounted], http: RangeServer, tmp_path: Path
) -> None:
    """ENOENT would mean "no such key": zarr would read fill values instead of failing."""
    missing = f"{http.url}/no-such-file-{tmp_path.name}.bin"
    m = mount(write_refs(tmp_path, {"k": [missing]}), *FAST)

    result = run(["stat", str(m.mountpoint / "k")])

    assert result.returncode != 0
    assert "Input/output error" in result.stderr.decode(), result.stderr
    assert m.process.poll() is None
    assert "HTTP 404: not found" in m.log()


def test_a_failing_whole_file_key_does_not_hide_its_directory(
    mount: Callable[..., Mounted], http: RangeServer, tmp_path: Path
) -> None:
    """Listing a directory must not depend on every entry's remote size being known."""
    missing = f"{http.url}/no-such-file-{tmp_path.name}.bin"
    refs = {"d/a-good": "first", "d/m-missing": [missing], "d/z-good": "last"}
    m = mount(write_refs(tmp_path, refs), *FAST)

    code = "import os, sys, json; print(json.dumps(sorted(os.listdir(sys.argv[1]))))"
    result = run([sys.executable, "-c", code, str(m.mountpoint / "d")], QUICK_OP * 2)

    assert result.returncode == 0, result.stderr
    names = json.loads(result.stdout)
    assert "a-good" in names and "z-good" in names, names


def test_a_stalled_whole_file_size_does_not_block_listing(
    mount: Callable[..., Mounted], remote: Callable[..., Remote], http: RangeServer, tmp_path: Path
) -> None:
    """A HEAD that never answers must not hold up ``ls`` of the other entries."""
    slow = remote("slow")
    refs = {"d/a-good": "first", "d/m-slow": [slow.url], "d/z-good": "last"}
    m = mount(write_refs(tmp_path, refs), "--timeout", "8", "--retries", "0")
    http.fault(slow.path, "stall", count=-1)

    lister = subprocess.Popen(
        [sys.executable, "-c", "import os, sys; print(sorted(os.listdir(sys.argv[1])))",
         str(m.mountpoint / "d")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + QUICK_OP
        while lister.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        finished = lister.poll() is not None
    finally:
        lister.kill()
        m.stop()
        out, err = lister.communicate(timeout=30)
    assert finished, "listing a directory waited on one entry's stalled remote size"
    assert lister.returncode == 0, err
    assert "a-good" in out.decode() and "z-good" in out.decode()


# -- lying servers ---------------------------------------------------------------------------


def test_short_answers_give_eio_never_a_short_file(
    mount: Callable[..., Mounted], remote: Callable[..., Remote], http: RangeServer, tmp_path: Path
) -> None:
    target = remote("short")
    m = mount(write_refs(tmp_path, {"k": [target.url, 200, 300]}), "--timeout", "2",
              "--retries", "2")  # fmt: skip
    http.fault(target.path, "short", count=-1)

    result = assert_fails(m.mountpoint / "k", "Input/output error")
    assert len(result.stdout) < 300
    assert target.data[200:500].startswith(result.stdout)
    dd = run(["dd", f"if={m.mountpoint / 'k'}", "of=/dev/null", "bs=1M"])
    assert dd.returncode != 0
    assert "Input/output error" in dd.stderr.decode()
    assert m.process.poll() is None

    # The lie is not remembered: once the server tells the truth, the bytes are right.
    http.clear_faults()
    assert_reads(m.mountpoint / "k", target.data[200:500])


def test_ignored_range_gives_eio_never_wrong_bytes(
    mount: Callable[..., Mounted], remote: Callable[..., Remote], http: RangeServer, tmp_path: Path
) -> None:
    # The key lies well past the first block, so every request starts at a non-zero offset.
    target = remote("whole", 1 << 20)
    offset = 700_000
    m = mount(write_refs(tmp_path, {"k": [target.url, offset, 1000]}), "--timeout", "2",
              "--retries", "1")  # fmt: skip
    http.fault(target.path, "ignore-range", count=-1)

    result = assert_fails(m.mountpoint / "k", "Input/output error")

    assert result.stdout == b""
    assert http.stats()["requests"] >= 2  # retried once, then refused
    assert m.process.poll() is None
    http.clear_faults()
    assert_reads(m.mountpoint / "k", target.data[offset : offset + 1000])


def test_ignored_range_once_is_retried_to_the_right_bytes(
    mount: Callable[..., Mounted], remote: Callable[..., Remote], http: RangeServer, tmp_path: Path
) -> None:
    target = remote("whole", 1 << 20)
    offset = 600_000
    m = mount(write_refs(tmp_path, {"k": [target.url, offset, 5000]}), "--timeout", "2",
              "--retries", "2")  # fmt: skip
    http.fault(target.path, "ignore-range", count=1)

    assert_reads(m.mountpoint / "k", target.data[offset : offset + 5000])
    stats = http.stats()
    assert [target.path, 0, 1 << 20] in stats["ranges"]  # the lie was sent, and refused
    assert stats["requests"] >= 2


# -- bounds ------------------------------------------------------------------------------------


def test_nothing_outside_the_referenced_range_is_served(
    mount: Callable[..., Mounted], remote: Callable[..., Remote], http: RangeServer, tmp_path: Path
) -> None:
    target = remote("bounds", 1000)
    refs = {"k": [target.url, 100, 50], "tail": [target.url, 900, 100], "empty": [target.url, 5, 0]}
    m = mount(write_refs(tmp_path, refs), *FAST)
    key = m.mountpoint / "k"

    assert os.stat(key).st_size == 50
    dd = run(["dd", f"if={key}", "bs=1M", "status=none"])
    assert dd.returncode == 0, dd.stderr
    assert dd.stdout == target.data[100:150]
    reads = python_reads(key, [(0, 1000), (40, 1000), (49, 1), (50, 1000), (51, 10), (10**6, 4)])
    assert reads == [target.data[100:150], target.data[140:150], target.data[149:150], b"", b"",
                     b""]  # fmt: skip
    assert python_reads(m.mountpoint / "tail", [(0, 4096), (99, 10)]) == [
        target.data[900:1000],
        target.data[999:1000],
    ]
    assert os.stat(m.mountpoint / "empty").st_size == 0
    assert python_reads(m.mountpoint / "empty", [(0, 100)]) == [b""]
    # No request asks for bytes past the furthest byte any key references.
    for path, start, end in http.stats()["ranges"]:
        assert path == target.path and 0 <= start < end <= 1000


def test_range_past_the_end_of_the_remote_file_is_an_error(
    mount: Callable[..., Mounted], remote: Callable[..., Remote], http: RangeServer, tmp_path: Path
) -> None:
    """A refs file that promises more bytes than the store has: EIO, not a short file."""
    target = remote("small", 1000)
    m = mount(write_refs(tmp_path, {"k": [target.url, 950, 100]}), *FAST)

    assert os.stat(m.mountpoint / "k").st_size == 100
    result = assert_fails(m.mountpoint / "k", "Input/output error")
    assert len(result.stdout) < 100


# -- logging -----------------------------------------------------------------------------------


def test_each_distinct_failure_is_logged_once(
    mount: Callable[..., Mounted], remote: Callable[..., Remote], http: RangeServer, tmp_path: Path
) -> None:
    target = remote("noisy")
    m = mount(write_refs(tmp_path, {"noisy-key": [target.url, 0, 600]}), "--timeout", "2",
              "--retries", "1")  # fmt: skip
    http.fault(target.path, "503", count=-1)
    reads = 5
    for _ in range(reads):
        assert_fails(m.mountpoint / "noisy-key", "Input/output error")
    requests = http.stats()["requests"]
    assert requests >= 2 * reads  # every read went to the server: failures are not cached

    lines = [line for line in m.log().splitlines() if target.name in line]
    assert lines, m.log()
    assert any("503" in line for line in lines), lines
    assert any("noisy-key" in line for line in m.log().splitlines()), m.log()
    assert len(lines) <= 2, lines  # once by the fetcher, once for the key; not per READ

    # A different failure of the same URL is news: logged, once.
    http.clear_faults()
    http.fault(target.path, "403", count=-1)
    for _ in range(3):
        assert_fails(m.mountpoint / "noisy-key", "Input/output error")
    lines_403 = [line for line in m.log().splitlines() if target.name in line and "403" in line]
    assert 1 <= len(lines_403) <= 2, m.log()  # by the fetcher, and for the key


# -- survival ----------------------------------------------------------------------------------


def test_the_daemon_survives_every_kind_of_bad_file(
    mount: Callable[..., Mounted], remote: Callable[..., Remote], http: RangeServer, tmp_path: Path
) -> None:
    faults = {
        "stall": "Input/output error",
        "503": "Input/output error",
        "500": "Input/output error",
        "reset": "Input/output error",
        "truncate": "Input/output error",
        "short": "Input/output error",
        "ignore-range": "Input/output error",
        "403": "Input/output error",
        "404": "Input/output error",
    }
    bad = {mode: remote(f"bad-{mode}", 300_000) for mode in faults}
    good = [remote(f"good{i}", 300_000) for i in range(2)]
    refs: dict[str, object] = {f"bad/{m}": [r.url, 270_000, 30_000] for m, r in bad.items()}
    refs.update({f"good/{i}": [r.url, 1000, 20_000] for i, r in enumerate(good)})
    refs["good/whole"] = [good[0].url]
    refs["good/inline"] = "still here"
    refs["missing/whole"] = [f"{http.url}/never-{tmp_path.name}.bin"]
    m = mount(write_refs(tmp_path, refs), *FAST)
    for mode, target in bad.items():
        http.fault(target.path, mode, count=-1)

    for mode, message in faults.items():
        assert_fails(m.mountpoint / "bad" / mode, message)
        assert m.process.poll() is None, f"died after {mode}: {m.log()}"
    assert run(["stat", str(m.mountpoint / "missing" / "whole")]).returncode != 0

    listing = run(["ls", "-l", str(m.mountpoint), str(m.mountpoint / "bad")], QUICK_OP)
    assert listing.returncode == 0, listing.stderr
    for name in ("bad", "good", "missing", *faults):
        assert re.search(rf"\s{re.escape(name)}$", listing.stdout.decode(), re.MULTILINE)
    for i, target in enumerate(good):
        assert_reads(m.mountpoint / "good" / str(i), target.data[1000:21000])
    assert_reads(m.mountpoint / "good" / "whole", good[0].data)
    assert_reads(m.mountpoint / "good" / "inline", b"still here")
    assert m.process.poll() is None
    assert m.stop() == 0


def test_sigterm_during_a_stalled_read_unmounts_promptly(
    mount: Callable[..., Mounted], remote: Callable[..., Remote], http: RangeServer, tmp_path: Path
) -> None:
    """Stopping must not wait out the deadline of requests in flight (systemd would
    SIGKILL a daemon that takes longer than its stop timeout, leaving a dead mount)."""
    slow = remote("slow")
    m = mount(write_refs(tmp_path, {"slow": [slow.url, 0, 500]}), "--timeout", "30",
              "--retries", "0")  # fmt: skip
    http.fault(slow.path, "stall", count=-1)
    reader = subprocess.Popen(
        ["cat", str(m.mountpoint / "slow")], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        wait_for(lambda: http.stats()["requests"] >= 1, what="the stalled request")
        start = time.monotonic()
        m.process.send_signal(signal.SIGTERM)
        try:
            # Under the stalled request's own 30 s deadline: it was cancelled, not waited out.
            code = m.process.wait(25)
        except subprocess.TimeoutExpired:
            code = None
        elapsed = time.monotonic() - start
    finally:
        m.stop()
        reader.kill()
        reader.communicate(timeout=60)
    assert code == 0, f"still running {elapsed:.1f} s after SIGTERM"
    assert not is_mounted(m.mountpoint)

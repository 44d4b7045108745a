"""Mounting refmount for tests and benchmarks: start, wait, find the daemon, unmount.

Tests run the daemon in the foreground as their own child (``Mounted``); benchmarks may
use the command line as a user does, which daemonizes and returns once the mount
answers (``mount_background``).  Either way a mount is always undone (``fusermount3 -u``,
then ``-uz``), and only a daemon that this process started, found by the mount point it
was given, is ever signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REFMOUNT = [sys.executable, "-m", "refmount"]
#: The daemon as it runs on a stock pyfuse3: refmount's patch (``.ci/setup`` builds it)
#: is hidden before refmount looks for it, so files are opened and released, and listings
#: are always READDIRPLUS.  For tests of that path, and the benchmark's comparison.
STOCK_PYFUSE3 = [
    sys.executable,
    "-c",
    "import sys, pyfuse3\n"
    "if hasattr(pyfuse3, 'REFMOUNT_PATCH'):\n"
    "    del pyfuse3.REFMOUNT_PATCH\n"
    "from refmount.fuse_ops import Operations\n"
    "Operations.readdirplus_auto = False\n"
    "from refmount.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n",
]
REPO = Path(__file__).resolve().parents[2]
#: ``REFMOUNT_TEST_FETCH_WORKERS=N`` runs every test mount with ``--fetch-workers N``
#: (unless the test gives its own): the same tests, remote reads in worker processes.
FETCH_WORKERS_ENV = "REFMOUNT_TEST_FETCH_WORKERS"


def is_mounted(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/mounts") as mounts:
        return any(line.split()[1] == target for line in mounts)


def unmount(path: Path) -> None:
    """Unmount, lazily if a plain unmount fails: nothing is ever left mounted."""
    if not is_mounted(path):
        return
    subprocess.run(["fusermount3", "-u", str(path)], capture_output=True)
    if is_mounted(path):
        subprocess.run(["fusermount3", "-u", "-z", str(path)], capture_output=True)


def daemon_pids(mountpoint: Path) -> list[int]:
    """Pids of refmount daemons serving ``mountpoint`` (ours: we chose the path)."""
    pids = []
    needle = str(mountpoint).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        is_daemon = b"refmount" in argv or os.path.basename(argv[0]) == b"refmount"
        if is_daemon and needle in argv:  # not libfuse's fusermount3 auto_unmount helper
            pids.append(int(entry.name))
    return pids


def child_env() -> dict[str, str]:
    """The environment for a daemon: the repository importable even if not installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def stop_daemons(mountpoint: Path, timeout: float = 15.0) -> None:
    """Unmount, wait for the daemons of ``mountpoint`` to leave, SIGTERM those that stay."""
    unmount(mountpoint)
    deadline = time.monotonic() + timeout
    while (pids := daemon_pids(mountpoint)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    unmount(mountpoint)


class Mounted:
    """A refmount daemon in the foreground, a child of this process (so we own its pid)."""

    def __init__(
        self,
        refs: str | Path,
        mountpoint: Path,
        args: Sequence[str],
        log: Path,
        *,
        prefix: Sequence[str] = (),
        command: Sequence[str] = REFMOUNT,
        timeout: float = 60.0,
    ) -> None:
        self.mountpoint = mountpoint
        self.log_path = log
        self._log = log.open("wb")
        forced = os.environ.get(FETCH_WORKERS_ENV)
        if forced and "--fetch-workers" not in args:
            args = [*args, "--fetch-workers", forced]
        self.process = subprocess.Popen(
            [*prefix, *command, str(refs), str(mountpoint), "-f", *args],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=child_env(),
        )
        try:
            deadline = time.monotonic() + timeout
            while not is_mounted(mountpoint):
                if self.process.poll() is not None:
                    raise RuntimeError(f"refmount exited {self.process.returncode}: {self.log()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"refmount did not mount within {timeout:g} s: {self.log()}")
                time.sleep(0.02)
            os.stat(mountpoint)  # answers once the daemon's loop runs
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        unmount(self.mountpoint)
        self._log.close()
        return self.process.returncode

    def __enter__(self) -> Mounted:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Background:
    """A mount made by the command line: how long it took, and its daemon's pid."""

    path: Path
    ready: float  # seconds from starting the command to the root listing
    pid: int | None


@contextmanager
def mount_background(
    refs: str | Path,
    mountpoint: Path,
    args: Sequence[str] = (),
    *,
    command: Sequence[str] = REFMOUNT,
    timeout: float = 900.0,
) -> Iterator[Background]:
    """Mount as a user does (``refmount REFS MNT``: daemonizes, returns when the mount
    answers); ``ready`` runs until the root lists.  Unmounted on exit, whatever happens."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    if is_mounted(mountpoint):
        raise RuntimeError(f"{mountpoint} is already a mount point")
    try:
        start = time.perf_counter()
        done = subprocess.run(
            [*command, *args, str(refs), str(mountpoint)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=child_env(),
            stdin=subprocess.DEVNULL,
        )
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip().splitlines()
            raise RuntimeError(f"refmount exited {done.returncode}: {' | '.join(message[-3:])}")
        os.listdir(mountpoint)
        ready = time.perf_counter() - start
        if not is_mounted(mountpoint):
            raise RuntimeError("refmount returned but nothing is mounted")
        pids = daemon_pids(mountpoint)
        yield Background(mountpoint, ready, pids[0] if pids else None)
    finally:
        stop_daemons(mountpoint)


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """A process's resident memory (``VmRSS``) or its peak (``VmHWM``), in KiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for pid {pid}")


class RssSampler:
    """Polls a process's resident memory every 20 ms; ``close`` gives the peak in KiB
    (the larger of the samples and the kernel's VmHWM)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_kib = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):  # gone: keep what was seen
            self.peak_kib = max(self.peak_kib, rss_kib(self.pid), rss_kib(self.pid, "VmHWM"))

    def _loop(self) -> None:
        while not self._done.wait(0.02):
            self._sample()

    def close(self) -> int:
        self._sample()
        self._done.set()
        self._thread.join()
        return self.peak_kib

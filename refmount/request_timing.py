"""Where a READ's time goes: an opt-in timer for profiling the daemon (issue 15).

Off unless ``REFMOUNT_REQUEST_TIMING=N`` is set in the daemon's environment; then it
wraps, on one :class:`~refmount.fuse_ops.Operations` instance, the READ handler, the
file lookup in the tree and the block cache's read, and hooks the fetch bridge, and
every N READs logs one line (INFO, logger ``refmount.request_timing``) with, per READ:

- wall time from the handler's start (the request has been read from /dev/fuse and
  dispatched by pyfuse3) to its return (the reply follows at once, in pyfuse3), split
  into ``tree`` (finding the file's reference) and ``cache`` (the block cache, which
  includes waiting for fetches);
- ``bridge``: per fetch through fsspec's asyncio loop thread (fsspec's filesystems, and
  obstore's size requests; obstore's reads run in trio worker threads instead), the time
  from its completion there to the waiting trio task running again;
- CPU per READ of each thread of the process over the window, by thread name
  (``MainThread``: trio and pyfuse3; ``fsspecIO``: fsspec's asyncio loop;
  ``tokio-rt-worker``: obstore's Rust runtime; ``trio-worker``: trio's worker threads,
  where obstore's reads run), from ``/proc/self/task``.

When off, nothing is wrapped and the only cost is one ``None`` test per fetch.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ENVIRONMENT = "REFMOUNT_REQUEST_TIMING"
NS_PER_TICK = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def thread_cpu_ns() -> Counter[str]:
    """CPU time in ns of this process's threads, summed by thread name: the Python name
    of a Python thread (trio's workers as one), else the system's.  From each thread's
    ``schedstat`` (time on a CPU, in ns), where the kernel keeps one, else its ``stat``
    (user + system, in clock ticks)."""
    python_names = {
        t.native_id: "trio-worker" if t.name.startswith("Trio thread") else t.name
        for t in threading.enumerate()
    }
    cpu: Counter[str] = Counter()
    for task in Path("/proc/self/task").iterdir():
        try:
            text = (task / "stat").read_text()
            try:
                ns = int((task / "schedstat").read_text().split()[0])
            except FileNotFoundError:
                fields = text[text.rindex(")") + 2 :].split()
                ns = (int(fields[11]) + int(fields[12])) * NS_PER_TICK  # utime, stime
        except OSError:  # the thread ended meanwhile
            continue
        name = python_names.get(int(task.name)) or text[text.index("(") + 1 : text.rindex(")")]
        cpu[name] += ns
    return cpu


class RequestTimer:
    """Accumulates the phases of READs and logs their means every ``every`` READs."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.reads = 0
        self.wall_ns: Counter[str] = Counter()
        self.fetches = 0
        self._threads = thread_cpu_ns()
        self._since = time.perf_counter_ns()

    @classmethod
    def from_environment(cls) -> RequestTimer | None:
        text = os.environ.get(ENVIRONMENT, "")
        try:
            every = int(text) if text else 0
        except ValueError:
            log.warning(
                "%s=%r is not a number of READs: request timing stays off", ENVIRONMENT, text
            )
            return None
        return cls(every) if every > 0 else None

    def install(self, operations: Any) -> None:
        """Time ``operations``' READs from now on (instance attributes: the class and
        every other instance stay as they are)."""
        from refmount.fetch import fsspec_backend

        cache = operations.cache
        cache.read_buffer = self._timed("cache", cache.read_buffer)
        operations._file = self._timed("tree", operations._file)
        operations.read = self._counted(self._timed("read", operations.read))
        fsspec_backend.bridge_observer = self._bridged
        log.info("request timing on: a summary every %d READs", self.every)

    def _timed(self, phase: str, call: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        wall = self.wall_ns

        @functools.wraps(call)
        async def timed(*args: Any) -> Any:
            began = time.perf_counter_ns()
            try:
                return await call(*args)
            finally:
                wall[phase] += time.perf_counter_ns() - began

        return timed

    def _counted(self, read: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        @functools.wraps(read)
        async def counted(*args: Any) -> Any:
            try:
                return await read(*args)
            finally:
                self.reads += 1
                if self.reads >= self.every:
                    self.report()

        return counted

    def _bridged(self, done_ns: int) -> None:
        """A fetch's trio task runs again, ``done_ns`` after its asyncio completion."""
        self.fetches += 1
        self.wall_ns["bridge"] += time.perf_counter_ns() - done_ns

    def report(self) -> None:
        """Log the window's means and start a new window."""
        reads, now = max(self.reads, 1), time.perf_counter_ns()
        threads = thread_cpu_ns()
        cpu = {
            name: (ns - self._threads.get(name, 0)) / reads / 1000 for name, ns in threads.items()
        }
        shown_cpu = ", ".join(
            f"{name} {us:.0f}" for name, us in sorted(cpu.items(), key=lambda kv: -kv[1]) if us >= 1
        )
        wall = self.wall_ns
        bridge = wall["bridge"] / self.fetches / 1000 if self.fetches else 0.0
        log.info(
            "%d READs in %.2f s (%d fetches through the asyncio loop); per READ, us of wall: "
            "read %.0f (tree %.0f, cache %.0f); bridge %.0f per such fetch; us of CPU per "
            "READ: total %.0f (%s)",
            self.reads, (now - self._since) / 1e9, self.fetches, wall["read"] / reads / 1000,
            wall["tree"] / reads / 1000, wall["cache"] / reads / 1000, bridge,
            sum(cpu.values()), shown_cpu,
        )  # fmt: skip
        self.reads = self.fetches = 0
        wall.clear()
        self._threads, self._since = threads, now

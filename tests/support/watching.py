"""Quantities a background task maintains (free space, memory, counters), observed the
way a user would see them on a busy machine: waited for with a deadline when the claim
is about a state reached eventually, sampled all along when it is about a bound."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

SAMPLE_SECONDS = 0.002  # between two samples


def eventually(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Wait until ``check()`` is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.02)


def free_bytes(path: Path) -> int:
    """The free space of ``path``'s filesystem, as ``df`` shows it to a user."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class Sampled:
    """``read()`` sampled by a thread every :data:`SAMPLE_SECONDS` while the ``with``
    block runs (and once at each end): the least and the greatest value seen."""

    def __init__(self, read: Callable[[], int]) -> None:
        self.read = read
        self.least: int | None = None
        self.greatest: int | None = None
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        value = self.read()
        self.samples += 1
        self.least = value if self.least is None else min(self.least, value)
        self.greatest = value if self.greatest is None else max(self.greatest, value)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self._sample()

    def __enter__(self) -> Sampled:
        self._sample()
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

"""Progress while a reference set loads: a line on a terminal, and under systemd
``STATUS=`` plus ``EXTEND_TIMEOUT_USEC=`` so that a slow load is not killed.

:func:`refmount.refs.open_refset` calls a :class:`LoadProgress` at each stage with the
keys and bytes known so far.  A single read or parse may take minutes and say nothing
meanwhile, so a heartbeat thread repeats the latest figures (with the time elapsed) and
keeps extending systemd's start timeout until the load ends, successfully or not.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from types import TracebackType
from typing import TextIO

from refmount.redaction import redact
from refmount.service.notify import notify

#: how often the heartbeat speaks, seconds
TERMINAL_INTERVAL = 0.5
SYSTEMD_INTERVAL = 10.0
#: each EXTEND_TIMEOUT_USEC= grants this long from the moment it is sent: generous, as
#: one parse step may hold the interpreter (and so this heartbeat) for tens of seconds
EXTEND_SECONDS = 120.0


class LoadProgress:
    """The callback handed to ``open_refset``, and the heartbeat around it.

    ``terminal`` is a stream to draw the progress line on (None: no line); ``systemd``
    says whether to send notifications.  Use as a context manager around the load.
    """

    def __init__(self, name: str, *, terminal: TextIO | None, systemd: bool) -> None:
        self.name = redact(name)  # shown on terminals and in the journal
        self.terminal = terminal
        self.systemd = systemd
        self.stage = "reading"
        self.keys = 0
        self.nbytes = 0
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._clear_filter: _ClearLine | None = None

    @classmethod
    def for_command(cls, name: str, *, stream: TextIO | None = None) -> LoadProgress:
        """Progress as the command line shows it: a line when ``stream`` (standard error)
        is a terminal, notifications when ``$NOTIFY_SOCKET`` is set."""
        stream = sys.stderr if stream is None else stream
        terminal = stream if _is_terminal(stream) else None
        return cls(name, terminal=terminal, systemd=bool(os.environ.get("NOTIFY_SOCKET")))

    # -- the callback ---------------------------------------------------------------------

    def __call__(self, stage: str, keys: int, nbytes: int) -> None:
        """``open_refset`` reports a stage: ``reading``, ``parsing``, ``indexing`` or
        ``loaded``, with the keys and bytes of the reference set known so far."""
        with self._lock:
            self.stage = stage
            self.keys = max(self.keys, keys)
            self.nbytes = max(self.nbytes, nbytes)
        self._speak(extend=False)

    def describe(self) -> str:
        """``loading: 1,234,567 keys, 812.3 MB read (parsing, 14 s)``."""
        with self._lock:
            stage, keys, nbytes = self.stage, self.keys, self.nbytes
        elapsed = time.monotonic() - self._started
        parts = [f"{keys:,} keys" if keys else "", f"{nbytes / 1e6:,.1f} MB read" if nbytes else ""]
        figures = ", ".join(p for p in parts if p) or "started"
        return f"loading: {figures} ({stage}, {elapsed:.0f} s)"

    # -- the heartbeat --------------------------------------------------------------------

    def __enter__(self) -> LoadProgress:
        if self.terminal is not None:
            self._clear_filter = _ClearLine(self.terminal)
            for handler in _handlers_on(self.terminal):
                handler.addFilter(self._clear_filter)
        if self.terminal is not None or self.systemd:
            self._speak(extend=True)
            self._thread = threading.Thread(
                target=self._beat, name="refmount-load-progress", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        if self.terminal is not None:
            self._write_line("")
            if self._clear_filter is not None:
                for handler in _handlers_on(self.terminal):
                    handler.removeFilter(self._clear_filter)
        if self.systemd:
            with self._lock:
                keys = self.keys
            outcome = f"loaded {keys:,} keys" if kind is None else "loading failed"
            notify(f"STATUS={outcome} from {self.name}")

    def _beat(self) -> None:
        interval = TERMINAL_INTERVAL if self.terminal is not None else SYSTEMD_INTERVAL
        last_extend = time.monotonic()
        while not self._done.wait(interval):
            now = time.monotonic()
            extend = now - last_extend >= SYSTEMD_INTERVAL
            if extend:
                last_extend = now
            self._speak(extend=extend)

    def _speak(self, *, extend: bool) -> None:
        text = self.describe()
        if self.terminal is not None:
            self._write_line(f"refmount: {self.name}: {text}")
        if self.systemd:
            message = f"STATUS={text}"
            if extend:
                message += f"\nEXTEND_TIMEOUT_USEC={int(EXTEND_SECONDS * 1e6)}"
            notify(message)

    def _write_line(self, text: str) -> None:
        assert self.terminal is not None
        with contextlib.suppress(OSError, ValueError):  # a closed terminal stops no load
            self.terminal.write(f"\r\x1b[K{text}")
            self.terminal.flush()


class _ClearLine(logging.Filter):
    """Clears the progress line before a log record is written to the same terminal, so
    that a warning starts on a clean line; the next heartbeat draws the line again."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream

    def filter(self, record: logging.LogRecord) -> bool:
        with contextlib.suppress(OSError, ValueError):
            self.stream.write("\r\x1b[K")
        return True


def _handlers_on(stream: TextIO) -> list[logging.StreamHandler]:
    return [
        h
        for h in logging.getLogger().handlers
        if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is stream
    ]


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError, AttributeError):
        return False

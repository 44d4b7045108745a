"""What every worker process of the daemon shares: how it is started from the daemon,
how it dies with the daemon, and where its replies go.

Workers are started from the trio thread itself (``subprocess.Popen`` execs at once; the
start-up happens in the child): ``PR_SET_PDEATHSIG`` fires when the *thread* that
started a child ends, and trio's worker threads end when idle.  The daemon is
multi-threaded, so a worker is a fresh interpreter (fork then exec), never a fork of it.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import subprocess
import sys

#: Environment of a worker: one thread per numerical library.
WORKER_ENVIRONMENT = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "BLOSC_NTHREADS": "1"}
#: Bytes a pipe to or from a worker holds (Linux allows unprivileged users 1 MiB).
PIPE_SIZE = 1 << 20

_PR_SET_PDEATHSIG = 1

#: Where workers' standard error goes: None, the daemon's own (a daemon in the
#: foreground); ``subprocess.DEVNULL`` once :func:`detach_stderr` (a daemon in the
#: background, whose standard error is the starting command's until the mount is ready:
#: a worker holding it would keep whoever reads that command's output waiting forever).
_stderr: int | None = None


def detach_stderr() -> None:
    """Start workers from now on with their standard error going nowhere."""
    global _stderr
    _stderr = subprocess.DEVNULL


def spawn(module: str, *args: str) -> tuple[subprocess.Popen[bytes], int, int]:
    """Start ``python -m module PARENT_PID *args`` with a pipe on its stdin and one on its
    stdout: (the process, the daemon's end of its requests, the daemon's end of its
    replies), both pipes of :data:`PIPE_SIZE` where the system allows."""
    to_child, requests = os.pipe2(os.O_CLOEXEC)
    replies, from_child = os.pipe2(os.O_CLOEXEC)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", module, str(os.getpid()), *args],
            stdin=to_child,
            stdout=from_child,
            stderr=_stderr,
            env={**os.environ, **WORKER_ENVIRONMENT},
            close_fds=True,
        )
    except BaseException:
        for fd in (to_child, requests, replies, from_child):
            os.close(fd)
        raise
    os.close(to_child)
    os.close(from_child)
    for fd in (requests, replies):  # fewer wake-ups per chunk than 64 KiB pipes
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    return process, requests, replies


def die_with(parent: int) -> None:
    """In a worker: be killed when the daemon ``parent`` ends (``PR_SET_PDEATHSIG``), and
    leave now if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the daemon died before the line above
        os._exit(0)


def settle_signals() -> None:
    """In a worker: take no signal mask from the daemon, and leave a terminal's ^C to the
    daemon to act on."""
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def reply_channel() -> int:
    """In a worker: a descriptor of the stdout it was started with, for its replies; its
    own fd 1 then points at stderr, so a library that prints cannot corrupt a reply."""
    replies = os.dup(1)
    os.dup2(2, 1)
    return replies


def how_it_ended(process: subprocess.Popen[bytes]) -> str:
    """A worker's end as log lines and errors say it: "killed by SIGKILL", "exited with
    status 1", or "still running"."""
    code = process.poll()
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"

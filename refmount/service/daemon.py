"""The daemon's life cycle: start in the background, mount, serve, stop cleanly.

Background mode forks before anything starts a thread (trio, fsspec's loop, pyarrow's
pools): the child loads the reference set, mounts, and writes ``ok`` or the error to a
pipe once the mount answers; the parent waits for that (bounded), prints any error and
exits with the child's verdict.  SIGINT and SIGTERM unmount and exit 0; SIGHUP reloads.

The mount point is claimed first: an exclusive ``flock`` on the directory itself, held
by the daemon for its life, so that two refmounts started at once on one directory
cannot both mount there (the loser is told so).  Once mounted, the path leads to the
mount and the second is refused as "already a mount point".
"""

from __future__ import annotations

import errno
import fcntl
import logging
import logging.handlers
import os
import select
import signal
import stat
import sys
import time
from collections.abc import Callable

from refmount.fetch.trust import remove_private_directory
from refmount.malloc import tune_malloc
from refmount.options import Config
from refmount.redaction import Scrubber, ScrubbingFormatter
from refmount.workers.process import detach_stderr

EXIT_GRACE = 30.0  # seconds a failed background daemon gets to unmount and exit

log = logging.getLogger("refmount")


class MountError(Exception):
    """The mount cannot be made; the message says why."""


def run(config: Config) -> int:
    claim = claim_mountpoint(config.mountpoint, nonempty=config.nonempty)
    try:
        if config.foreground:
            setup_logging(config, background=False)
            return serve(config, ready=lambda: None)
        return _run_in_background(config)
    finally:
        os.close(claim)  # the daemon holds its own copy for its life


def claim_mountpoint(path: str, *, nonempty: bool = False) -> int:
    """Check that ``path`` can be mounted on and lock it against a second refmount.
    Returns the locked descriptor: the lock lasts while any copy of it is open."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise MountError(f"mountpoint {path} does not exist") from None
    except OSError as exc:
        if exc.errno == errno.ENOTCONN:
            raise MountError(
                f"{path} is a dead FUSE mount; clear it with: fusermount3 -u -z {path}"
            ) from None
        raise MountError(f"mountpoint {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise MountError(f"mountpoint {path} is not a directory")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise MountError(f"mountpoint {path}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise MountError(f"another refmount is mounting on {path}") from None
        if os.path.ismount(path):
            raise MountError(f"{path} is already a mount point")
        if not nonempty and os.listdir(fd):
            raise MountError(f"mountpoint {path} is not empty (--nonempty mounts over it)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def setup_logging(config: Config, *, background: bool) -> None:
    handler: logging.Handler
    if config.log_file:
        handler = logging.FileHandler(config.log_file)
    elif background and os.path.exists("/dev/log"):
        handler = logging.handlers.SysLogHandler("/dev/log")
    else:
        handler = logging.StreamHandler(sys.stderr)
    scrub = Scrubber(config.refs)
    if isinstance(handler, logging.handlers.SysLogHandler):
        handler.setFormatter(ScrubbingFormatter(scrub, "refmount[%(process)d]: %(message)s"))
    else:
        handler.setFormatter(
            ScrubbingFormatter(scrub, "%(asctime)s %(levelname)s %(name)s: %(message)s")
        )
    if background and isinstance(handler, logging.StreamHandler) and not config.log_file:
        handler.setLevel(logging.WARNING)  # the user's terminal, until the mount is ready
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.log_level)
    if config.log_level != "DEBUG":
        # azure-core logs each request, headers and all, at INFO.
        noisy_loggers = ("fsspec", "aiobotocore", "botocore", "s3fs", "asyncio")
        for noisy in (*noisy_loggers, "gcsfs", "google", "adlfs", "azure"):
            logging.getLogger(noisy).setLevel(logging.WARNING)


def _run_in_background(config: Config) -> int:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the daemon
        os.close(read_end)
        os.setsid()
        _detach_stdio()
        detach_stderr()  # the daemon's logs go to syslog or its file, not through workers
        setup_logging(config, background=True)

        def ready() -> None:
            os.write(write_end, b"ok")
            os.close(write_end)
            _silence_stderr()

        try:
            code = serve(config, ready=ready, on_error=lambda m: _report(write_end, m))
        except BaseException as exc:  # the parent must hear of every failure
            _report(write_end, Scrubber(config.refs)(f"refmount: {exc}"))
            code = 1
        remove_private_directory()  # os._exit runs no atexit
        os._exit(code)
    os.close(write_end)
    return _wait_for_daemon(pid, read_end, config)


def _detach_stdio() -> None:
    """Standard input and output go nowhere; standard error stays on the terminal until
    the mount is ready, so that a failure to start is seen."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)


def _silence_stderr() -> None:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)


def _report(fd: int, message: str) -> None:
    try:
        os.write(fd, message.encode(errors="replace")[:65536])
        os.close(fd)
    except OSError:
        pass


def _wait_for_daemon(pid: int, fd: int, config: Config) -> int:
    deadline = time.monotonic() + config.ready_timeout
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGTERM)
            print(f"refmount: the mount was not ready within {config.ready_timeout:g} s",
                  file=sys.stderr)  # fmt: skip
            return 1
        readable, _, _ = select.select([fd], [], [], left)
        if not readable:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    message = b"".join(chunks).decode(errors="replace")
    if message == "ok":
        return 0
    status = _reap(pid, EXIT_GRACE)
    print(message or f"refmount: the daemon exited ({_describe_status(status)})",
          file=sys.stderr)  # fmt: skip
    return 1


def _reap(pid: int, grace: float) -> int:
    """The status of a daemon that failed to start, killed if it has not exited (and
    unmounted) within ``grace`` seconds: a failed start leaves no process behind."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


def _describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"status {os.WEXITSTATUS(status)}"


def serve(
    config: Config,
    *,
    ready: Callable[[], None],
    on_error: Callable[[str], None] | None = None,
) -> int:
    """Load, mount and serve until told to stop.  Returns the exit status."""
    _refuse_pandas()
    tune_malloc()  # before any thread: see refmount.malloc
    # SIGHUP reloads once serving; until then it must not kill the daemon.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    from refmount.service.serve import Daemon

    scrub = Scrubber(config.refs)
    try:
        daemon = Daemon.load(config)
    except Exception as exc:
        message = scrub(f"refmount: {exc}")
        if on_error is None:
            print(message, file=sys.stderr)
        else:
            on_error(message)
        return 1
    return daemon.run(ready, on_error)


class _NoPandas:
    """Keeps pandas out of the daemon: pyarrow imports it (0.2 s, 35 MB resident) on its
    first array conversion only to recognise pandas objects, and the daemon has none.
    pyarrow takes the ImportError as "no pandas" and carries on.  (A ``None`` in
    ``sys.modules`` would not do: pyarrow's compiled import returns it as the module.)"""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] == "pandas":
            raise ModuleNotFoundError("pandas is not loaded in the refmount daemon", name=name)


def _refuse_pandas() -> None:
    if "pandas" not in sys.modules:
        sys.meta_path.insert(0, _NoPandas())

"""Real servers on 127.0.0.1 for tests and benchmarks: the range server and moto's S3.

Each server runs as a subprocess owned by a context manager, which stops exactly that
process (by its pid) on exit.  Server logs go to a temporary file rather than a pipe, so
a chatty server can never block on a full pipe; the log is quoted when startup fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

RANGESERVER_SCRIPT = Path(__file__).with_name("rangeserver.py")
HOST = "127.0.0.1"
S3_KEY = "testing"
S3_REGION = "us-east-1"

# Requests to our own servers must never go through a proxy from the environment.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _http(method: str, url: str, body: Any = None, timeout: float = 10.0) -> Any:
    """Send a request with an optional JSON body; return the decoded JSON answer, if any."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    with _opener.open(request, timeout=timeout) as response:
        payload = response.read()
    return json.loads(payload) if payload else None


def stop_process(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """Terminate this one process, then kill it if it has not gone within grace seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


def _read_log(log: IO[bytes]) -> str:
    log.flush()
    log.seek(0)
    return log.read().decode(errors="replace")


class _Subprocess:
    """Shared plumbing: a child process whose stderr (and maybe stdout) goes to a log file."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def _spawn(self, argv: list[str], *, env: dict[str, str] | None = None, **kw: Any) -> None:
        # Closed in stop(); it must outlive this call.
        self._log = tempfile.TemporaryFile(prefix="refmount-server-")  # noqa: SIM115
        kw.setdefault("stdout", self._log)
        self._proc = subprocess.Popen(argv, stderr=self._log, env=env, **kw)

    def log_text(self) -> str:
        """What the server has written to stderr so far."""
        return "" if self._log is None else _read_log(self._log)

    def stop(self) -> None:
        if self._proc is not None:
            stop_process(self._proc)
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def _fail(self, message: str) -> RuntimeError:
        log = self.log_text()
        self.stop()
        return RuntimeError(f"{message}\n--- server stderr ---\n{log}")

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        raise NotImplementedError

    def _wait_answering(self, url: str, name: str, timeout: float) -> None:
        """Return once ``url`` answers at all (any HTTP status); fail, quoting the log,
        when the process exits or ``timeout`` seconds pass first."""
        deadline = time.monotonic() + timeout
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise self._fail(f"{name} exited with status {self._proc.returncode}")
            try:
                with _opener.open(url, timeout=2.0):
                    return
            except urllib.error.HTTPError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise self._fail(f"{name} did not answer within {timeout:g} s") from None
                time.sleep(0.1)


class RangeServer(_Subprocess):
    """tests/support/rangeserver.py serving root on 127.0.0.1, with faults under control.

    Usage::

        with RangeServer(tmp_path, delay=0.05) as server:
            server.fault("/data.bin", "503", count=2)
            fetch(f"{server.url}/data.bin")  # two 503s, then the data
    """

    def __init__(
        self,
        root: Path,
        delay: float = 0.0,
        *,
        startup_timeout: float = 20.0,
        validators: bool = False,
    ) -> None:
        super().__init__()
        self.root = Path(root)
        self.delay = delay
        self.startup_timeout = startup_timeout
        self.validators = validators
        self.port: int | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("RangeServer is not running")
        return f"http://{HOST}:{self.port}"

    def start(self) -> None:
        argv = [sys.executable, str(RANGESERVER_SCRIPT), "--root", str(self.root)]
        argv += ["--host", HOST, "--port", "0", "--delay", str(self.delay), "--watch-stdin"]
        if self.validators:
            argv.append("--validators")
        # stdin is a pipe we never write: when this process dies, the server sees EOF and exits.
        self._spawn(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.port = self._read_port()

    def _read_port(self) -> int:
        assert self._proc is not None and self._proc.stdout is not None
        stdout = self._proc.stdout
        deadline = time.monotonic() + self.startup_timeout
        while (remaining := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([stdout], [], [], remaining)
            if not ready:
                break
            line = stdout.readline().decode(errors="replace").strip()
            if line.startswith("PORT "):
                return int(line.split()[1])
            if not line and self._proc.poll() is not None:
                raise self._fail(f"rangeserver exited with status {self._proc.returncode}")
        raise self._fail(f"rangeserver printed no PORT line within {self.startup_timeout} s")

    def stop(self) -> None:
        super().stop()
        self.port = None

    def fault(self, path: str, mode: str, count: int = 1, *, method: str | None = None) -> None:
        """Make the next count requests for path ("*" = any) fail in the given mode.

        count -1 means forever; method ("GET"/"HEAD") limits the rule to one method.
        """
        rule: dict[str, Any] = {"path": path, "mode": mode, "count": count}
        if method is not None:
            rule["method"] = method
        _http("POST", f"{self.url}/_faults", rule)

    def clear_faults(self) -> None:
        _http("DELETE", f"{self.url}/_faults")

    def stats(self) -> dict[str, Any]:
        """{"requests", "ranges": [[path, start, end_exclusive]...], "faults_left", ...}."""
        result: dict[str, Any] = _http("GET", f"{self.url}/_stats")
        return result

    def reset_stats(self) -> None:
        _http("DELETE", f"{self.url}/_stats")


def _moto_command() -> list[str]:
    script = Path(sys.executable).parent / "moto_server"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "moto.server"]


class MotoServer(_Subprocess):
    """moto's S3 (and other AWS services) as a real HTTP server on 127.0.0.1."""

    def __init__(self, *, startup_timeout: float = 30.0, attempts: int = 3) -> None:
        super().__init__()
        self.startup_timeout = startup_timeout
        self.attempts = attempts
        self.port: int | None = None
        self._client: Any = None

    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise RuntimeError("MotoServer is not running")
        return f"http://{HOST}:{self.port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """Keyword arguments for s3fs.S3FileSystem talking to this server."""
        return {
            "endpoint_url": self.endpoint,
            "key": S3_KEY,
            "secret": S3_KEY,
            "client_kwargs": {"region_name": S3_REGION},
        }

    def start(self) -> None:
        env = dict(os.environ, AWS_ACCESS_KEY_ID=S3_KEY, AWS_SECRET_ACCESS_KEY=S3_KEY)
        env.setdefault("AWS_DEFAULT_REGION", S3_REGION)
        # free_port() can race with another process taking the port: try a few times.
        for attempt in range(1, self.attempts + 1):
            self.port = free_port()
            self._spawn(
                [*_moto_command(), "-H", HOST, "-p", str(self.port)],
                env=env,
                stdin=subprocess.DEVNULL,
            )
            try:
                self._wait_ready()
                return
            except RuntimeError:
                if attempt == self.attempts:
                    raise

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise self._fail(f"moto_server exited with status {self._proc.returncode}")
            try:
                with _opener.open(f"{self.endpoint}/", timeout=2.0):
                    return
            except urllib.error.HTTPError:
                return  # any HTTP answer means it is listening
            except OSError:
                time.sleep(0.1)
        raise self._fail(f"moto_server did not answer within {self.startup_timeout} s")

    def stop(self) -> None:
        super().stop()
        self.port = None
        self._client = None

    def client(self) -> Any:
        """A boto3 S3 client for this server (made once per start)."""
        if self._client is None:
            import boto3  # imported late: only S3 users need it

            self._client = boto3.client(
                "s3",
                endpoint_url=self.endpoint,
                aws_access_key_id=S3_KEY,
                aws_secret_access_key=S3_KEY,
                region_name=S3_REGION,
            )
        return self._client

    def make_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client().put_object(Bucket=bucket, Key=key, Body=data)

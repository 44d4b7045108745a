"""Azurite's blob service on 127.0.0.1: Azure Blob Storage for tests.

Azurite (the Azure Storage emulator, npm package ``azurite``) is installed by
``.ci/setup`` into ``.ci/node`` (not committed); ``AZURITE_BLOB`` names another
``azurite-blob`` executable.  It runs as our own child process, stopped by its pid, with
its data in a temporary directory removed on stop, its telemetry off (it would otherwise
try to reach Microsoft), and account names taken from the URL's first path segment, so
that the account's blob endpoint is ``http://127.0.0.1:PORT/devstoreaccount1``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tests.support.mounting import REPO
from tests.support.servers import HOST, _Subprocess, free_port

#: Azurite's well-known development account and key (public, in Azure's documentation).
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite_binary() -> Path:
    """The ``azurite-blob`` executable: ``AZURITE_BLOB``, ``.ci/node``'s, or on PATH."""
    candidates = [
        os.environ.get("AZURITE_BLOB"),
        str(REPO / ".ci" / "node" / "node_modules" / ".bin" / "azurite-blob"),
        shutil.which("azurite-blob"),
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise RuntimeError("Azurite is missing: run .ci/setup (npm install azurite into .ci/node)")


def connection_string(blob_endpoint: str) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
        f"BlobEndpoint={blob_endpoint};"
    )


class Azurite(_Subprocess):
    """Azurite's blob service over plain HTTP on 127.0.0.1."""

    def __init__(self, *, startup_timeout: float = 60.0) -> None:
        super().__init__()
        self.startup_timeout = startup_timeout
        self.port = 0
        self._data: tempfile.TemporaryDirectory[str] | None = None
        self._client: Any = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def blob_endpoint(self) -> str:
        return f"{self.url}/{ACCOUNT}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """adlfs's options for this server: what ``--remote-options`` takes under ``az``."""
        return {"connection_string": connection_string(self.blob_endpoint)}

    def start(self) -> None:
        self._data = tempfile.TemporaryDirectory(prefix="refmount-azurite-")
        self.port = free_port()
        argv = [str(azurite_binary()), "--blobHost", HOST, "--blobPort", str(self.port)]
        argv += ["--location", self._data.name, "--silent", "--disableTelemetry"]
        argv += ["--disableProductStyleUrl", "--skipApiVersionCheck", "--loose"]
        self._spawn(argv)
        # Any answer (403: the probe is not signed) means it is listening.
        self._wait_answering(f"{self.blob_endpoint}?comp=list", "azurite", self.startup_timeout)

    def stop(self) -> None:
        super().stop()
        self._client = None
        if self._data is not None:
            self._data.cleanup()
            self._data = None

    def client(self) -> Any:
        """An azure-storage-blob service client for this server (made once per start)."""
        if self._client is None:
            from azure.storage.blob import BlobServiceClient  # comes with adlfs

            self._client = BlobServiceClient.from_connection_string(
                connection_string(self.blob_endpoint)
            )
        return self._client

    def make_container(self, name: str) -> None:
        self.client().create_container(name)

    def put(self, container: str, key: str, data: bytes) -> str:
        """Write a blob (replacing any); its ETag."""
        blob = self.client().get_blob_client(container, key)
        return str(blob.upload_blob(data, overwrite=True)["etag"])

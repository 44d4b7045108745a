"""Faults in front of a real object store: nginx proxying to an emulator, with the range
server as a gate that can answer first.

The emulators (fake-gcs-server, Azurite) cannot be told to fail.  nginx passes each
request to the range server first, which serves an empty directory: without a fault
rule it answers 404, and nginx (``proxy_next_upstream http_404``) passes the same
request on to the emulator, whose answer the client gets; with a rule (``fault(path,
"503", count=2)``) the range server's answer is the one the client gets.  So every
request the client sends is counted by the range server (``attempts``), and every body
comes from the emulator.  The request keeps its path and is sent with the emulator's own
``Host`` (fake-gcs-server routes by it; neither emulator's signatures cover it).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.support.nginx import NginxServer
from tests.support.servers import HOST, RangeServer


def proxy_config(port: int, gate: int, store: int, prefix: Path) -> str:
    return f"""
daemon off;
master_process on;
worker_processes 1;
user root;
pid {prefix}/nginx.pid;
error_log stderr error;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    upstream store {{
        server {HOST}:{gate} max_fails=0;
        server {HOST}:{store} backup;
    }}
    server {{
        listen {HOST}:{port};
        client_max_body_size 0;
        location / {{
            proxy_pass http://store;
            proxy_next_upstream http_404;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host {HOST}:{store};
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"""


class _Proxy(NginxServer):
    def __init__(self, gate: int, store: int) -> None:
        super().__init__(Path(tempfile.gettempdir()))
        self.gate, self.store = gate, store

    def config_text(self, prefix: Path) -> str:
        return proxy_config(self.port, self.gate, self.store, prefix)


class FaultProxy:
    """nginx on 127.0.0.1 in front of the server at ``store_port``, faults from a range
    server.  ``url`` replaces the store's own ``http://127.0.0.1:PORT``."""

    def __init__(self, store_port: int) -> None:
        self.store_port = store_port
        self._empty: tempfile.TemporaryDirectory[str] | None = None
        self._gate: RangeServer | None = None
        self._proxy: _Proxy | None = None

    @property
    def url(self) -> str:
        assert self._proxy is not None
        return self._proxy.url

    @property
    def gate(self) -> RangeServer:
        assert self._gate is not None
        return self._gate

    def fault(self, path: str, mode: str, count: int = 1) -> None:
        """The next ``count`` requests for ``path`` (as the client's URL names it, decoded;
        ``*``: any) get the range server's fault ``mode`` (``503``, ``404``, ``reset`` ...)."""
        self.gate.fault(path, mode, count)

    def attempts(self) -> int:
        """Requests the client sent since the last ``reset``."""
        return int(self.gate.stats()["requests"])

    def reset(self) -> None:
        self.gate.clear_faults()
        self.gate.reset_stats()

    def __enter__(self) -> Self:
        self._empty = tempfile.TemporaryDirectory(prefix="refmount-fault-gate-")
        try:
            self._gate = RangeServer(Path(self._empty.name)).__enter__()
            self._proxy = _Proxy(self._gate.port or 0, self.store_port).__enter__()
            self.reset()  # nginx's own readiness probe went through the gate
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for server in (self._proxy, self._gate):
            if server is not None:
                server.stop()
        self._proxy = self._gate = None
        if self._empty is not None:
            self._empty.cleanup()
            self._empty = None

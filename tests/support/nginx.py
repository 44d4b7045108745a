"""nginx on 127.0.0.1 serving a directory with byte ranges: the server a user meets.

Benchmarks measure against it rather than a Python server, which on a small machine
takes CPU from the daemon and hides its cost.  ``delay`` makes every data request wait
(``echo_sleep`` from Debian's ``libnginx-mod-http-echo``) without blocking the worker,
like an object store's time to first byte.  Needs Debian's ``nginx-light`` and
``libnginx-mod-http-echo`` (installed by ``.ci/setup``).
"""

from __future__ import annotations

import shutil
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.certificates import Certificates
from tests.support.servers import HOST, _Subprocess, free_port

ECHO_MODULE = Path("/usr/lib/nginx/modules/ngx_http_echo_module.so")
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
#: A request's line in the wire log: HTTP version, TLS version and cipher ("-" over
#: plain http), and nginx's serial number of the connection it came on.
WIRE_FORMAT = "$server_protocol $ssl_protocol $ssl_cipher $connection"


def nginx_available() -> str | None:
    """Why nginx cannot run here, or None when it can."""
    if shutil.which("nginx") is None:
        return "nginx is not installed (apt-get install nginx-light)"
    if not ECHO_MODULE.exists():
        return f"{ECHO_MODULE} is missing (apt-get install libnginx-mod-http-echo)"
    return None


def nginx_config(
    root: Path,
    port: int,
    delay: float,
    prefix: Path,
    *,
    autoindex: bool = False,
    tls: tuple[int, Certificates] | None = None,
    wire_log: Path | None = None,
) -> str:
    """A one-server configuration: ``root`` on 127.0.0.1:``port``, ranges honoured,
    no compression; ``delay`` seconds before each data answer;
    ``autoindex``: a directory's URL answers an index page of its entries (what a
    catalog over HTTP and rclone's http remote read); ``tls``: the same over TLS on a
    second port, with that certificate; ``wire_log``: a line per request in that file
    with what was spoken (:data:`WIRE_FORMAT`), else no access log."""
    wait = f"echo_sleep {delay:.3f};\n            echo_exec @static;" if delay > 0 else ""
    listing = "autoindex on;" if autoindex else ""
    access = "access_log off;"
    if wire_log is not None:
        access = f"log_format wire '{WIRE_FORMAT}';\n    access_log {wire_log} wire;"
    secure = ""
    if tls is not None:
        tls_port, files = tls
        secure = (
            f"listen {HOST}:{tls_port} ssl;\n        ssl_certificate {files.cert};\n"
            f"        ssl_certificate_key {files.key};\n        ssl_session_cache off;"
        )
    server = f"""
    server {{
        listen {HOST}:{port};
        {secure}
        root {root};
        {listing}
        location / {{
            {wait}
        }}
        location @static {{ }}
    }}"""
    return nginx_main(prefix, server, access=access)


def nginx_main(prefix: Path, servers: str, *, access: str = "access_log off;") -> str:
    """nginx's configuration around ``servers`` (its ``server`` blocks): in the
    foreground, one worker, temporary files and pid under ``prefix``, ranges and
    kept-alive connections as refmount's tests and benchmarks want them."""
    return f"""
load_module {ECHO_MODULE};
daemon off;
master_process on;
worker_processes 1;
user root;
pid {prefix}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 1024; }}
http {{
    {access}
    sendfile on;
    # tcp_nopush (TCP_CORK) holds the last partial segment of an answer whose length is
    # not a multiple of the segment size until the client's delayed ACK: 40-44 ms more
    # for such a range on a kept-alive connection, with or without the delay.
    tcp_nopush off;
    keepalive_requests 100000;
    keepalive_timeout 120s;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    types {{ }}
    default_type application/octet-stream;{servers}
}}
"""


class NginxServer(_Subprocess):
    """nginx serving ``root`` on 127.0.0.1, run in the foreground as a child of ours.

    Usage::

        with NginxServer(root, delay=0.010) as server:
            url = f"{server.url}/file.bin"
    """

    def __init__(
        self,
        root: Path,
        delay: float = 0.0,
        *,
        startup_timeout: float = 20.0,
        autoindex: bool = False,
        tls: Certificates | None = None,
        wire_log: Path | None = None,
    ) -> None:
        super().__init__()
        self.tls = tls
        self.wire_log = wire_log
        self.tls_port = 0
        self.root = Path(root).resolve()
        self.delay = delay
        self.autoindex = autoindex
        self.startup_timeout = startup_timeout
        self.port = 0
        self._prefix: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def https_url(self) -> str:
        """The same files over TLS (with ``tls`` certificates only)."""
        assert self.tls is not None
        return f"https://{HOST}:{self.tls_port}"

    def start(self) -> None:
        why = nginx_available()
        if why is not None:
            raise RuntimeError(why)
        self._prefix = tempfile.TemporaryDirectory(prefix="refmount-nginx-")
        prefix = Path(self._prefix.name)
        self.port = free_port()
        if self.tls is not None:
            self.tls_port = free_port()
        config = prefix / "nginx.conf"
        config.write_text(self.config_text(prefix))
        self._spawn(["nginx", "-p", str(prefix), "-c", str(config)])
        self._wait_ready()

    def config_text(self, prefix: Path) -> str:
        """nginx's configuration, its scratch files under ``prefix``."""
        tls = None if self.tls is None else (self.tls_port, self.tls)
        return nginx_config(
            self.root, self.port, self.delay, prefix, autoindex=self.autoindex, tls=tls,
            wire_log=self.wire_log,
        )  # fmt: skip

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise self._fail(f"nginx exited with status {self._proc.returncode}")
            try:
                # Any answer (404 included) means the server is up.
                with _opener.open(f"{self.url}/", timeout=2):
                    return
            except urllib.error.HTTPError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise self._fail(
                        f"nginx did not answer within {self.startup_timeout:g} s"
                    ) from None
                time.sleep(0.05)

    def stop(self) -> None:
        super().stop()
        if self._prefix is not None:
            self._prefix.cleanup()
            self._prefix = None

"""A certificate authority of a test's own and a server certificate it signs, made with
the ``openssl`` command: what a lab's S3 or a TLS-inspecting proxy presents, a CA the
machine does not trust until told to (``SSL_CERT_FILE``, a ``ca_bundle`` option)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.servers import HOST


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the CA's certificate (PEM): what a client is told to trust
    cert: Path  # the server's certificate, for 127.0.0.1, signed by the CA
    key: Path  # the server's private key


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_certificates(
    directory: Path, name: str = "refmount test CA", addresses: Sequence[str] = (HOST,)
) -> Certificates:
    """A new CA and a certificate for ``addresses`` (``127.0.0.1``; and ``localhost``)
    in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    files = Certificates(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    ca_key = directory / "ca.key"
    request = directory / "server.csr"
    extensions = directory / "server.ext"
    extensions.write_text(
        f"subjectAltName={','.join(f'IP:{a}' for a in addresses)},DNS:localhost\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
    )
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(files.ca),
             "-days", "3", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    _openssl("req", *ec, "-keyout", str(files.key), "-out", str(request), "-subj", f"/CN={HOST}")
    _openssl("x509", "-req", "-in", str(request), "-CA", str(files.ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-out", str(files.cert), "-days", "2",
             "-extfile", str(extensions))  # fmt: skip
    return files

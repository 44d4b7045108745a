"""Which certificate authorities a TLS connection trusts: the one place that decides it,
for every backend (refmount's HTTP client, obstore, fsspec).

A connection trusts what the machine trusts: the system store (OpenSSL's default CA
file and directory, ``/etc/ssl/certs`` on Debian), plus the PEM files named by
``SSL_CERT_FILE``, ``AWS_CA_BUNDLE`` and ``REQUESTS_CA_BUNDLE``, plus the one a scope's
remote option ``ca_bundle`` names (``{"s3": {"ca_bundle": "/etc/lab-ca.pem"}}``, or keyed
by host).  Nothing turns verification off.

The backends take trust in different shapes: an ``ssl.SSLContext`` (refmount's client,
fsspec's HTTP filesystem through aiohttp), PEM text (obstore's ``root_certificate``,
added to its compiled-in roots) or one CA file (botocore's ``verify``): all three are
built here from the same list of files.

A certificate that fails verification is a final error naming the host and OpenSSL's
(or rustls's) reason, never a transient one retried until the deadline:
:func:`certificate_failure` finds it in any backend's exception.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: The remote option naming a CA bundle (a PEM file) for a protocol or host.
OPTION = "ca_bundle"
#: Environment variables naming a CA bundle trusted beside the system store.
ENVIRONMENT = ("SSL_CERT_FILE", "AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE")
_PEM_CERT = re.compile(
    rb"-----BEGIN CERTIFICATE-----\r?\n.+?\r?\n-----END CERTIFICATE-----", re.DOTALL
)
#: rustls's words for a refused certificate, as obstore's errors spell them (its message,
#: or the debug text of its causes after it).
_RUSTLS = re.compile(r"(?:invalid peer certificate: |InvalidCertificate\(\s*)([A-Za-z]+)")
_RUSTLS_REASONS = {
    "UnknownIssuer": "unable to get local issuer certificate (unknown issuer)",
    "BadSignature": "certificate signature failure",
    "Expired": "certificate has expired",
    "NotValidYet": "certificate is not yet valid",
    "NotValidForName": "hostname mismatch",
    "Revoked": "certificate revoked",
}


class CertificateError(Exception):
    """A server's certificate failed verification; ``reason`` is why, as OpenSSL (or
    rustls) says it."""

    def __init__(self, host: str, reason: str) -> None:
        super().__init__(f"{host}: TLS: certificate verify failed: {reason}")
        self.host = host
        self.reason = reason


@dataclass(frozen=True)
class Trust:
    """The CA files trusted beside the system store, in the order given."""

    bundles: tuple[str, ...] = ()

    def context(self) -> ssl.SSLContext:
        """A client context verifying against the system store and ``bundles``."""
        return _context(self.bundles)

    def pem(self) -> str:
        """The system store's certificates and the bundles', as one PEM text."""
        return _pem(self.bundles)

    def ca_file(self) -> str:
        """One PEM file of everything trusted (for clients that take one path)."""
        return _ca_file(self.bundles)


def split_options(options: Mapping[str, Any]) -> tuple[Trust, dict[str, Any]]:
    """A scope's trust (environment, then its ``ca_bundle`` option), and its other
    options.  Raises ValueError for a ``ca_bundle`` that is not a readable file."""
    rest = dict(options)
    bundles = [os.environ[name] for name in ENVIRONMENT if os.environ.get(name)]
    named = rest.pop(OPTION, None)
    if named is not None:
        if not isinstance(named, str) or not Path(named).expanduser().is_file():
            raise ValueError(f"{OPTION} {named!r}: not a file")
        bundles.append(str(Path(named).expanduser()))
    return Trust(tuple(dict.fromkeys(bundles))), rest


def check_bundles(remote_options: Mapping[str, Mapping[str, Any]]) -> None:
    """ValueError naming the scope, the option and the path of the first ``ca_bundle``
    that is no file of PEM certificates OpenSSL loads: found when a mount or a check
    starts, not at the first read of a host."""
    for scope, options in remote_options.items():
        named = options.get(OPTION) if isinstance(options, Mapping) else None
        if named is None:
            continue
        where = OPTION if scope == "*" else f"{scope}: {OPTION}"
        if not isinstance(named, str):
            raise ValueError(f"{where} {named!r}: not a path")
        path = Path(named).expanduser()
        if not path.is_file():
            problem = "no such file" if not path.exists() else "not a file"
            raise ValueError(f"{where} {named!r}: {problem}")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ValueError(f"{where} {named!r}: {exc.strerror}") from None
        if not _PEM_CERT.search(data):
            raise ValueError(f"{where} {named!r}: no PEM certificate in it")
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=str(path))
        except ssl.SSLError as exc:
            raise ValueError(f"{where} {named!r}: not a CA bundle OpenSSL reads: {exc}") from None


def _system_files() -> tuple[list[str], str | None]:
    """The system store as OpenSSL knows it, whatever ``SSL_CERT_FILE`` says (that
    variable replaces OpenSSL's default file; here it is trusted beside it)."""
    paths = ssl.get_default_verify_paths()
    files = [paths.openssl_cafile] if os.path.isfile(paths.openssl_cafile) else []
    directory = paths.openssl_capath if os.path.isdir(paths.openssl_capath) else None
    return files, directory


@lru_cache(maxsize=32)
def _context(bundles: tuple[str, ...]) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, checks the host name
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    files, directory = _system_files()
    for name in files:
        context.load_verify_locations(cafile=name)
    if directory is not None:
        context.load_verify_locations(capath=directory)
    for name in bundles:
        try:
            context.load_verify_locations(cafile=name)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"CA bundle {name}: {exc}") from exc
    return context


@lru_cache(maxsize=32)
def _pem(bundles: tuple[str, ...]) -> str:
    """Only the certificates of each file (obstore refuses anything else in PEM)."""
    files, _ = _system_files()
    found: dict[bytes, None] = {}
    for name in [*files, *bundles]:
        try:
            data = Path(name).read_bytes()
        except OSError as exc:
            raise ValueError(f"CA bundle {name}: {exc}") from exc
        certificates = _PEM_CERT.findall(data)
        if not certificates and name in bundles:
            raise ValueError(f"CA bundle {name}: no PEM certificate in it")
        found.update(dict.fromkeys(certificates))
    return "\n".join(cert.decode("ascii") for cert in found) + "\n"


@lru_cache(maxsize=32)
def _ca_file(bundles: tuple[str, ...]) -> str:
    """A file holding :func:`_pem`, named by its content (written once per process
    and content; the same bytes under the same name when rewritten)."""
    text = _pem(bundles)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"refmount-ca-{os.getuid()}-{digest}.pem"
    if not path.is_file() or path.read_text() != text:
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".refmount-ca-")
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(temporary, path)
    return str(path)


def certificate_failure(exc: BaseException, host: str) -> CertificateError | None:
    """The certificate failure behind ``exc`` (raised by any backend: OpenSSL's
    ``SSLCertVerificationError`` anywhere in its causes, or rustls's words in obstore's
    message), or None when it is no such failure."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, CertificateError):
            return current
        verify = getattr(current, "certificate_error", current)  # aiohttp wraps it there
        if isinstance(verify, ssl.SSLCertVerificationError):
            return CertificateError(host, openssl_reason(verify))
        text = str(current)
        if (match := _RUSTLS.search(text)) is not None:
            return CertificateError(host, _RUSTLS_REASONS.get(match.group(1), match.group(1)))
        if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
            reason = text.partition("certificate verify failed: ")[2] or text
            return CertificateError(host, reason.split(" (_ssl.c")[0].strip()[:200])
        current = current.__cause__ or current.__context__
    return None


def openssl_reason(exc: ssl.SSLCertVerificationError) -> str:
    """OpenSSL's words for why a certificate failed (``self-signed certificate``)."""
    return getattr(exc, "verify_message", None) or str(getattr(exc, "reason", None) or exc)


#: fsspec's protocols whose filesystems take the trust (an SSL context or a CA file).
TRUSTING_FSSPEC = frozenset({"http", "https", "s3", "s3a"})


def fsspec_options(protocol: str, options: Mapping[str, Any], trust: Trust) -> dict[str, Any]:
    """fsspec storage options that verify against ``trust``: an SSL context for the
    HTTP filesystem (aiohttp takes it per request), one CA file for s3fs (botocore's
    ``verify``; and ``region`` as s3fs spells it, ``client_kwargs.region_name``).  A
    ``verify`` or ``ssl`` the user gave stays as given (such options
    keep the protocol on fsspec); one that turns verification off says so in the log,
    once per mount and scope."""
    options = dict(options)
    if protocol in ("http", "https"):
        options.setdefault("ssl", trust.context())
        given = options["ssl"]
    elif protocol in ("s3", "s3a"):
        client_kwargs = dict(options.get("client_kwargs") or {})
        client_kwargs.setdefault("verify", trust.ca_file())
        if "region" in options:  # refmount's spelling (obstore's); s3fs has none
            client_kwargs.setdefault("region_name", options.pop("region"))
        options["client_kwargs"] = client_kwargs
        given = client_kwargs["verify"]
    else:
        return options
    if given is False:
        log.warning(
            "%s: the remote options turn certificate verification OFF (%s: false): any "
            "server can answer for these hosts",
            protocol,
            "ssl" if protocol.startswith("http") else "client_kwargs.verify",
        )
    return options

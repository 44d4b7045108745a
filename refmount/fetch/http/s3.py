"""Where an ``s3://bucket/key`` range is asked, and with which signature, for refmount's
HTTP client.

The settings are the ones ``--remote-options`` gives for S3, as
:mod:`refmount.fetch.obstore_options` reads them (``key``/``secret``/``token``,
``endpoint_url``, ``region``, ``anon``, ``requester_pays``), then ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN`` and ``AWS_REGION`` from the
environment.  With an endpoint, requests are path-style (``endpoint/bucket/key``, as
MinIO, Ceph and moto want them); on AWS itself, virtual-hosted
(``https://bucket.s3.region.amazonaws.com/key``) for bucket names that are DNS labels.
Without a key, the credentials are botocore's chain's (a profile's
``credential_process``, SSO, web identity, container and instance credentials; see
:mod:`refmount.fetch.http.aws_credentials`), renewed before they expire.  What this
module cannot address stays with obstore: :func:`s3_client` says so with None.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from refmount.fetch.http.aws_credentials import CredentialChain
from refmount.fetch.http.sigv4 import Credentials, Signer, canonical_path
from refmount.fetch.obstore_options import StoreConfig

_DNS_BUCKET = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")


class SigningCredentials(Protocol):
    """Where a scope's signatures come from: fixed keys, or botocore's chain."""

    @property
    def source(self) -> str:
        """Where the credentials were found, as a user knows it (never the secret)."""
        ...

    async def signer(self) -> Signer | None:
        """A signer with valid credentials; None: none found, the request goes through
        the fallback (as it did before: obstore looks for its own)."""
        ...


@dataclass(frozen=True, eq=False)
class FixedCredentials:
    """Keys given in the options or the environment: signed with as they are."""

    fixed: Signer
    source: str

    async def signer(self) -> Signer:
        return self.fixed


@dataclass(frozen=True)
class S3Client:
    """One S3 scope as refmount's client asks it."""

    scheme: str  # "https" or "http": the endpoint's
    endpoint: tuple[str, int, str] | None  # host, port, path prefix; None: AWS
    region: str
    credentials: SigningCredentials | None  # None: anonymous
    requester_pays: bool = False

    def locate(self, url: str) -> tuple[str, int, str] | None:
        """(host, port, request path) of ``s3://bucket/key``, or None where this client
        leaves the URL to obstore."""
        parts = urlsplit(url)
        bucket, key = parts.netloc, parts.path.lstrip("/")
        if not bucket or not key or parts.query or parts.fragment or "@" in bucket:
            return None
        port = 443 if self.scheme == "https" else 80
        if self.endpoint is not None:
            host, port, prefix = self.endpoint
            return host, port, f"{prefix}/{canonical_path(bucket)}/{canonical_path(key)}"
        if _DNS_BUCKET.fullmatch(bucket) is None:
            return None
        return f"{bucket}.s3.{self.region}.amazonaws.com", port, "/" + canonical_path(key)

    def extra_headers(self) -> list[tuple[str, str]]:
        return [("x-amz-request-payer", "requester")] if self.requester_pays else []


def s3_client(config: StoreConfig, deadline: float = 30.0) -> S3Client | None:
    """The client settings of an obstore S3 configuration, or None where refmount's
    client cannot address its requests.  ``deadline``: seconds a credential lookup or
    renewal may take."""
    settings = config.config
    endpoint_url = settings.get("endpoint")
    region = settings.get("region") or os.environ.get("AWS_REGION")
    region = region or os.environ.get("AWS_DEFAULT_REGION")
    signing: SigningCredentials | None = None
    if not settings.get("skip_signature"):
        signing = _fixed(settings, config.aws_profile, region or "us-east-1")
        if signing is None:
            signing = CredentialChain(region or "us-east-1", config.aws_profile, deadline)
    if endpoint_url is None:
        if not region:
            return None
        return S3Client("https", None, region, signing, bool(settings.get("request_payer")))
    parts = urlsplit(str(endpoint_url))
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    endpoint = (parts.hostname, port, parts.path.rstrip("/"))
    return S3Client(
        parts.scheme, endpoint, region or "us-east-1", signing, bool(settings.get("request_payer"))
    )


def _fixed(
    settings: dict[str, object], profile: str | None, region: str
) -> FixedCredentials | None:
    """The keys given in the options, else (no profile named) in the environment;
    None: neither has one."""
    if settings.get("access_key_id") is not None or profile:
        key, secret = settings.get("access_key_id"), settings.get("secret_access_key")
        token = settings.get("session_token")
        source = "the options (key, secret)"
    else:
        key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
        token = os.environ.get("AWS_SESSION_TOKEN")
        source = "the environment (AWS_ACCESS_KEY_ID)"
    if not key or not secret:
        return None
    credentials = Credentials(str(key), str(secret), str(token) if token else None)
    return FixedCredentials(Signer(credentials, region), source)

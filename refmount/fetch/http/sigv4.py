"""AWS Signature Version 4 for refmount's ranged GETs to S3 and stores that speak it.

A GET has no body, so its payload hash is the empty string's, sent as
``x-amz-content-sha256``.  Every header of the request is signed except
``User-Agent`` (botocore leaves that one out too, so a request signs the same either
way; the tests compare with botocore's signature).  The signing key, an HMAC chain over
the secret, the date, the region and the service, changes once a day: it is kept per
day and region, so a request costs two SHA-256 hashes and one HMAC.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import quote

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
ALGORITHM = "AWS4-HMAC-SHA256"
_UNSIGNED = frozenset({"user-agent"})
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str
    token: str | None = None


def canonical_path(key: str) -> str:
    """An object key as S3 wants it in the request path and the canonical request:
    every byte but the unreserved ones and ``/`` percent-encoded (UTF-8), once."""
    return quote(key, safe="/-_.~")


@dataclass(eq=False)
class Signer:
    """Signs requests for one region and service with one set of credentials."""

    credentials: Credentials
    region: str
    service: str = "s3"
    _keys: dict[str, bytes] = field(default_factory=dict, repr=False)

    def headers(
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        now: float | None = None,
        query: str = "",
    ) -> list[tuple[str, str]]:
        """The headers to add to a request (``x-amz-date``, ``x-amz-content-sha256``,
        ``x-amz-security-token`` with a session token, ``Authorization``) whose other
        headers are ``headers`` and whose path (already encoded) and query are given."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        day = stamp[:8]
        added = [("x-amz-date", stamp), ("x-amz-content-sha256", EMPTY_SHA256)]
        if self.credentials.token:
            added.append(("x-amz-security-token", self.credentials.token))
        signed: dict[str, str] = {}
        for name, value in [*headers, *added]:
            lower = name.lower()
            if lower in _UNSIGNED:
                continue
            value = _SPACES.sub(" ", value.strip())
            signed[lower] = f"{signed[lower]},{value}" if lower in signed else value
        names = sorted(signed)
        canonical = "\n".join(
            [
                method,
                path,
                query,
                "".join(f"{name}:{signed[name]}\n" for name in names),
                ";".join(names),
                EMPTY_SHA256,
            ]
        )
        scope = f"{day}/{self.region}/{self.service}/aws4_request"
        to_sign = "\n".join(
            [ALGORITHM, stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
        )
        signature = hmac.new(self._key(day), to_sign.encode(), hashlib.sha256).hexdigest()
        authorization = (
            f"{ALGORITHM} Credential={self.credentials.access_key}/{scope}, "
            f"SignedHeaders={';'.join(names)}, Signature={signature}"
        )
        return [*added, ("Authorization", authorization)]

    def _key(self, day: str) -> bytes:
        key = self._keys.get(day)
        if key is None:
            key = ("AWS4" + self.credentials.secret_key).encode()
            for part in (day, self.region, self.service, "aws4_request"):
                key = hmac.new(key, part.encode(), hashlib.sha256).digest()
            self._keys.clear()  # one day's key at a time
            self._keys[day] = key
        return key

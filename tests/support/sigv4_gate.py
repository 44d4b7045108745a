"""An S3 endpoint on 127.0.0.1 that checks SigV4 and refuses expired keys, in front of moto.

moto's keys never expire.  The gate issues temporary credentials of its own
(``/_credentials/process?ttl=N`` in ``credential_process``'s JSON,
``/_credentials/container?ttl=N`` as a container credentials endpoint answers,
``AWS_CONTAINER_CREDENTIALS_FULL_URI``; STS's ``AssumeRoleWithWebIdentity`` as a POST
to ``/``, ``AWS_ENDPOINT_URL_STS``; an instance role's as IMDSv2 gives them,
``AWS_EC2_METADATA_SERVICE_ENDPOINT``), and passes a GET on to moto (signed again with
moto's own key) only when its signature is right (recomputed with botocore's own
signer), its key is one it issued, its ``x-amz-security-token`` that key's, and the key
has not expired: otherwise it answers as S3 does (400 ``ExpiredToken``, 403
``InvalidAccessKeyId`` or ``SignatureDoesNotMatch``) and counts the refusal.  It also
counts who asked (the ``User-Agent`` of each passed GET) and which keys signed.
"""

from __future__ import annotations

import http.client
import json
import re
import secrets
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.servers import HOST, S3_KEY, S3_REGION

_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<scope>[^,]+), "
    r"SignedHeaders=(?P<signed>[^,]+), Signature=(?P<signature>[0-9a-f]{64})"
)
_IMDS_ROLES = "/latest/meta-data/iam/security-credentials/"
_STS_ANSWER = """<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
<AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>{key}</AccessKeyId>
<SecretAccessKey>{secret}</SecretAccessKey><SessionToken>{token}</SessionToken>
<Expiration>{expires}</Expiration></Credentials>
<AssumedRoleUser><Arn>arn:aws:sts::123456789012:assumed-role/reader/refmount</Arn>
<AssumedRoleId>AROAREADER:refmount</AssumedRoleId></AssumedRoleUser>
</AssumeRoleWithWebIdentityResult><ResponseMetadata><RequestId>1</RequestId>
</ResponseMetadata></AssumeRoleWithWebIdentityResponse>"""
_PASSED_HEADERS = ("Content-Type", "Content-Range", "ETag", "Last-Modified", "Accept-Ranges")


class SigV4Gate:
    """The gate, serving in threads of this process until :meth:`close`."""

    def __init__(self, upstream: str, region: str = S3_REGION) -> None:
        self.upstream = urlsplit(upstream)
        self.region = region
        self.keys: dict[str, tuple[str, str, float]] = {}  # key -> secret, token, expiry
        self.refused: Counter[str] = Counter()
        self.agents: Counter[str] = Counter()
        self.signed_by: Counter[str] = Counter()
        self.issued = 0
        #: the token STS's AssumeRoleWithWebIdentity takes
        self.web_identity = secrets.token_urlsafe(40)
        self.imds_token = secrets.token_urlsafe(20)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((HOST, 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> SigV4Gate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def issue(self, ttl: float) -> tuple[str, str, str, float]:
        key = "ASIA" + secrets.token_hex(8).upper()
        secret, token = secrets.token_urlsafe(30), secrets.token_urlsafe(60)
        expires = float(int(time.time() + ttl))
        with self._lock:
            self.keys[key] = (secret, token, expires)
            self.issued += 1
        return key, secret, token, expires

    def refusal(self, method: str, path: str, headers: Any) -> tuple[int, str] | None:
        """(status, S3 error code) for a request the gate refuses, None to pass it on."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        match = _AUTHORIZATION.fullmatch(headers.get("Authorization", ""))
        if match is None:
            return 403, "AccessDenied"
        with self._lock:
            known = self.keys.get(match["key"])
        if known is None:
            return 403, "InvalidAccessKeyId"
        secret, token, expires = known
        if headers.get("x-amz-security-token") != token:
            return 403, "InvalidToken"
        if time.time() >= expires:
            return 400, "ExpiredToken"
        signed = match["signed"].split(";")
        request = AWSRequest(
            method=method,
            url=f"http://{headers.get('Host')}{path}",
            headers={name: headers.get(name, "") for name in signed},
        )
        request.context["timestamp"] = headers.get("x-amz-date", "")
        auth = S3SigV4Auth(Credentials(match["key"], secret, token), "s3", self.region)
        canonical = auth.canonical_request(request)
        expected = auth.signature(auth.string_to_sign(request, canonical), request)
        if expected != match["signature"] or "host" not in signed:
            return 403, "SignatureDoesNotMatch"
        return None


def _handler(gate: SigV4Gate) -> type[BaseHTTPRequestHandler]:
    local = threading.local()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            if "Content-Length" not in headers:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _credentials(self, kind: str, ttl: float) -> None:
            key, secret, token, expires = gate.issue(ttl)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))
            if kind == "process":
                answer = {"Version": 1, "AccessKeyId": key, "SecretAccessKey": secret,
                          "SessionToken": token, "Expiration": stamp}  # fmt: skip
            else:
                answer = {"AccessKeyId": key, "SecretAccessKey": secret,
                          "Token": token, "Expiration": stamp}  # fmt: skip
            self._answer(200, json.dumps(answer).encode(), {"Content-Type": "application/json"})

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            if parts.path.startswith("/_credentials/"):
                ttl = float(parse_qs(parts.query).get("ttl", ["3600"])[0])
                self._credentials(parts.path.rsplit("/", 1)[1], ttl)
                return
            if parts.path.startswith(_IMDS_ROLES):
                self._instance_metadata(parts.path.removeprefix(_IMDS_ROLES))
                return
            self._s3()

        def do_PUT(self) -> None:
            """IMDSv2's session token (``AWS_EC2_METADATA_SERVICE_ENDPOINT``)."""
            if self.path != "/latest/api/token":
                self._answer(404, b"", {})
                return
            self._answer(200, gate.imds_token.encode(), {"Content-Type": "text/plain"})

        def _instance_metadata(self, role: str) -> None:
            """An instance role's credentials, to a request with IMDSv2's token."""
            if self.headers.get("X-aws-ec2-metadata-token") != gate.imds_token:
                self._answer(401, b"", {})
                return
            if not role:
                self._answer(200, b"reader", {"Content-Type": "text/plain"})
                return
            key, secret, token, expires = gate.issue(3600)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))
            answer = {"Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": key,
                      "SecretAccessKey": secret, "Token": token, "Expiration": stamp}  # fmt: skip
            self._answer(200, json.dumps(answer).encode(), {"Content-Type": "text/plain"})

        def do_HEAD(self) -> None:
            self._s3()

        def do_POST(self) -> None:
            """STS's AssumeRoleWithWebIdentity (``AWS_ENDPOINT_URL_STS``): credentials
            for the web identity token :attr:`SigV4Gate.web_identity` expects."""
            length = int(self.headers.get("Content-Length", "0"))
            form = parse_qs(self.rfile.read(length).decode())
            if form.get("Action") != ["AssumeRoleWithWebIdentity"] or form.get(
                "WebIdentityToken"
            ) != [gate.web_identity]:
                with gate._lock:
                    gate.refused["AssumeRoleWithWebIdentity"] += 1
                self._answer(403, b"<ErrorResponse/>", {"Content-Type": "text/xml"})
                return
            key, secret, token, expires = gate.issue(3600)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))
            body = _STS_ANSWER.format(key=key, secret=secret, token=token, expires=stamp)
            self._answer(200, body.encode(), {"Content-Type": "text/xml"})

        def _s3(self) -> None:
            refused = gate.refusal(self.command, self.path, self.headers)
            if refused is not None:
                status, code = refused
                with gate._lock:
                    gate.refused[code] += 1
                body = f"<Error><Code>{code}</Code></Error>".encode()
                self._answer(status, body, {"Content-Type": "application/xml"})
                return
            match = _AUTHORIZATION.fullmatch(self.headers["Authorization"])
            assert match is not None
            with gate._lock:
                gate.agents[self.headers.get("User-Agent", "")] += 1
                gate.signed_by[match["key"]] += 1
            status, body, headers = _upstream(self.command, self.path, self.headers)
            self._answer(status, body, headers)

    def _upstream(method: str, path: str, headers: Any) -> tuple[int, bytes, dict[str, str]]:
        connection = getattr(local, "connection", None)
        if connection is None:
            connection = local.connection = http.client.HTTPConnection(
                gate.upstream.hostname, gate.upstream.port, timeout=30
            )
        asked = _signed_for_moto(method, f"{gate.upstream.netloc}", path, headers.get("Range"))
        try:
            connection.request(method, path, headers=asked)
            response = connection.getresponse()
        except (OSError, http.client.HTTPException):
            connection.close()
            connection.request(method, path, headers=asked)
            response = connection.getresponse()
        body = response.read()
        given = response.headers
        passed = {name: given[name] for name in _PASSED_HEADERS if name in given}
        if method == "HEAD":
            passed["Content-Length"] = response.headers.get("Content-Length", "0")
        return response.status, body, passed

    return Handler


def _signed_for_moto(method: str, host: str, path: str, range_: str | None) -> dict[str, str]:
    """Headers of a request to moto, signed with moto's own key (moto answers an
    unsigned GET with 403)."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest(method=method, url=f"http://{host}{path}", headers={})
    if range_ is not None:
        request.headers["Range"] = range_
    S3SigV4Auth(Credentials(S3_KEY, S3_KEY), "s3", S3_REGION).add_auth(request)
    return dict(request.headers.items())

"""Ranged reads that hold no more of an answer than was asked, for the fsspec stores
whose libraries let a body be streamed: HTTP (aiohttp) and S3 (s3fs/aiobotocore).

fsspec's own ``_cat_file`` reads whole bodies: a server that ignores ``Range`` and sends
a 10 GiB object, an endless body, or a gzip bomb decoded on the fly would all be held in
memory before any length check.  Here each body is read in pieces and the read stops
after ``end - start + 1`` bytes, compressed transfer encodings are neither asked for nor
decoded, and an answer that is not the asked range (a 200 to a range that does not start
at 0, a ``Content-Range`` other than the asked one) raises :class:`WrongAnswer`.

A read given a :class:`~refmount.refs.model.Checksum` asks for that version only and
checks the answer's ETag or Last-Modified (:mod:`refmount.fetch.checksums`).  HTTP
redirects are not followed here (nor by aiohttp): the fetcher follows them, as
:mod:`refmount.fetch.redirects` says.

These coroutines run on fsspec's asyncio loop.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

from refmount.fetch import checksums, redirects
from refmount.fetch.backend import MAX_FILE_SIZE, WrongAnswer
from refmount.fetch.digits import ascii_decimal
from refmount.refs.model import Checksum

PIECE = 1 << 20  # bytes asked of a body stream at a time
# A HEAD refused with these (presigned GET URLs, servers without HEAD) is asked again as a
# one-byte GET; any other error status is the answer.
_HEAD_REFUSED = frozenset({403, 405, 501})
_CONTENT_RANGE = re.compile(
    r"[ \t]*bytes[ \t]+([0-9]{1,19})-([0-9]{1,19})/([0-9]{1,19}|\*)[ \t]*", re.IGNORECASE | re.ASCII
)


class HTTPStatusError(Exception):
    """A store answered with an HTTP error status; ``status`` is what classify reads."""

    def __init__(self, status: int, url: str) -> None:
        super().__init__(f"HTTP {status} for {url}")
        self.status = status


def check_content_range(header: str | None, start: int, end: int) -> int:
    """The number of bytes a 206 answer with this ``Content-Range`` carries, if it is the
    asked range ``[start, end)`` (or its part before the end of the file); else raise."""
    match = _CONTENT_RANGE.fullmatch(header or "")
    if match is None:
        raise WrongAnswer(f"a 206 answer with Content-Range {header!r}, not bytes {start}-")
    first, last, total = int(match[1]), int(match[2]), match[3]
    at_file_end = total != "*" and last + 1 == int(total)
    if first != start or last < first or last + 1 > end or (last + 1 < end and not at_file_end):
        raise WrongAnswer(f"asked for bytes {start}-{end - 1}, the store answered with {header!r}")
    return last + 1 - first


async def read_stream(read: Any, limit: int) -> bytes:
    """At most ``limit`` bytes from ``read(n)`` (an async read of up to n bytes, b"" at
    the end), in pieces: never more in memory than was asked for."""
    pieces = []
    left = limit
    while left > 0:
        piece = await read(min(PIECE, left))
        if not piece:
            break
        pieces.append(piece)
        left -= len(piece)
    return b"".join(pieces)


def too_long_checked(data: bytes, carried: int) -> bytes:
    """The body of a 206, read to one byte past what its Content-Range says: that byte
    is there only when the body is longer than its header (even where the range ends
    at the end of the file, so the fetcher would take a short answer)."""
    if len(data) > carried:
        raise WrongAnswer(f"a body longer than its Content-Range ({carried} bytes)")
    return data


# -- HTTP ------------------------------------------------------------------------------------


def _request_options(fs: Any, headers: dict[str, str]) -> dict[str, Any]:
    """The filesystem's request options (headers, auth, ssl ... as given in the storage
    options) with these headers on top, and transfer decoding off."""
    options = dict(fs.kwargs)
    merged = dict(options.pop("headers", None) or {})
    merged.update(headers)
    options.pop("auto_decompress", None)
    return {**options, "headers": merged, "auto_decompress": False}


def _identity(resp: Any, url: str) -> None:
    encoding = resp.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise WrongAnswer(f"{url}: a {encoding} body to a request for identity encoding")


def _raise_for_status(resp: Any, url: str) -> None:
    if resp.status >= 400:
        raise HTTPStatusError(resp.status, url)


@contextlib.asynccontextmanager
async def _answer(fs: Any, method: str, url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    """The answer to ``method url``; a redirect is :class:`Redirected`, for the fetcher
    to follow as :mod:`refmount.fetch.redirects` says (aiohttp would send the session's
    headers to any host it is sent to)."""
    session = await fs.set_session()
    options = {**_request_options(fs, headers), "allow_redirects": False}
    async with session.request(method, fs.encode_url(url), **options) as resp:
        if resp.status in redirects.STATUSES:
            raise redirects.Redirected(url, resp.status, resp.headers.get("Location"))
        yield resp


async def http_range(
    fs: Any, url: str, start: int, end: int, checksum: Checksum | None = None
) -> bytes:
    """Bytes ``[start, end)`` of ``url`` through an fsspec ``HTTPFileSystem``'s session."""
    headers = {"Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"}
    headers.update(checksums.http_conditions(checksum))
    async with _answer(fs, "GET", url, headers) as resp:
        if checksum is not None:
            if resp.status == 412:
                raise checksums.ChangedObject(url, "HTTP 412: precondition failed")
            if resp.status < 300:
                checksums.verify(
                    url,
                    checksum,
                    etag=resp.headers.get("ETag"),
                    modified=resp.headers.get("Last-Modified"),
                )
        _raise_for_status(resp, url)
        _identity(resp, url)
        if resp.status == 206:
            carried = check_content_range(resp.headers.get("Content-Range"), start, end)
            return too_long_checked(await read_stream(resp.content.read, carried + 1), carried)
        if resp.status == 200:
            if start != 0:
                raise WrongAnswer(
                    f"{url}: a 200 answer (the whole object) to a request for bytes "
                    f"{start}-{end - 1}: the store ignores Range"
                )
            # The whole object from byte 0: its first bytes are the range.
            return await read_stream(resp.content.read, end - start)
        raise WrongAnswer(f"{url}: HTTP {resp.status} to a ranged request")


async def http_size(fs: Any, url: str) -> int:
    """The size of ``url``: its HEAD's ``Content-Length``, else the total of the
    ``Content-Range`` of a one-byte GET (stores that refuse HEAD, such as presigned URLs)."""
    async with _answer(fs, "HEAD", url, {"Accept-Encoding": "identity"}) as resp:
        if resp.status >= 400 and resp.status not in _HEAD_REFUSED:
            raise HTTPStatusError(resp.status, url)
        if resp.status < 300 and resp.headers.get("Content-Encoding", "identity") == "identity":
            length = ascii_decimal(resp.headers.get("Content-Length", ""))
            if length is not None:
                return checked_size(length, url)
    async with _answer(
        fs, "GET", url, {"Accept-Encoding": "identity", "Range": "bytes=0-0"}
    ) as resp:
        _raise_for_status(resp, url)
        _identity(resp, url)
        match = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", ""))
        if resp.status == 206 and match is not None and match[3] != "*":
            return checked_size(int(match[3]), url)
        length = ascii_decimal(resp.headers.get("Content-Length", ""))
        if resp.status == 200 and length is not None:
            return checked_size(length, url)
    raise WrongAnswer(f"{url}: the store tells no size (no Content-Length or Content-Range)")


def checked_size(size: int, url: str) -> int:
    if not 0 <= size <= MAX_FILE_SIZE:
        raise WrongAnswer(f"{url}: the store reports a size of {size} bytes, which no file has")
    return size


# -- S3 --------------------------------------------------------------------------------------


async def s3_range(
    fs: Any, path: str, start: int, end: int, checksum: Checksum | None = None
) -> bytes:
    """Bytes ``[start, end)`` of an S3 object through s3fs, streaming ``get_object``'s
    body and checking its ``ContentRange``."""
    bucket, key, version = fs.split_path(path)
    extra: dict[str, Any] = {"VersionId": version} if version else {}
    if checksum is not None and checksum.etag is not None:
        extra["IfMatch"] = checksum.etag
    elif checksum is not None and checksum.last_modified is not None:
        extra["IfUnmodifiedSince"] = checksums.unmodified_since(checksum)
    try:
        resp = await fs._call_s3(
            "get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", **extra
        )
    except Exception as exc:
        if checksum is not None and _precondition_failed(exc):
            raise checksums.ChangedObject(f"s3://{path}", "HTTP 412: precondition failed") from None
        raise
    body = resp["Body"]
    try:
        checksums.verify(
            f"s3://{path}", checksum, etag=resp.get("ETag"), modified=resp.get("LastModified")
        )
        encoding = (resp.get("ContentEncoding") or "identity").strip().lower()
        if encoding not in ("identity", "aws-chunked"):
            raise WrongAnswer(f"s3://{path}: a {encoding} body to a ranged request")
        content_range = resp.get("ContentRange")
        if content_range is None:
            if start != 0:
                raise WrongAnswer(f"s3://{path}: the whole object to a request for bytes "
                                  f"{start}-{end - 1}")  # fmt: skip
            return await read_stream(body.read, end - start)
        carried = check_content_range(content_range, start, end)
        return too_long_checked(await read_stream(body.read, carried + 1), carried)
    finally:
        body.close()


def _precondition_failed(exc: BaseException) -> bool:
    """Whether botocore's error (as s3fs raised it, or its cause) is a 412."""
    for error in (exc, exc.__cause__, exc.__context__):
        response = getattr(error, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "PreconditionFailed" or status == 412:
                return True
    return False

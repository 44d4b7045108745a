"""Whether an object is still the version a reference's :class:`Checksum` names.

Icechunk records, for each virtual chunk, the ETag or the last-modified time (whole
seconds) of the object the chunk lies in, and refuses the chunk once the object has
changed: bytes of another version at the same offsets are another dataset's bytes.
refmount refuses them the same way.  Each backend asks its store conditionally where
the transport can (HTTP ``If-Match`` / ``If-Unmodified-Since``, S3's and obstore's
equivalents) and then checks what the answer says the object is: a server that ignores
the condition and sends the new bytes anyway is refused all the same.  A local file is
checked by the ``fstat`` of the descriptor it is read through.

A refusal is :class:`ChangedObject` (EIO): never retried, never cached.
"""

from __future__ import annotations

import datetime
import email.utils
import os

from refmount import header_text
from refmount.errors import FetchError
from refmount.redaction import redact_url
from refmount.refs.model import Checksum


class ChangedObject(FetchError):
    """The object a checksummed reference points into is not the version it names."""

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(f"{redact_url(url)}: changed since it was referenced ({detail})")


def _opaque(tag: str) -> str:
    """An ETag without its weak marker and quotes: stores and writers differ in both."""
    tag = tag.strip()
    return tag.removeprefix("W/").strip('"')


def seconds(modified: object) -> int | None:
    """A modification time as whole seconds since the epoch: from a datetime, an HTTP
    date, or a number; None when it is none of these."""
    if isinstance(modified, datetime.datetime):
        if modified.tzinfo is None:
            modified = modified.replace(tzinfo=datetime.UTC)
        return int(modified.timestamp())
    if isinstance(modified, int | float) and not isinstance(modified, bool):
        return int(modified)
    if isinstance(modified, str) and modified.strip():
        if not modified.isascii():  # int() would read other scripts' digits as a date
            return None
        try:
            return int(email.utils.parsedate_to_datetime(modified).timestamp())
        except (TypeError, ValueError, IndexError):
            return None
    return None


def mismatch(checksum: Checksum, *, etag: object, modified: object) -> str | None:
    """Why an object whose ETag and modification time are these is not the version
    ``checksum`` names; None when it is.  What cannot be compared (no ETag, no time)
    does not match."""
    if checksum.etag is not None:
        if not isinstance(etag, str) or not etag.strip():
            return (
                f"the store names no ETag to compare with {header_text.escaped(checksum.etag, 80)}"
            )
        if _opaque(etag) != _opaque(checksum.etag):
            shown = header_text.escaped(etag.strip(), 80)
            return f"ETag {shown}, referenced {header_text.escaped(checksum.etag, 80)}"
        return None
    if checksum.last_modified is not None:
        when = seconds(modified)
        if when is None:
            return "the store tells no modification time"
        if when > checksum.last_modified:
            return f"modified at {_iso(when)}, after {_iso(checksum.last_modified)}"
    return None


def verify(url: str, checksum: Checksum | None, *, etag: object, modified: object) -> None:
    """Raise :class:`ChangedObject` unless the answer is of the version named."""
    if checksum is None:
        return
    detail = mismatch(checksum, etag=etag, modified=modified)
    if detail is not None:
        raise ChangedObject(url, detail)


def local_etag(st: os.stat_result) -> str:
    """The ETag object_store (so Icechunk and obstore) gives a local file: inode,
    modification time in microseconds and size, in hexadecimal."""
    return f'"{st.st_ino:x}-{st.st_mtime_ns // 1000:x}-{st.st_size:x}"'


def verify_stat(url: str, checksum: Checksum | None, st: os.stat_result) -> None:
    """:func:`verify` for a local file, from its ``fstat``: its modification time is
    compared in whole seconds, as an HTTP date would be."""
    verify(url, checksum, etag=local_etag(st), modified=st.st_mtime_ns // 1_000_000_000)


def http_conditions(checksum: Checksum | None) -> dict[str, str]:
    """The request headers that ask a server for the named version only."""
    if checksum is None:
        return {}
    if checksum.etag is not None:
        return {"If-Match": checksum.etag}
    if checksum.last_modified is not None:
        return {"If-Unmodified-Since": email.utils.formatdate(checksum.last_modified, usegmt=True)}
    return {}


def unmodified_since(checksum: Checksum) -> datetime.datetime | None:
    """The checksum's time as an aware datetime (S3's and obstore's conditions)."""
    if checksum.last_modified is None:
        return None
    return datetime.datetime.fromtimestamp(checksum.last_modified, datetime.UTC)


def _iso(when: int) -> str:
    return datetime.datetime.fromtimestamp(when, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

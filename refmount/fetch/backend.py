"""What a transport does for the :class:`~refmount.fetch.fetcher.Fetcher`.

A backend moves bytes and nothing else: it reads a range or asks a size, once, and raises
whatever its transport raises.  Deadlines, retries, concurrency limits, length checks and
the mapping of failures to errnos belong to the fetcher, so that every backend gets the
same ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from refmount.refs.model import Checksum

#: The largest size a file can report (``st_size`` is a signed 64-bit number).
MAX_FILE_SIZE = (1 << 63) - 1


class Version(NamedTuple):
    """What one HEAD or stat says of an object's current version: its validator (see
    :func:`version_of`; None when the store gives nothing that changes with the bytes),
    its size (None when not given), and its ETag and modification time as the store
    gives them (what a reference's checksum is compared with)."""

    validator: str | None
    size: int | None
    etag: str | None = None
    modified: object = None


class WrongAnswer(Exception):
    """The store answered, but not with what was asked: a 200 (the whole object) to a
    ranged request that does not start at byte 0, a ``Content-Range`` other than the
    asked range, a compressed body, a body longer or shorter than asked.  Such an
    answer is never data; the fetcher retries it like a transient failure."""


class Backend(Protocol):
    """One transport (local files, fsspec, obstore) for the URLs of some protocols.

    The fetcher makes one backend per *scope*, a protocol and host (``https://host:port``,
    ``s3://bucket``), so that options given for one host never reach another."""

    async def read(self, url: str, start: int, end: int, checksum: Checksum | None = None) -> bytes:
        """Bytes ``[start, end)`` of ``url``: fewer only where the file ends before ``end``.

        With a ``checksum``, only bytes of the object's version it names: anything else
        raises :class:`~refmount.fetch.checksums.ChangedObject`.

        Must never hold more than ``end - start + 1`` bytes of an answer: a store that
        sends more is stopped there (the fetcher sees one byte too many and fails the
        attempt), so a hostile or broken store cannot make a read cost more memory than
        it asked for.  An answer that is not the asked range raises :class:`WrongAnswer`."""
        ...

    async def size(self, url: str) -> int:
        """The size of the whole file at ``url``."""
        ...

    async def version(self, url: str) -> Version:
        """What names the current version of the file at ``url``: one HEAD or stat."""
        ...

    async def prepare(self) -> None:
        """Get ready for the first read (imports, sessions); failures are left for that
        read to report."""
        ...

    def close(self) -> None:
        """Release what the backend holds open."""
        ...


def version_of(
    *,
    etag: object = None,
    generation: object = None,
    size: object = None,
    modified: object = None,
) -> str | None:
    """A validator: a string that changes whenever the object's bytes may have changed.

    A generation or version id (GCS, versioned S3) or a strong ETag names one version of
    the bytes; a weak ETag (``W/``) or none leaves size and modification time, which must
    then both be known.  The size is in every validator, so that even a store whose
    ETag is not a content hash (nginx's is mtime and size) changes key when it shrinks."""
    shown_size = "" if size is None else f"|size:{size}"
    if generation not in (None, ""):
        return f"generation:{generation}{shown_size}"
    tag = None if etag in (None, "") else str(etag).strip()
    if tag and not tag.startswith("W/"):
        return f"etag:{tag}{shown_size}"
    if size is None or modified in (None, ""):
        return None
    weak = f"|etag:{tag}" if tag else ""
    return f"modified:{modified}{shown_size}{weak}"


def sized(size: object) -> int | None:
    """A size a store reported, if it is one."""
    return size if isinstance(size, int) and 0 <= size <= MAX_FILE_SIZE else None

"""What a reference set looks like to the rest of refmount, whatever its on-disk format.

A reference set is a mapping of keys (``temp/0.1``) to :class:`Ref` values.  Each format
(JSON, Parquet) implements :class:`RefSet`; the tree layer turns it into inodes.  File keys
are addressed by a dense integer *file id* that the format chooses (a row number, an
array's base plus a chunk index) so that inode numbers are stable and computable without
holding a per-key dictionary in memory.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

#: The block size ``stat`` reports for a file (``st_blksize``) unless its set knows better.
BLOCK_SIZE = 1 << 20


@dataclass(frozen=True, slots=True)
class Checksum:
    """What a remote object must still be for a reference's bytes to be served: Icechunk
    records one per virtual chunk, so that a source file changed since it was referenced
    is refused, not read.  ``etag``: the object's ETag must equal it; ``last_modified``
    (seconds since the epoch): the object must not have been modified after it."""

    etag: str | None = None
    last_modified: int | None = None


@dataclass(frozen=True, slots=True)
class Ref:
    """Where one key's bytes come from.

    Exactly one of ``data`` (inline bytes) and ``url`` is set.  For a URL, ``length`` is
    ``None`` when the reference is the whole remote file (``[url]``): its size must be
    asked of the remote once.  ``checksum``, when set, is what the object at ``url`` must
    still be for its bytes to be served (see :class:`Checksum`).
    """

    data: bytes | None = None
    url: str | None = None
    offset: int = 0
    length: int | None = None
    checksum: Checksum | None = None

    @property
    def inline(self) -> bool:
        return self.data is not None


class Child(NamedTuple):
    """One directory entry: ``file_id`` is ``None`` for a subdirectory.  A tuple: a
    listing makes one per entry, millions for a large array.

    ``cursor`` is an opaque, strictly increasing position: passing it back to
    :meth:`RefSet.children` resumes the listing just after this entry.
    """

    name: str
    file_id: int | None
    cursor: int


class RefSet(ABC):
    """A parsed, validated reference set.  Paths are keys without a leading slash;
    the root directory is ``""``."""

    #: modification time of the reference set, seconds since the epoch
    mtime: float

    @abstractmethod
    def file_id(self, key: str) -> int | None:
        """The id of the file at ``key``, or ``None`` when there is no such file."""

    @abstractmethod
    def key(self, file_id: int) -> str:
        """The key of a file id this set handed out."""

    @abstractmethod
    def ref(self, file_id: int) -> Ref:
        """Where the bytes of a file id come from."""

    @abstractmethod
    def is_dir(self, path: str) -> bool:
        """Whether ``path`` is a directory (``""`` always is)."""

    @abstractmethod
    def children(self, path: str, after: int = -1) -> Iterator[Child]:
        """The entries of directory ``path`` in a stable order, starting after cursor
        ``after`` (``-1``: from the beginning)."""

    def subdirectory_count(self, path: str) -> int:
        """How many subdirectories directory ``path`` has (its ``nlink`` is this plus 2).

        Answered without :meth:`ensure` (a ``stat`` of a directory loads nothing): a set
        that loads lazily overrides this with a count that needs no loading."""
        return sum(1 for child in self.children(path) if child.file_id is None)

    def file_size(self, file_id: int) -> int | None:
        """The size of a file when the set alone knows it (``None`` for a whole remote
        file).  A shortcut for listings: no :class:`Ref` is built."""
        ref = self.ref(file_id)
        return len(ref.data) if ref.data is not None else ref.length

    def block_size(self, file_id: int) -> int:
        """The block size ``stat`` reports for a file (``st_blksize``): readers size
        their reads by it (netCDF-C reads its first block whole, ``cp`` reads at least
        this).  1 MiB, large reads of large files; a view whose readers start with a
        small part of a file says so (the netCDF view: a file's header)."""
        return BLOCK_SIZE

    async def ensure(self, path: str, after: int = -1) -> None:  # noqa: B027 - optional hook
        """Load, without blocking the event loop, what the synchronous methods need for
        ``path`` (a key, or a directory listed from cursor ``after``).  Sets held fully in
        memory need nothing."""

    async def find_file(self, key: str) -> int | None:
        """:meth:`file_id`, after loading what it needs (see :meth:`ensure`)."""
        await self.ensure(key)
        return self.file_id(key)

    async def file_ref(self, file_id: int) -> Ref:
        """:meth:`ref`, after loading what it needs (see :meth:`ensure`)."""
        await self.ensure(self.key(file_id))
        return self.ref(file_id)

    def url_extent(self, url: str) -> int | None:
        """The end of the furthest byte any key references in ``url``, when known.

        Read-ahead never fetches past it; ``None`` means unknown (read-ahead then stops at
        the end of the remote file)."""
        return None

    def protocols(self) -> set[str]:
        """The protocols of the URLs the set points at, as far as it knows them without
        loading anything more: the daemon makes their filesystems before the first read."""
        return set()

    def target_urls(self) -> Sequence[str] | None:
        """Every URL the set points at, when known without loading anything more; None
        when not (a Parquet set reads its records on demand)."""
        return None

    def memory_bytes(self) -> int | None:
        """Roughly the bytes the set's index holds in memory, when it can tell (a
        catalog bounds its loaded sets by this); None when not."""
        return None

    def source_version(self) -> dict[str, Any] | None:
        """Which version of a versioned source the set serves (an Icechunk repository's
        snapshot), for ``refmount status``; None for a set without versions."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook, most sets hold nothing to release
        """Release what the set holds open."""

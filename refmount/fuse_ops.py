"""The pyfuse3 Operations: translate FUSE requests to the tree and the cache, nothing more.

Every operation runs behind one error boundary (:func:`_answered`): pyfuse3 catches only
``FUSEError``, and anything else escaping a handler ends its main loop and unmounts.  A
failed fetch becomes its errno (logged once per key and operation), and any other
exception becomes EIO with its traceback logged once.  A key of the reference set never
answers ENOENT, which means "no such key" to zarr: a missing target is EIO.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pyfuse3

from refmount.cache import BlockCache
from refmount.cache.chunkahead import ChunkReadAhead
from refmount.errors import FetchError
from refmount.fetch import FetchStats
from refmount.redaction import display_url
from refmount.refs.model import BLOCK_SIZE, Ref
from refmount.tree import ROOT_INODE, Node, StaleInode, Tree
from refmount.tuning import PYFUSE3_PATCHED

log = logging.getLogger(__name__)

#: The tree never changes while mounted (a reload invalidates explicitly): cache for long.
CACHE_SECONDS = 3600.0
XATTR_PREFIX = "user.refmount."
#: Distinct failures remembered for logging once; past this the memory starts afresh.
LOGGED_FAILURES = 10_000
#: Negative entries remembered so that a reload can invalidate them; past this, further
#: ones are cached by the kernel only briefly instead.
NEGATIVE_ENTRIES = 65_536
UNTRACKED_NEGATIVE_SECONDS = 1.0


@dataclass(slots=True)
class OpenFile:
    key: str
    ref: Ref
    size: int
    inode: int


class OnceLog:
    """Remembers what was logged, so that a failure repeated on every READ is logged
    once; bounded, so that a million failing keys cannot grow it without end."""

    def __init__(self, limit: int = LOGGED_FAILURES) -> None:
        self._seen: set[tuple[str, ...]] = set()
        self._limit = limit

    def first(self, *what: str) -> bool:
        if what in self._seen:
            return False
        if len(self._seen) >= self._limit:
            self._seen.clear()
        self._seen.add(what)
        return True


def reader_errno(op: str, exc: FetchError) -> int:
    """The errno a reader sees for a failed fetch.  The target of an existing key that
    is missing or forbidden is EIO (EACCES only at open): ENOENT would tell zarr that the
    key does not exist, and it would read fill values instead of failing."""
    if exc.errno == errno.ENOENT or (exc.errno == errno.EACCES and op != "open"):
        return errno.EIO
    return exc.errno


Handler = Callable[..., Awaitable[Any]]


def _answered(op: str, handler: Handler) -> Handler:
    """``handler`` behind the error boundary: only FUSEError ever leaves it."""

    @functools.wraps(handler)
    async def answer(self: Operations, *args: Any) -> Any:
        try:
            return await handler(self, *args)
        except pyfuse3.FUSEError:
            raise
        except StaleInode:
            raise pyfuse3.FUSEError(errno.ESTALE) from None
        except FetchError as exc:
            subject = self._subject(op, args)
            # Once per distinct failure, naming the first key it met: a bad record file
            # or target fails every key that points into it, and each would log a line.
            if self._logged.first(str(exc)):
                log.warning("%s of %r failed: %s", op, subject, exc)
            raise pyfuse3.FUSEError(reader_errno(op, exc)) from None
        except Exception as exc:
            subject = self._subject(op, args)
            if self._logged.first(op, subject, type(exc).__name__):
                log.exception("%s of %r failed unexpectedly: answered EIO", op, subject)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return answer


class Operations(pyfuse3.Operations):
    """A read-only filesystem over a :class:`Tree`, reading through a :class:`BlockCache`.

    ``tree`` may be replaced while mounted (a reload): each request reads it once at its
    start and works on that tree to its end.  For the reload, it counts the file inodes
    the kernel holds (lookups and READDIRPLUS entries, less what it forgets) and
    remembers the names the kernel caches as missing."""

    #: With refmount's pyfuse3 patch, the kernel lists with plain READDIR unless the
    #: entries are being stat'ed (``find`` creates no kernel inode per entry).
    readdirplus_auto = True

    def __init__(
        self, tree: Tree, cache: BlockCache, fetch_stats: FetchStats, *, xattrs: bool = False
    ) -> None:
        super().__init__()
        self.xattrs = xattrs
        self.tree = tree
        self.cache = cache
        self.fetch_stats = fetch_stats
        self._open: dict[int, OpenFile] = {}
        self._handles = itertools.count(1)
        self._logged = OnceLog()
        self.known: dict[int, int] = {}  # file inode -> the kernel's lookup count
        self.negatives: set[tuple[int, str]] = set()  # (parent inode, name) cached missing
        self.retired: list[Tree] = []  # trees a reload replaced, while they may be read
        #: Read-ahead along arrays' chunk grids, told of every read of a file.
        self.ahead: ChunkReadAhead | None = None

    def _subject(self, op: str, args: tuple[Any, ...]) -> str:
        """What a failed request was about (a key or directory path), for its message."""
        try:
            if op in ("read", "release") and not PYFUSE3_PATCHED:
                handle = self._open.get(args[0])
                return handle.key if handle else f"handle {args[0]}"
            if not args or not isinstance(args[0], int):
                return "/"
            path = self.tree.path(args[0])
            if op == "lookup":
                name = os.fsdecode(args[1])
                return f"{path}/{name}" if path else name
            return path or "/"
        except Exception:  # the message must not fail in turn
            return f"inode {args[0]}" if args else "?"

    # -- attributes -----------------------------------------------------------------------

    def _template(self, tree: Tree, inode: int) -> pyfuse3.EntryAttributes:
        """Attributes the entries of one directory share (``inode``, or the entry's own);
        per-entry fields are filled in by the caller."""
        attr = pyfuse3.EntryAttributes()
        attr.st_blksize = BLOCK_SIZE
        attr.st_uid = tree.owner.uid
        attr.st_gid = tree.owner.gid
        mtime_ns = int(tree.mtime(inode) * 1e9)
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = mtime_ns
        attr.entry_timeout = attr.attr_timeout = CACHE_SECONDS
        return attr

    def _attributes(
        self, tree: Tree, node: Node, attr: pyfuse3.EntryAttributes | None = None
    ) -> pyfuse3.EntryAttributes:
        attr = attr or self._template(tree, node.inode)
        attr.st_ino = node.inode
        attr.st_mode = node.mode
        attr.st_nlink = node.nlink
        attr.st_size = node.size
        attr.st_blocks = (node.size + 511) // 512
        attr.st_blksize = node.block_size
        return attr

    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> Any:
        tree = self.tree
        text = os.fsdecode(name)
        inode = await tree.lookup(parent_inode, text)
        if inode is None:
            # A negative entry the kernel may cache: zarr readers probe many missing keys.
            attr = pyfuse3.EntryAttributes()
            attr.st_ino = 0
            attr.entry_timeout = CACHE_SECONDS
            if len(self.negatives) < NEGATIVE_ENTRIES:
                self.negatives.add((parent_inode, text))
            else:
                attr.entry_timeout = UNTRACKED_NEGATIVE_SECONDS
            return attr
        attr = self._attributes(tree, await tree.node(inode))
        if not tree.is_dir(inode):
            self.known[inode] = self.known.get(inode, 0) + 1
        return attr

    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        known = self.known
        for inode, count in inode_list:
            left = known.get(inode, 0) - count
            if left > 0:
                known[inode] = left
            else:
                known.pop(inode, None)

    async def getattr(self, inode: int, ctx: Any = None) -> Any:
        tree = self.tree
        if tree.is_dir(inode) and tree.dir_path(inode) is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attributes(tree, await tree.node(inode))

    # -- directories ----------------------------------------------------------------------

    async def opendir(self, inode: int, ctx: Any) -> int:
        tree = self.tree
        if not tree.is_dir(inode):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        if tree.dir_path(inode) is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return inode

    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        # Each entry's next_id is its cursor + 1, so a resumed listing continues after it.
        # The kernel copies the attributes at once, so one object serves every entry, and
        # a file entry sets only what differs between files: a listing may be millions
        # of entries, and each attribute set is a call.
        tree = self.tree
        attr = self._template(tree, fh)
        attr.st_mode = tree.file_mode
        attr.st_nlink = 1
        reply = pyfuse3.readdir_reply
        known = self.known
        # Only a READDIRPLUS entry takes a lookup count in the kernel, a plain READDIR
        # entry none.  Without ``plus`` (a stock pyfuse3 lists with READDIRPLUS only; an
        # older patch does not say) every entry counts: too many only widens a reload.
        counted = getattr(token, "plus", True)
        entries = await tree.listing(fh, after=start_id - 1)
        uncached = False  # attr holds timeouts of 0
        block_size = BLOCK_SIZE  # attr's, set anew only when an entry's differs
        for name, inode, size, cursor, entry_block_size in entries:
            encoded = name.encode("utf-8", "surrogateescape")
            if size is None and tree.is_dir(inode):
                # Directories are few: each gets attributes of its own (times included,
                # which differ between the sets of a catalog).
                own = self._attributes(tree, await tree.node(inode))
                if not reply(token, encoded, own, cursor + 1):
                    return
                continue
            if size is None and (size := tree.listed_size(inode)) is None:
                # A whole remote file whose size the store has not told yet: a listing
                # never waits on a remote, so list it with attributes the kernel may
                # not keep; stat or open asks again (and waits, or gets the error).
                size = 0
                attr.entry_timeout = attr.attr_timeout = 0
                uncached = True
            attr.st_ino = inode
            attr.st_size = size
            attr.st_blocks = (size + 511) // 512
            if entry_block_size != block_size:
                attr.st_blksize = block_size = entry_block_size
            if not reply(token, encoded, attr, cursor + 1):
                return
            if counted:
                known[inode] = known.get(inode, 0) + 1
            if uncached:
                attr.entry_timeout = attr.attr_timeout = CACHE_SECONDS
                uncached = False

    async def releasedir(self, fh: int) -> None:
        pass

    # -- files ----------------------------------------------------------------------------

    async def open(self, inode: int, flags: int, ctx: Any) -> Any:
        tree = self.tree
        if tree.is_dir(inode):
            raise pyfuse3.FUSEError(errno.EISDIR)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise pyfuse3.FUSEError(errno.EROFS)
        if PYFUSE3_PATCHED:
            # ENOSYS once and the kernel opens files without asking (keeping their page
            # cache), sends no RELEASE, and reads with file handle 0: the patched pyfuse3
            # hands ``read`` the inode instead.
            raise pyfuse3.FUSEError(errno.ENOSYS)
        fh = next(self._handles)
        self._open[fh] = await self._file(tree, inode)
        return pyfuse3.FileInfo(fh=fh, keep_cache=True)

    async def _file(self, tree: Tree, inode: int) -> OpenFile:
        ref = await tree.ref(inode)
        return OpenFile(tree.key(inode), ref, await tree.size(ref), inode)

    async def _unopened(self, inode: int) -> OpenFile:
        """The file an inode names, for a READ without OPEN: in the current tree, else in
        a tree a reload replaced a short while ago (a reader that opened a file before
        the reload keeps reading the bytes it opened; later, ESTALE)."""
        try:
            return await self._file(self.tree, inode)
        except StaleInode:
            for tree in reversed(self.retired):
                with contextlib.suppress(StaleInode):
                    return await self._file(tree, inode)
            raise

    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:
        # An open file holds its reference: a reload does not change what it reads.
        # Without OPEN (see ``open``), ``fh`` is the inode.
        handle = await self._unopened(fh) if PYFUSE3_PATCHED else self._open[fh]
        end = min(off + size, handle.size)
        if off >= end:
            return b""
        ref = handle.ref
        if ref.data is not None:
            return ref.data[off:end]
        assert ref.url is not None
        if self.ahead is not None:
            await self.ahead.observe(self.tree, handle.inode, handle.size, ref.url)
        return await self.cache.read_buffer(
            ref.url,
            ref.offset + off,
            ref.offset + end,
            (ref.offset, ref.offset + handle.size),
            ref.checksum,
        )

    async def release(self, fh: int) -> None:
        self._open.pop(fh, None)

    # -- extended attributes: where bytes come from, and the mount's counters -------------

    async def _xattrs(self, inode: int) -> dict[str, str]:
        tree = self.tree
        if inode == ROOT_INODE:
            counters = {**self.fetch_stats.as_dict(), **self.cache.stats()}
            return {"stats": json.dumps(counters, sort_keys=True)}
        if tree.is_dir(inode):
            return {}
        ref = await tree.ref(inode)
        if ref.data is not None:
            return {"source": "inline", "length": str(len(ref.data))}
        assert ref.url is not None
        source = "range" if ref.length is not None else "file"
        found = {"source": source, "url": display_url(ref.url)}
        found["offset"] = str(ref.offset)
        if ref.length is not None:
            found["length"] = str(ref.length)
        return found

    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        if not self.xattrs:
            # ENOSYS once and the kernel stops asking: `ls -l` probes two names per file,
            # each a round trip to this daemon, which would triple its cost.
            raise pyfuse3.FUSEError(errno.ENOSYS)
        text = os.fsdecode(name)
        if text.startswith(XATTR_PREFIX):
            value = (await self._xattrs(inode)).get(text[len(XATTR_PREFIX) :])
            if value is not None:
                return value.encode()
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        if not self.xattrs:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        return [(XATTR_PREFIX + name).encode() for name in await self._xattrs(inode)]

    # -- the rest ------------------------------------------------------------------------

    async def statfs(self, ctx: Any) -> Any:
        stats = pyfuse3.StatvfsData()
        stats.f_bsize = stats.f_frsize = 512
        stats.f_namemax = 255
        return stats


async def _refuse_write(self: Operations, *args: Any) -> Any:
    raise pyfuse3.FUSEError(errno.EROFS)


for _name in (
    "setattr", "write", "create", "mkdir", "mknod", "unlink", "rmdir", "rename", "symlink",
    "link", "setxattr", "removexattr",
):  # fmt: skip
    setattr(Operations, _name, _refuse_write)

for _name in (
    "lookup", "forget", "getattr", "opendir", "readdir", "releasedir", "open", "read",
    "release", "getxattr", "listxattr", "statfs",
):  # fmt: skip
    setattr(Operations, _name, _answered(_name, getattr(Operations, _name)))

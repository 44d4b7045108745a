"""The pyfuse3 Operations: translate FUSE requests to the tree and the cache, nothing more."""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import pyfuse3

from refmount.cache import BlockCache
from refmount.errors import FetchError
from refmount.fetch import FetchStats, redact
from refmount.refs.model import Ref
from refmount.tree import ROOT_INODE, Node, Tree
from refmount.tuning import PYFUSE3_PATCHED

log = logging.getLogger(__name__)

#: The tree never changes while mounted (a reload invalidates explicitly): cache for long.
CACHE_SECONDS = 3600.0
XATTR_PREFIX = "user.refmount."


@dataclass(slots=True)
class OpenFile:
    key: str
    ref: Ref
    size: int


class Operations(pyfuse3.Operations):
    """A read-only filesystem over a :class:`Tree`, reading through a :class:`BlockCache`."""

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
        self._failed: set[tuple[str, str]] = set()

    # -- attributes -----------------------------------------------------------------------

    def _template(self) -> pyfuse3.EntryAttributes:
        """Attributes every entry shares; per-entry fields are filled in by the caller."""
        attr = pyfuse3.EntryAttributes()
        attr.st_blksize = 1 << 20
        attr.st_uid = self.tree.owner.uid
        attr.st_gid = self.tree.owner.gid
        mtime_ns = int(self.tree.refset.mtime * 1e9)
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = mtime_ns
        attr.entry_timeout = attr.attr_timeout = CACHE_SECONDS
        return attr

    def _attributes(
        self, node: Node, attr: pyfuse3.EntryAttributes | None = None
    ) -> pyfuse3.EntryAttributes:
        attr = attr or self._template()
        attr.st_ino = node.inode
        attr.st_mode = node.mode
        attr.st_nlink = node.nlink
        attr.st_size = node.size
        attr.st_blocks = (node.size + 511) // 512
        return attr

    async def _node(self, inode: int) -> Node:
        try:
            return await self.tree.node(inode)
        except FetchError as exc:
            self._warn_once(self.tree.path(inode), "size", exc)
            raise pyfuse3.FUSEError(exc.errno) from None

    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> Any:
        try:
            inode = await self.tree.lookup(parent_inode, os.fsdecode(name))
        except FetchError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        if inode is None:
            # A negative entry the kernel may cache: zarr readers probe many missing keys.
            attr = pyfuse3.EntryAttributes()
            attr.st_ino = 0
            attr.entry_timeout = CACHE_SECONDS
            return attr
        return self._attributes(await self._node(inode))

    async def getattr(self, inode: int, ctx: Any = None) -> Any:
        if self.tree.is_dir(inode) and self.tree.dir_path(inode) is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attributes(await self._node(inode))

    # -- directories ----------------------------------------------------------------------

    async def opendir(self, inode: int, ctx: Any) -> int:
        if not self.tree.is_dir(inode):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        if self.tree.dir_path(inode) is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return inode

    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        # Each entry's next_id is its cursor + 1, so a resumed listing continues after it.
        # The kernel copies the attributes at once, so one object serves every entry, and
        # a file entry sets only what differs between files: a listing may be millions
        # of entries, and each attribute set is a call.
        attr = self._template()
        file_mode = self.tree.file_mode
        reply = pyfuse3.readdir_reply
        try:
            entries = await self.tree.listing(fh, after=start_id - 1)
        except FetchError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        as_file = False  # attr holds a file's mode and nlink
        uncached = False  # attr holds timeouts of 0
        for name, inode, size, cursor in entries:
            if size is None and self.tree.is_dir(inode):
                self._attributes(await self._node(inode), attr)
                as_file = False
            else:
                if not as_file:
                    attr.st_mode = file_mode
                    attr.st_nlink = 1
                    as_file = True
                if size is None and (size := self.tree.listed_size(inode)) is None:
                    # A whole remote file whose size the store has not told yet: a listing
                    # never waits on a remote, so list it with attributes the kernel may
                    # not keep; stat or open asks again (and waits, or gets the error).
                    size = 0
                    attr.entry_timeout = attr.attr_timeout = 0
                    uncached = True
                attr.st_ino = inode
                attr.st_size = size
                attr.st_blocks = (size + 511) // 512
            if not reply(token, name.encode("utf-8", "surrogateescape"), attr, cursor + 1):
                return
            if uncached:
                attr.entry_timeout = attr.attr_timeout = CACHE_SECONDS
                uncached = False

    async def releasedir(self, fh: int) -> None:
        pass

    # -- files ----------------------------------------------------------------------------

    async def open(self, inode: int, flags: int, ctx: Any) -> Any:
        if self.tree.is_dir(inode):
            raise pyfuse3.FUSEError(errno.EISDIR)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise pyfuse3.FUSEError(errno.EROFS)
        if PYFUSE3_PATCHED:
            # ENOSYS once and the kernel opens files without asking (keeping their page
            # cache), sends no RELEASE, and reads with file handle 0: the patched pyfuse3
            # hands ``read`` the inode instead.
            raise pyfuse3.FUSEError(errno.ENOSYS)
        fh = next(self._handles)
        self._open[fh] = await self._file(inode)
        return pyfuse3.FileInfo(fh=fh, keep_cache=True)

    async def _file(self, inode: int) -> OpenFile:
        try:
            ref = await self.tree.ref(inode)
            size = await self.tree.size(ref)
        except FetchError as exc:
            self._warn_once(self.tree.key(inode), "size", exc)
            raise pyfuse3.FUSEError(exc.errno) from None
        return OpenFile(self.tree.key(inode), ref, size)

    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:
        # Without OPEN (see ``open``), ``fh`` is the inode.
        handle = await self._file(fh) if PYFUSE3_PATCHED else self._open[fh]
        end = min(off + size, handle.size)
        if off >= end:
            return b""
        ref = handle.ref
        if ref.data is not None:
            return ref.data[off:end]
        assert ref.url is not None
        try:
            return await self.cache.read_buffer(
                ref.url, ref.offset + off, ref.offset + end, (ref.offset, ref.offset + handle.size)
            )
        except FetchError as exc:
            self._warn_once(handle.key, "read", exc)
            raise pyfuse3.FUSEError(exc.errno) from None

    async def release(self, fh: int) -> None:
        self._open.pop(fh, None)

    # -- extended attributes: where bytes come from, and the mount's counters -------------

    async def _xattrs(self, inode: int) -> dict[str, str]:
        if inode == ROOT_INODE:
            counters = {**self.fetch_stats.as_dict(), **self.cache.stats()}
            return {"stats": json.dumps(counters, sort_keys=True)}
        if self.tree.is_dir(inode):
            return {}
        ref = await self.tree.ref(inode)
        if ref.data is not None:
            return {"source": "inline", "length": str(len(ref.data))}
        assert ref.url is not None
        found = {"source": "range" if ref.length is not None else "file", "url": redact(ref.url)}
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

    def _warn_once(self, key: str, what: str, exc: FetchError) -> None:
        """Log a key's failure once, not once per READ (the fetcher logs each URL once)."""
        if (key, what) not in self._failed and len(self._failed) < 10_000:
            self._failed.add((key, what))
            log.warning("%s of %r failed: %s", what, key, exc)


async def _refuse_write(self: Operations, *args: Any) -> Any:
    raise pyfuse3.FUSEError(errno.EROFS)


for _name in (
    "setattr", "write", "create", "mkdir", "mknod", "unlink", "rmdir", "rename", "symlink",
    "link", "setxattr", "removexattr",
):  # fmt: skip
    setattr(Operations, _name, _refuse_write)

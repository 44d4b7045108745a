"""Read-ahead along an array's chunk grid, across files: the reads a view's readers make of
chunk keys, followed by :class:`refmount.cache.grid.GridWalks`, and the chunks it predicts
fetched in the background as read-ahead of the one memory budget.

The tree's keys name the grid (``v/3.0.0``, ``v/c/3/0/0``); the array's metadata
(``.zarray``, or ``zarr.json``), held inline by the set or the view, gives its chunk
counts.  A predicted key is resolved through the set like any lookup, and its reference
fetched whole by whatever serves the mount's reads (``prefetch``: the block cache, or
the decoded view, which decodes ahead in its workers), unless it lies in the object
being read: that object's sequential stream reads ahead within it.  Keys the set does not hold
(chunks never written) are skipped; failures are left to the reader, who meets them on
its own read.
"""

from __future__ import annotations

import json
import logging
import math
import weakref
from collections.abc import Mapping
from typing import Any, Protocol

import trio

from refmount.cache.grid import Ahead, ChunkKey, GridWalks, parse_chunk_key
from refmount.nursery import Owned
from refmount.refs.chunkgrid import GridError, chunk_counts
from refmount.refs.model import Ref, RefSet

log = logging.getLogger(__name__)

#: Metadata larger than this is not parsed to learn a grid.
MAX_METADATA = 1 << 20

Counts = tuple[int, ...]


class SetOwner(Protocol):
    """A tree: which reference set a file inode is of, and its key there."""

    def owning_set(self, inode: int) -> tuple[RefSet, str]: ...


class Prefetcher(Protocol):
    """What serves the mount's reads, able to fetch a reference ahead of its reader."""

    def prefetch(self, ref: Ref) -> bool:
        """Start fetching ``ref``'s bytes ahead (True if they are cached or on their way
        already); False when the read-ahead budget has no room."""
        ...


def _v2_counts(meta: Mapping[str, Any], chunk: ChunkKey) -> Counts | None:
    shape, chunks = meta.get("shape"), meta.get("chunks")
    if not isinstance(shape, list) or not isinstance(chunks, list) or len(shape) != len(chunks):
        return None
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        return None
    if not all(isinstance(n, int) and n > 0 for n in chunks):
        return None
    separator = meta.get("dimension_separator") or "."
    if len(shape) > 1 and separator != chunk.separator:
        return None
    return tuple(math.ceil(s / c) for s, c in zip(shape, chunks, strict=True))


def _v3_counts(meta: Mapping[str, Any], chunk: ChunkKey, in_c: bool) -> Counts | None:
    shape = meta.get("shape")
    if meta.get("node_type") != "array" or not isinstance(shape, list):
        return None
    encoding = meta.get("chunk_key_encoding") or {}
    name = encoding.get("name") if isinstance(encoding, Mapping) else None
    configuration = encoding.get("configuration") if isinstance(encoding, Mapping) else None
    configuration = configuration if isinstance(configuration, Mapping) else {}
    if name == "default":
        separator = configuration.get("separator", "/")
        if not in_c:
            return None
    elif name == "v2":
        separator = configuration.get("separator", ".")
        if in_c:
            return None
    else:
        return None
    if len(shape) > 1 and separator != chunk.separator:
        return None
    try:
        return chunk_counts(meta.get("chunk_grid"), shape)
    except (GridError, TypeError):
        return None


def _metadata_keys(chunk: ChunkKey) -> list[tuple[str, bool, bool]]:
    """Where the metadata of the array ``chunk`` is of may be: (key, is v3, the key has a
    v3 ``c`` component)."""
    prefix = chunk.prefix
    out = []
    if prefix.endswith("c.") or prefix.endswith("c/"):
        head = prefix[:-2]  # "" or "path/"
        if head == "" or head.endswith("/"):
            out.append((head + "zarr.json", True, True))
    if prefix == "" or prefix.endswith("/"):
        out.append((prefix + ".zarray", False, False))
        out.append((prefix + "zarr.json", True, False))
    return out


class ChunkReadAhead:
    """Follows the chunk reads of one mount and fetches ahead along walks of the grid.

    ``owner`` runs the background lookups (the block cache's nursery); ``reads``
    fetches (``prefetch``); ``ahead_budget`` is the bytes read-ahead may hold in all."""

    def __init__(self, owner: Owned, reads: Prefetcher, *, ahead_budget: int) -> None:
        self.owner = owner
        self.reads = reads
        self.walks = GridWalks(ahead_budget=ahead_budget)
        # The chunk counts per array prefix of each set read lately (a catalog's sets
        # come and go; a reload makes a new set).
        self._grids: weakref.WeakKeyDictionary[RefSet, dict[str, Counts | None]] = (
            weakref.WeakKeyDictionary()
        )
        self._failed = False

    async def observe(self, tree: SetOwner, inode: int, size: int, url: str) -> None:
        """A reader read (part of) file ``inode`` of ``tree``, ``size`` bytes of ``url``.
        Never fails the read: a fault here costs only the read-ahead."""
        try:
            refset, key = tree.owning_set(inode)
        except Exception:  # a file of a set a reload replaced: no read-ahead for it
            return
        try:
            await self._observe(refset, key, size, url)
        except Exception:
            if not self._failed:
                self._failed = True
                log.exception("grid read-ahead failed (logged once); reads go on")

    async def _observe(self, refset: RefSet, key: str, size: int, url: str) -> None:
        chunk = parse_chunk_key(key)
        if chunk is None:
            return
        counts = await self._grid(refset, chunk)
        if counts is None:
            return
        ahead = self.walks.observe(
            (id(refset), chunk.prefix), chunk.index, counts, size, trio.current_time()
        )
        if ahead is not None and not self.owner.spawn(self._fetch, refset, chunk, ahead, url):
            ahead.fell_short(0)

    async def _grid(self, refset: RefSet, chunk: ChunkKey) -> Counts | None:
        grids = self._grids.get(refset)
        if grids is None:
            grids = self._grids[refset] = {}
        if chunk.prefix in grids:
            return grids[chunk.prefix]
        counts = None
        for key, v3, in_c in _metadata_keys(chunk):
            meta = await self._metadata(refset, key)
            if meta is not None:
                counts = _v3_counts(meta, chunk, in_c) if v3 else _v2_counts(meta, chunk)
                break
        if len(grids) >= 4096:
            grids.clear()
        grids[chunk.prefix] = counts
        return counts

    async def _metadata(self, refset: RefSet, key: str) -> Mapping[str, Any] | None:
        """The JSON object at ``key`` when the set holds it inline, else None."""
        try:
            file_id = await refset.find_file(key)
            if file_id is None:
                return None
            ref = await refset.file_ref(file_id)
        except Exception:  # the reader meets any error of its own key itself
            log.debug("grid read-ahead: %s not read", key, exc_info=True)
            return None
        if ref.data is None or len(ref.data) > MAX_METADATA:
            return None
        try:
            meta = json.loads(ref.data)
        except ValueError:
            return None
        return meta if isinstance(meta, dict) else None

    async def _fetch(self, refset: RefSet, chunk: ChunkKey, ahead: Ahead, url: str) -> None:
        """Resolve the predicted chunks and start their fetches, in order, until the
        budget has no room.  Chunks in ``url``, the object the reader is in, are left to
        that object's sequential stream (which fetches back-to-back chunks as one)."""
        for n, index in enumerate(ahead.indices):
            key = chunk.key(index)
            try:
                file_id = await refset.find_file(key)
                if file_id is None:
                    continue  # never written: its reader reads the fill value
                ref = await refset.file_ref(file_id)
            except Exception:
                log.debug("grid read-ahead of %s stopped", key, exc_info=True)
                ahead.fell_short(n)
                return
            if ref.url is None or ref.length is None or ref.url == url:
                continue  # inline, a whole file whose size is not known yet, or url
            if not self.reads.prefetch(ref):
                ahead.fell_short(n)
                return

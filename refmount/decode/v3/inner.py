"""The inner chunks of sharded Zarr v3 arrays as files of the v2 tree
(:mod:`refmount.decode.v3.tree`, :mod:`refmount.decode.v3.shards`).

An inner chunk ``i.j`` is a file of its own in the v2 tree, whose reference is its
shard's: its file id is made here (from :data:`INNER_IDS_BASE`, below the tree's made
metadata files), one per inner chunk looked up or listed.  An array's listing is every
inner chunk of every shard the set has (inside the array's grid), in index order.
"""

from __future__ import annotations

import logging

from refmount.decode.v3.metadata import Array
from refmount.decode.v3.shards import ShardLayout
from refmount.refs.model import RefSet
from refmount.tree import GENERATION_SPAN

log = logging.getLogger(__name__)

#: How many inner chunks may have file ids, and where their ids start.
INNER_IDS = 1 << 32
INNER_IDS_BASE = GENERATION_SPAN - (1 << 20) - (1 << 22) - INNER_IDS


def _join(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name


class InnerChunks:
    """File ids and listings of the inner chunks of ``raw``'s sharded arrays."""

    def __init__(self, raw: RefSet) -> None:
        self.raw = raw
        self._ids: dict[str, int] = {}
        #: file id -> (key, the shard's raw file id, layout, position in the shard)
        self._entries: dict[int, tuple[str, int, ShardLayout, int]] = {}
        self._listings: dict[str, list[tuple[str, int]]] = {}

    def _inner_index(self, array: Array, name: str) -> tuple[int, ...] | None:
        parts = name.split(".")
        if len(parts) != len(array.grid) or not all(p.isdigit() for p in parts):
            return None
        index = tuple(int(p) for p in parts)
        return index if all(i < n for i, n in zip(index, array.grid, strict=True)) else None

    def _id(self, key: str, shard_id: int, layout: ShardLayout, position: int) -> int | None:
        found = self._ids.get(key)
        if found is None:
            if len(self._ids) >= INNER_IDS:
                log.warning("inner chunk %r has no file id: over %d inner chunks", key, INNER_IDS)
                return None
            found = INNER_IDS_BASE + len(self._ids)
            self._ids[key] = found
            self._entries[found] = (key, shard_id, layout, position)
        return found

    def shard_key(self, path: str, array: Array, name: str) -> tuple[str, int] | None:
        """The raw key of the shard holding inner chunk ``name`` of the sharded array at
        ``path``, and the inner chunk's position in it (``None``: not an inner chunk of
        the array's grid)."""
        assert array.shards is not None
        index = self._inner_index(array, name)
        if index is None:
            return None
        shard, position = array.shards.shard_of(index)
        return _join(path, array.keys.raw_key_of(shard)), position

    def file_id(self, path: str, array: Array, name: str) -> int | None:
        """The file id of inner chunk ``name`` of the sharded array at ``path``."""
        assert array.shards is not None
        found = self.shard_key(path, array, name)
        shard_id = None if found is None else self.raw.file_id(found[0])
        if found is None or shard_id is None:
            return None
        return self._id(_join(path, name), shard_id, array.shards, found[1])

    def entry(self, file_id: int) -> tuple[str, int, ShardLayout, int] | None:
        """``(key, shard's raw file id, layout, position)`` of an inner chunk's id."""
        return self._entries.get(file_id)

    def listing(self, path: str, array: Array) -> list[tuple[str, int]]:
        """``(name, file id)`` of every inner chunk of the array at ``path`` the set has."""
        found = self._listings.get(path)
        if found is None:
            found = self._listings[path] = self._walk(path, array)
        return found

    async def load(self, path: str) -> None:
        """Load the raw directories below the array at ``path`` (for lazy sets)."""
        pending = [path]
        while pending:
            directory = pending.pop()
            await self.raw.ensure(directory)
            after = -1
            while True:
                await self.raw.ensure(directory, after)
                batch = list(self.raw.children(directory, after))
                if not batch:
                    break
                pending.extend(_join(directory, c.name) for c in batch if c.file_id is None)
                after = batch[-1].cursor

    def _walk(self, path: str, array: Array) -> list[tuple[str, int]]:
        assert array.shards is not None
        shards: list[tuple[tuple[int, ...], int]] = []
        pending = [path]
        while pending:
            directory = pending.pop()
            for child in self.raw.children(directory):
                key = _join(directory, child.name)
                if child.file_id is None:
                    pending.append(key)
                    continue
                shard = array.keys.index_of(key[len(path) + 1 :] if path else key)
                if shard is not None:
                    shards.append((shard, child.file_id))
        entries = []
        for shard, shard_id in sorted(shards):
            for position, index in enumerate(array.shards.inner_chunks(shard)):
                if all(i < n for i, n in zip(index, array.grid, strict=True)):
                    name = ".".join(map(str, index))
                    file_id = self._id(_join(path, name), shard_id, array.shards, position)
                    if file_id is not None:
                        entries.append((name, file_id))
        return sorted(entries, key=lambda entry: tuple(map(int, entry[0].split("."))))

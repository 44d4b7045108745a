"""A reference set holding a Zarr v3 tree, presented as the Zarr v2 tree of the same data.

Any :class:`RefSet` whose keys are a v3 store's (a ``zarr.json`` per node, chunk keys per
the array's ``chunk_key_encoding``: a JSON reference set made from a v3 store, an Icechunk
repository) becomes a v2 set the decoded view (:class:`refmount.decode.view.DecodedRefSet`)
then serves like any kerchunk set:

- a group's ``zarr.json`` is its ``.zgroup`` and ``.zattrs``, an array's its ``.zarray``
  and ``.zattrs`` (:mod:`refmount.decode.v3.metadata`); the root group gets a consolidated
  ``.zmetadata``; ``zarr.json`` files themselves are not in the tree;
- a chunk keeps its reference and file id under its v2 name: ``c/1/2`` (the default
  encoding) is ``1/2`` with ``dimension_separator`` ``/`` (so a chunk directory of the
  v3 tree is one of the v2 tree: no index of chunk keys is built), ``c.1.2`` is ``1.2``,
  the ``v2`` encoding's keys are already v2 names, and a rank-0 array's ``c`` is ``0``;
- a sharded array's chunks are its inner chunks ``i.j``, each with a file id of its own
  and its shard's reference (:mod:`refmount.decode.v3.inner`); the decoded view decodes
  each from its shard (:mod:`refmount.decode.v3.shards`).

The made metadata files (``.zattrs``, ``.zmetadata``) have file ids at the top of a
tree's ids, below the decoded view's own made files
(:data:`refmount.decode.view.CREATED_IDS_BASE`); ``.zarray`` and ``.zgroup`` take the
``zarr.json``'s id.  An array whose metadata cannot be presented is named by
:meth:`V3AsV2.refused` (the decoded view leaves it out, logged, and ``refmount check
--decode`` lists it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence

from refmount.decode.arrays import ArrayRefused
from refmount.decode.v3.inner import InnerChunks
from refmount.decode.v3.metadata import Array, Group, parse_node
from refmount.decode.v3.shards import ShardLayout
from refmount.refs.model import Child, Ref, RefSet
from refmount.tree import GENERATION_SPAN

log = logging.getLogger(__name__)

NODE = "zarr.json"
ZARRAY, ZATTRS, ZGROUP, ZMETADATA = ".zarray", ".zattrs", ".zgroup", ".zmetadata"
#: How many made files (``.zattrs`` of nodes, the root's ``.zmetadata``) a tree may have;
#: their ids end where the decoded view's own made ids begin.
MADE_IDS = 1 << 22
MADE_IDS_BASE = GENERATION_SPAN - (1 << 20) - MADE_IDS
#: Listing cursors: the made entries first, then the raw set's own, shifted past them.
_SHIFT = 3

Node = Group | Array | ArrayRefused


def _join(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name


def _same(child: Child) -> str:
    return child.name


def holds_v3(raw: RefSet) -> bool:
    """Whether ``raw`` is a Zarr v3 tree: a root ``zarr.json`` and no root ``.zgroup``."""
    return raw.file_id(NODE) is not None and raw.file_id(ZGROUP) is None


def _json(document: object) -> bytes:
    return json.dumps(document, ensure_ascii=False).encode("utf-8")


class V3AsV2(RefSet):
    """``raw``, a Zarr v3 tree, as the v2 tree of the same data (see the module's doc)."""

    def __init__(self, raw: RefSet, *, fixed_strings: bool = False) -> None:
        self.raw = raw
        self.fixed_strings = fixed_strings
        self.mtime = raw.mtime
        self._nodes: dict[str, Node | None] = {}
        self._made_ids: dict[str, int] = {}  # key of a made file -> its file id
        self._made_keys: dict[int, str] = {}
        self._inner = InnerChunks(raw)

    # -- nodes ----------------------------------------------------------------------------

    def node(self, path: str) -> Node | None:
        """The node whose ``zarr.json`` is in directory ``path``, or why it is refused."""
        try:
            return self._nodes[path]
        except KeyError:
            pass
        found: Node | None = None
        file_id = self.raw.file_id(_join(path, NODE))
        if file_id is not None:
            ref = self.raw.ref(file_id)
            try:
                if ref.data is None:
                    raise ArrayRefused("its zarr.json is not held inline in the reference set")
                found = parse_node(ref.data, fixed_strings=self.fixed_strings)
            except ArrayRefused as exc:
                found = exc
                log.warning("node %r is left out of the decoded view: %s", path or "/", exc)
        self._nodes[path] = found
        return found

    def refused(self, path: str) -> str | None:
        """Why the node at ``path`` is left out, or ``None``."""
        node = self.node(path)
        return str(node) if isinstance(node, ArrayRefused) else None

    def _array_of(self, path: str) -> tuple[str, Array, str] | None:
        """``(array path, array, rest)`` when directory ``path`` is an array's or inside
        one (``rest``: the part of ``path`` after the array's, ``""`` for the array)."""
        rest = ""
        for _ in range(40):
            node = self.node(path)
            if isinstance(node, Array):
                return path, node, rest
            if node is not None or not path:
                return None
            path, _, last = path.rpartition("/")
            rest = _join(last, rest) if rest else last
        return None

    def _sharded(self, path: str) -> Array | None:
        """The sharded array whose directory is ``path``."""
        node = self.node(path)
        return node if isinstance(node, Array) and node.shards is not None else None

    async def next_shards(self, file_id: int) -> list[tuple[Ref, list[int]]]:
        """The references of the shards after the one holding inner chunk ``file_id``
        (:meth:`refmount.decode.v3.shards.ShardLayout.after`) that the set has: where a
        reader going through the array goes next; each with its inner chunks' ranks
        (:meth:`~refmount.decode.v3.shards.ShardLayout.ranks`)."""
        found = self._shard_of(file_id)
        if found is None:
            return []
        path, array, shard = found
        assert array.shards is not None
        shards = []
        for after in array.shards.after(shard, array.grid):
            raw_id = await self.raw.find_file(_join(path, array.keys.raw_key_of(after)))
            if raw_id is not None:
                shards.append((self.raw.ref(raw_id), array.shards.ranks(after, array.grid)))
        return shards

    def inner_ranks(self, file_id: int) -> list[int] | None:
        """The ranks of the inner chunks of the shard holding inner chunk ``file_id``."""
        found = self._shard_of(file_id)
        if found is None:
            return None
        _, array, shard = found
        assert array.shards is not None
        return array.shards.ranks(shard, array.grid)

    def _shard_of(self, file_id: int) -> tuple[str, Array, tuple[int, ...]] | None:
        """The array path, array and shard of inner chunk ``file_id``."""
        entry = self._inner.entry(file_id)
        if entry is None:
            return None
        path, _, name = entry[0].rpartition("/")
        array = self._sharded(path)
        if array is None or array.shards is None:
            return None
        return path, array, array.shards.shard_of(tuple(int(p) for p in name.split(".")))[0]

    def inner_chunk(self, file_id: int) -> tuple[ShardLayout, int] | None:
        """``(layout, position in its shard)`` of an inner chunk's file id."""
        entry = self._inner.entry(file_id)
        return None if entry is None else (entry[2], entry[3])

    def _raw_key(self, key: str) -> str | None:
        """The raw key of a presented chunk or passed-through key (``None``: made or not
        there)."""
        path, _, name = key.rpartition("/")
        inside = self._array_of(path)
        if inside is None:
            return None if name in (NODE, ZGROUP, ZATTRS, ZMETADATA, ZARRAY) else key
        array_path, array, rest = inside
        chunk = _join(rest, name) if rest else name
        if chunk in (ZARRAY, ZATTRS) or array.shards is not None:
            return None  # a shard is never a chunk: inner chunks have ids of their own
        if array.keys.rank == 0 and chunk != "0":
            return None
        return _join(array_path, array.keys.raw_name(chunk))

    def _presented_key(self, raw_key: str) -> str | None:
        path, _, name = raw_key.rpartition("/")
        if name == NODE:
            node = self.node(path)
            if isinstance(node, Array):
                return _join(path, ZARRAY)
            return _join(path, ZGROUP) if isinstance(node, Group) else None
        inside = self._array_of(path)
        if inside is None:
            return raw_key
        array_path, array, rest = inside
        chunk = _join(rest, name) if rest else name
        if array.keys.rank == 0:
            return _join(array_path, "0") if chunk == array.keys.raw_name("0") else None
        if not chunk.startswith(array.keys.prefix):
            return None
        return _join(array_path, chunk[len(array.keys.prefix) :])

    def _listed(self, path: str) -> tuple[str, Callable[[Child], str | None]] | None:
        """The raw directory listed as presented directory ``path``, and each raw entry's
        presented name there (``None``: not shown); ``None`` when it is no directory."""
        inside = self._array_of(path)
        if inside is None:
            return path, lambda child: None if child.name == NODE else child.name
        array_path, array, rest = inside
        keys = array.keys
        if keys.prefix == "c/" and keys.rank:  # c/1/2 -> 1/2: c/ is the chunks' directory
            return _join(_join(array_path, "c"), rest) if rest else _join(array_path, "c"), _same
        if rest:  # below an array: chunk directories of the v2 encoding with "/"
            return (path, _same) if keys.prefix == "" and keys.separator == "/" else None
        if keys.rank == 0:
            chunk = keys.raw_name("0")
            return array_path, lambda c: "0" if c.name == chunk and c.file_id is not None else None
        if keys.prefix:  # c.1.2 -> 1.2
            return (
                array_path,
                lambda c: (
                    c.name[2:] if c.name.startswith(keys.prefix) and c.file_id is not None else None
                ),
            )
        return array_path, lambda child: None if child.name == NODE else child.name

    # -- made files -----------------------------------------------------------------------

    def _made_names(self, path: str) -> list[str]:
        node = self.node(path)
        if isinstance(node, Array):
            return [ZATTRS]
        if isinstance(node, Group):
            return [ZATTRS, ZMETADATA] if not path else [ZATTRS]
        return []

    def _made_id(self, key: str) -> int | None:
        found = self._made_ids.get(key)
        if found is None:
            path, _, name = key.rpartition("/")
            if name not in self._made_names(path) or len(self._made_ids) >= MADE_IDS:
                return None
            found = MADE_IDS_BASE + len(self._made_ids)
            self._made_ids[key] = found
            self._made_keys[found] = key
        return found

    def _made_text(self, key: str) -> bytes:
        path, _, name = key.rpartition("/")
        if name == ZMETADATA:
            return _json({"zarr_consolidated_format": 1, "metadata": self._consolidated()})
        node = self.node(path)
        assert isinstance(node, Array | Group)
        return _json(node.attributes)

    def _documents(self, path: str) -> dict[str, object]:
        node = self.node(path)
        if isinstance(node, Array):
            return {ZARRAY: node.zarray, ZATTRS: node.attributes}
        if isinstance(node, Group):
            return {ZGROUP: {"zarr_format": 2}, ZATTRS: node.attributes}
        return {}

    def _consolidated(self) -> dict[str, object]:
        """Every node's v2 documents, keyed as ``.zmetadata`` keys them."""
        metadata: dict[str, object] = {}
        pending = [""]
        while pending:
            path = pending.pop()
            for name, document in self._documents(path).items():
                metadata[_join(path, name)] = document
            if isinstance(self.node(path), Array | ArrayRefused):
                continue
            pending.extend(
                _join(path, child.name)
                for child in self.raw.children(path)
                if child.file_id is None
            )
        return dict(sorted(metadata.items()))

    # -- the RefSet interface -------------------------------------------------------------

    def file_id(self, key: str) -> int | None:
        path, _, name = key.rpartition("/")
        node = self.node(path)
        if name in (ZARRAY, ZGROUP):
            wanted = Array if name == ZARRAY else Group
            return self.raw.file_id(_join(path, NODE)) if isinstance(node, wanted) else None
        made = self._made_id(key) if name in (ZATTRS, ZMETADATA) else None
        if made is not None:
            return made
        sharded = self._sharded(path)
        if sharded is not None:
            return self._inner.file_id(path, sharded, name)
        raw_key = self._raw_key(key)
        return None if raw_key is None else self.raw.file_id(raw_key)

    def key(self, file_id: int) -> str:
        made = self._made_keys.get(file_id)
        if made is not None:
            return made
        inner = self._inner.entry(file_id)
        if inner is not None:
            return inner[0]
        raw_key = self.raw.key(file_id)
        return self._presented_key(raw_key) or raw_key

    def ref(self, file_id: int) -> Ref:
        made = self._made_keys.get(file_id)
        if made is not None:
            return Ref(data=self._made_text(made))
        inner = self._inner.entry(file_id)
        if inner is not None:
            return self.raw.ref(inner[1])  # the whole shard
        raw_key = self.raw.key(file_id)
        path, _, name = raw_key.rpartition("/")
        node = self.node(path) if name == NODE else None
        if isinstance(node, Array):
            return Ref(data=_json(node.zarray))
        if isinstance(node, Group):
            return Ref(data=_json({"zarr_format": 2}))
        return self.raw.ref(file_id)

    async def file_ref(self, file_id: int) -> Ref:
        inner = self._inner.entry(file_id)
        if inner is not None:
            await self.raw.ensure(self.raw.key(inner[1]))
        elif file_id not in self._made_keys:
            await self.raw.ensure(self.raw.key(file_id))
        return self.ref(file_id)

    async def find_file(self, key: str) -> int | None:
        path, _, name = key.rpartition("/")
        await self.raw.ensure(_join(path, NODE))
        sharded = self._sharded(path)
        shard = None if sharded is None else self._inner.shard_key(path, sharded, name)
        if shard is not None:  # its shard's key only, not the array's every directory
            await self.raw.ensure(shard[0])
        raw_key = self._raw_key(key)
        if raw_key is not None:
            await self.raw.ensure(raw_key)
        return self.file_id(key)

    def file_size(self, file_id: int) -> int | None:
        inner = self._inner.entry(file_id)
        if inner is not None:
            return self.raw.file_size(inner[1])
        if file_id in self._made_keys or self.raw.key(file_id).endswith(NODE):
            ref = self.ref(file_id)
            return len(ref.data) if ref.data is not None else ref.length
        return self.raw.file_size(file_id)

    def is_dir(self, path: str) -> bool:
        if not path:
            return True
        inside = self._array_of(path)
        if inside is not None and not inside[2]:
            return True  # an array's directory, whatever its chunks
        if inside is not None and inside[1].shards is not None:
            return False  # a sharded array's inner chunks are files of its directory
        listed = self._listed(path)
        return listed is not None and self.raw.is_dir(listed[0])

    def subdirectory_count(self, path: str) -> int:
        # Answered without listing chunks: a lazy set (Icechunk) has not loaded them.
        inside = self._array_of(path)
        if inside is None:
            return self.raw.subdirectory_count(path)
        array = inside[1]
        if array.shards is not None or not array.keys.rank or array.keys.separator != "/":
            return 0
        listed = self._listed(path)
        return 0 if listed is None else self.raw.subdirectory_count(listed[0])

    def children(self, path: str, after: int = -1) -> Iterator[Child]:
        inside = self._array_of(path)
        if inside is None or not inside[2]:
            yield from self._node_entries(path, after)
        if inside is not None and inside[1].shards is not None:
            yield from self._inner_entries(path, inside, after)
            return
        listed = self._listed(path)
        if listed is None or not self.raw.is_dir(listed[0]):
            return
        raw_dir, presented = listed
        for child in self.raw.children(raw_dir, max(after - _SHIFT, -1)):
            name = presented(child)
            if name is not None:
                yield Child(name, child.file_id, child.cursor + _SHIFT)

    def _inner_entries(
        self, path: str, inside: tuple[str, Array, str], after: int
    ) -> Iterator[Child]:
        if inside[2]:
            return  # no directories below a sharded array's
        listing = self._inner.listing(path, inside[1])
        for at in range(max(after - _SHIFT + 1, 0), len(listing)):
            name, file_id = listing[at]
            yield Child(name, file_id, at + _SHIFT)

    def _node_entries(self, path: str, after: int) -> Iterator[Child]:
        """The v2 metadata of the node at ``path``, before the raw entries."""
        node = self.node(path)
        if isinstance(node, Array | Group):
            own = self.raw.file_id(_join(path, NODE))
            names = [ZARRAY if isinstance(node, Array) else ZGROUP, *self._made_names(path)]
            for cursor, name in enumerate(names):
                file_id = own if cursor == 0 else self._made_id(_join(path, name))
                if cursor > after and file_id is not None:
                    yield Child(name, file_id, cursor)

    async def ensure(self, path: str, after: int = -1) -> None:
        await self.raw.ensure(_join(path, NODE))
        if self._sharded(path) is not None:
            await self._inner.load(path)
            return
        listed = self._listed(path)
        if listed is not None:
            await self.raw.ensure(listed[0], max(after - _SHIFT, -1))

    def url_extent(self, url: str) -> int | None:
        return self.raw.url_extent(url)

    def protocols(self) -> set[str]:
        return self.raw.protocols()

    def target_urls(self) -> Sequence[str] | None:
        return self.raw.target_urls()

    def memory_bytes(self) -> int | None:
        return self.raw.memory_bytes()

    def close(self) -> None:
        self.raw.close()


def presented_as_v2(raw: RefSet, *, fixed_strings: bool = False) -> RefSet:
    """``raw`` as a Zarr v2 tree: itself, or a v3 tree translated."""
    return V3AsV2(raw, fixed_strings=fixed_strings) if holds_v3(raw) else raw

"""The decoded view of a reference set: the same keys, with arrays' chunks decoded.

:class:`DecodedRefSet` wraps the set the daemon loaded and is what the tree is given:
listings, lookups and sizes go through it.  Per key:

- JSON metadata (``.zarray``, ``.zattrs``, ``.zgroup``, ``.zmetadata``) held inline is
  served rewritten (:mod:`refmount.decode.arrays`, :mod:`refmount.decode.jsontext`);
- a chunk of an array is a :class:`DecodedRef` of the chunk's decoded size (known from
  the ``.zarray``, so ``stat`` fetches nothing), read through
  :class:`refmount.decode.reads.DecodedReads`;
- every other key is served as it is.

A rank-0 array is presented as a one-element array along a dimension ``_scalar_``
(:mod:`refmount.decode.scalars`): its ``.zarray``, its ``.zattrs`` and their
``.zmetadata`` entries say so.  A rank-0 array without a ``.zattrs`` gets one, a file the
view makes: its file id is taken from the top of the ids a tree gives one set
(:data:`CREATED_IDS_BASE` up, below ``GENERATION_SPAN``).  A set's own ids are counted
from 0 (a JSON set's rows; a Parquet set's metadata files, then its chunks), so only a
set of about 2**40 keys would reach them, and the tree's inode numbers do not hold such
a set's ids apart from the next generation's either.

An array the view cannot present (variable-length or structured dtype, a ``.zarray``
that is not Zarr v2 or not held inline, chunk bytes over the bound) is left out whole:
its directory, metadata and chunks are not in the view, and ``.zmetadata`` does not
list it.  Each such array is logged once.  An array whose codecs refmount does not
decode stays, and its chunks read as EIO.  A Zarr v3 tree is first presented as the v2
tree of the same data (:mod:`refmount.decode.v3.tree`), its refusals left out alike.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import trio

from refmount.decode.arrays import Array, ArrayRefused, ChunkDecoder, parse_zarray
from refmount.decode.codecs import ChunkDecoding
from refmount.decode.jsontext import dump_json, repair_document
from refmount.decode.scalars import scalar_attributes
from refmount.decode.strings import vlen_codecs
from refmount.decode.v3.shards import ShardDecoder, ShardLayout, shard_decoder
from refmount.decode.v3.tree import V3AsV2, presented_as_v2
from refmount.decode.widths import Fetch, Longest, measure_widths
from refmount.refs.model import Child, Ref, RefSet
from refmount.tree import GENERATION_SPAN

log = logging.getLogger(__name__)

METADATA_NAMES = frozenset((".zarray", ".zattrs", ".zgroup", ".zmetadata"))
#: The scheme of a decoded chunk's URL: ``refmount-decoded:<view serial>/<file id>``.
SCHEME = "refmount-decoded:"
#: How many ``.zattrs`` files of rank-0 arrays the view may make, and where their file
#: ids start: the top of a tree's file ids.
CREATED_IDS = 1 << 20
CREATED_IDS_BASE = GENERATION_SPAN - CREATED_IDS
#: The listing cursor of a made ``.zattrs``: after every entry of the set's own.
CREATED_CURSOR = 1 << 62
ATTRIBUTES = ".zattrs"
#: Decoded chunks' references a view keeps resolved (a reader's lookup, its read and
#: the read's decoding each ask for the same file's).
RESOLVED_CHUNKS = 4096


@dataclass(frozen=True, slots=True, eq=False)
class DecodedRef(Ref):
    """A decoded chunk: ``length`` decoded bytes of ``source`` through ``decoder``.  Two
    are equal when they decode the same reference alike (a reload keeps its inode)."""

    source: Ref | None = None
    decoder: ChunkDecoding | None = None

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, DecodedRef)
            and self.source == other.source
            and self.decoder is not None
            and other.decoder is not None
            and self.decoder.key == other.decoder.key
        )

    def __hash__(self) -> int:
        return hash((self.source, self.decoder.key if self.decoder else None))


def _join(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name


class DecodedRefSet(RefSet):
    """``raw`` with its arrays decoded; ``serial`` names it in its chunks' URLs;
    ``fixed_strings``: string arrays served as fixed-width bytes (``--decode-strings
    fixed``), not left out."""

    def __init__(
        self,
        raw: RefSet,
        serial: int,
        *,
        fixed_strings: bool = False,
        fetch: Fetch | None = None,
        longest: Longest | None = None,
    ) -> None:
        self.fixed_strings = fixed_strings
        self.raw = presented_as_v2(raw, fixed_strings=fixed_strings)
        #: With ``fixed_strings``: how string arrays are measured (their chunks fetched,
        #: their values read), and their widths (or why not), once measured.
        self._fetch = fetch
        self._longest = longest
        self._widths: dict[str, int | str] | None = None
        self._measuring: trio.Lock | None = None
        self._shard_decoders: dict[tuple[str, str, ShardLayout, int], ShardDecoder] = {}
        self.serial = serial
        self.mtime = raw.mtime
        self._arrays: dict[str, Array | ArrayRefused | None] = {}  # directory -> its array
        self._logged: set[str] = set()  # arrays whose leaving out was logged
        self._rewritten: dict[int, bytes] = {}  # file id of inline metadata -> its text
        self._created_ids: dict[str, int] = {}  # rank-0 array path -> its made .zattrs
        self._created_paths: dict[int, str] = {}  # and back
        #: Chunk file id -> its decoded reference and array path, as ``file_ref`` found
        #: them (at most :data:`RESOLVED_CHUNKS`, the oldest dropped first).
        self._resolved: dict[int, tuple[DecodedRef, str]] = {}

    # -- arrays ---------------------------------------------------------------------------

    def array_at(self, path: str) -> Array | ArrayRefused | None:
        """The array whose ``.zarray`` is in directory ``path``, why it is left out, or
        ``None`` when there is none."""
        try:
            return self._arrays[path]
        except KeyError:
            pass
        found: Array | ArrayRefused | None = None
        file_id = self.raw.file_id(_join(path, ".zarray"))
        refused = self.raw.refused(path) if isinstance(self.raw, V3AsV2) else None
        if refused is not None:
            found = ArrayRefused(refused)  # logged by the v3 tree
        elif file_id is not None:
            ref = self.raw.ref(file_id)
            try:
                if ref.data is None:
                    raise ArrayRefused("its .zarray is not held inline in the reference set")
                found = parse_zarray(
                    ref.data, string_width=self._width(path), fixed_strings=self.fixed_strings
                )
            except ArrayRefused as exc:
                found = exc
                if path not in self._logged:  # once, though strings' measures re-parse
                    self._logged.add(path)
                    log.warning("array %r is left out of the decoded view: %s", path or "/", exc)
        self._arrays[path] = found
        return found

    def _width(self, path: str) -> int | None:
        width = (self._widths or {}).get(path)
        if isinstance(width, str):
            raise ArrayRefused(f"its strings could not be measured: {width}")
        return width

    async def measure_strings(self) -> None:
        """With ``fixed_strings``, measure every string array once, before the first
        use of the view (their ``.zarray`` says their width)."""
        if (
            self._widths is not None
            or not self.fixed_strings
            or self._fetch is None
            or self._longest is None
        ):
            return
        if self._measuring is None:
            self._measuring = trio.Lock()
        async with self._measuring:
            if self._widths is None:
                self._widths = await measure_widths(self.raw, self._fetch, self._longest)
                self._arrays.clear()  # string arrays are presented from now on
                self._rewritten.clear()

    def string_array(self, path: str) -> bool:
        """Whether ``path`` holds a variable-length string array the view would serve
        (``fixed_strings``) once measured."""
        file_id = self.raw.file_id(_join(path, ".zarray"))
        data = self.raw.ref(file_id).data if file_id is not None else None
        try:
            meta = json.loads(data) if data is not None else None
        except (ValueError, UnicodeDecodeError, RecursionError):
            return False
        return self.fixed_strings and isinstance(meta, dict) and vlen_codecs(meta) is not None

    def left_out(self, path: str) -> bool:
        """Whether ``path`` (a key or directory) is inside an array left out."""
        while True:
            if isinstance(self.array_at(path), ArrayRefused):
                return True
            if not path:
                return False
            path = path.rpartition("/")[0]

    def chunk_array(self, key: str) -> tuple[str, Array] | None:
        """``(array path, array)`` when ``key`` is a chunk of an array."""
        path, _, name = key.rpartition("/")
        for _ in range(32):
            array = self.array_at(path)
            if isinstance(array, Array):
                return (path, array) if array.is_chunk_name(name) else None
            if not path:
                return None
            path, _, last = path.rpartition("/")
            name = f"{last}/{name}"
        return None

    async def chunk_source(self, file_id: int) -> tuple[str, Ref, ChunkDecoding] | None:
        """``(array path, raw reference, decoder)`` of a chunk's file id."""
        ref = await self.file_ref(file_id)
        if not isinstance(ref, DecodedRef) or ref.source is None or ref.decoder is None:
            return None
        return (self._resolved[file_id][1], ref.source, ref.decoder)

    async def next_shards(self, file_id: int) -> list[tuple[Ref, list[int]]]:
        """For an inner chunk of a sharded array, the raw references of the shards a
        reader reads next, with their inner chunks' ranks
        (:meth:`refmount.decode.v3.tree.V3AsV2.next_shards`)."""
        return await self.raw.next_shards(file_id) if isinstance(self.raw, V3AsV2) else []

    def inner_ranks(self, file_id: int) -> list[int] | None:
        """For an inner chunk of a sharded array, the ranks of its shard's inner chunks
        (:meth:`refmount.decode.v3.shards.ShardLayout.ranks`)."""
        return self.raw.inner_ranks(file_id) if isinstance(self.raw, V3AsV2) else None

    def _adds_attributes(self, path: str) -> bool:
        """Whether the view adds to the ``.zattrs`` of the array at ``path``: a rank-0
        array's dimension, a served dtype's attributes (CF time units)."""
        array = self.array_at(path)
        return isinstance(array, Array) and (array.scalar or bool(array.attributes))

    def _attributes(self, path: str, document: object) -> object:
        """The ``.zattrs`` document of ``path`` as the view serves it: the served dtype's
        attributes under the set's own, a rank-0 array's dimension named."""
        array = self.array_at(path)
        if not isinstance(array, Array) or not isinstance(document, dict):
            return document  # not a JSON object: as it is (readers refuse it alike)
        document = {**array.attributes, **document}
        return scalar_attributes(document) if array.scalar else document

    def _created_id(self, path: str) -> int | None:
        """The file id of the ``.zattrs`` the view makes for the array at ``path``: an
        array the view adds attributes to whose set has no ``.zattrs`` for it."""
        found = self._created_ids.get(path)
        if found is not None:
            return found
        if not self._adds_attributes(path) or self.raw.file_id(_join(path, ATTRIBUTES)) is not None:
            return None
        if len(self._created_ids) >= CREATED_IDS:
            log.warning(
                "array %r gets no attributes of its own: over %d made .zattrs files",
                path or "/",
                CREATED_IDS,
            )
            return None
        file_id = CREATED_IDS_BASE + len(self._created_ids)
        self._created_ids[path] = file_id
        self._created_paths[file_id] = path
        return file_id

    def arrays(self) -> dict[str, Array | ArrayRefused]:
        """Every array analysed so far (all, after a full walk), by path."""
        return {path: a for path, a in self._arrays.items() if a is not None}

    # -- metadata -------------------------------------------------------------------------

    def _metadata(self, file_id: int, key: str, text: bytes) -> bytes:
        rewritten = self._rewritten.get(file_id)
        if rewritten is None:
            rewritten = self._rewrite(key, text)
            self._rewritten[file_id] = rewritten
        return rewritten

    def _rewrite(self, key: str, text: bytes) -> bytes:
        path, _, name = key.rpartition("/")
        if name == ".zarray":
            array = self.array_at(path)
            return array.rewritten() if isinstance(array, Array) else text
        try:
            document = json.loads(text)
            if name == ".zmetadata" and isinstance(document, dict):
                document = self._consolidated(path, document)
            elif name == ATTRIBUTES:
                document = self._attributes(path, document)
            return dump_json(repair_document(document, key))
        except (ValueError, UnicodeDecodeError, RecursionError):
            return text  # not JSON, or nested too deep: as it is (readers fail on it)

    def _consolidated(self, path: str, document: dict) -> dict:
        """``.zmetadata`` with its ``.zarray`` entries rewritten, arrays' attributes as
        :meth:`_attributes` serves them (made where missing), left-out arrays gone."""
        entries = document.get("metadata")
        if not isinstance(entries, dict):
            return document
        kept = {}
        for entry_key, value in entries.items():
            entry_dir, _, entry_name = _join(path, entry_key).rpartition("/")
            if self.left_out(entry_dir):
                continue
            if entry_name == ".zarray":
                array = self.array_at(entry_dir)
                if isinstance(array, Array):
                    value = json.loads(array.rewritten())
            elif entry_name == ATTRIBUTES:
                value = self._attributes(entry_dir, value)
            kept[entry_key] = value
        for entry_key in list(kept):
            array_key, _, entry_name = entry_key.rpartition("/")
            attributes_key = _join(array_key, ATTRIBUTES)
            if (
                entry_name == ".zarray"
                and attributes_key not in kept
                and self._adds_attributes(_join(path, array_key))
            ):
                kept[attributes_key] = self._attributes(_join(path, array_key), {})
        return {**document, "metadata": kept}

    # -- the RefSet interface -------------------------------------------------------------

    def file_id(self, key: str) -> int | None:
        path, _, name = key.rpartition("/")
        if self.left_out(path):
            return None
        found = self.raw.file_id(key)
        return self._created_id(path) if found is None and name == ATTRIBUTES else found

    def key(self, file_id: int) -> str:
        created = self._created_paths.get(file_id)
        return self.raw.key(file_id) if created is None else _join(created, ATTRIBUTES)

    def ref(self, file_id: int) -> Ref:
        if file_id in self._created_paths:
            return Ref(data=dump_json(self._attributes(self._created_paths[file_id], {})))
        return self._presented(file_id, self.raw.ref(file_id))

    async def file_ref(self, file_id: int) -> Ref:
        resolved = self._resolved.get(file_id)
        if resolved is not None:
            return resolved[0]
        await self.measure_strings()
        if file_id in self._created_paths:
            return self.ref(file_id)
        presented = self._presented(file_id, await self.raw.file_ref(file_id))
        if isinstance(presented, DecodedRef):  # kept once the strings are measured
            found = self.chunk_array(self.raw.key(file_id))
            if len(self._resolved) >= RESOLVED_CHUNKS:
                del self._resolved[next(iter(self._resolved))]
            self._resolved[file_id] = (presented, found[0] if found else "?")
        return presented

    async def find_file(self, key: str) -> int | None:
        await self.measure_strings()
        path, _, name = key.rpartition("/")
        if self.left_out(path):
            return None
        found = await self.raw.find_file(key)
        return self._created_id(path) if found is None and name == ATTRIBUTES else found

    def _presented(self, file_id: int, ref: Ref) -> Ref:
        """What the view serves for a key whose raw reference is ``ref``."""
        key = self.raw.key(file_id)
        name = key.rpartition("/")[2]
        if name in METADATA_NAMES:
            return Ref(data=self._metadata(file_id, key, ref.data)) if ref.data is not None else ref
        found = self.chunk_array(key)
        if found is None:
            return ref
        decoder = self._decoder(file_id, found[1])
        return DecodedRef(
            url=f"{SCHEME}{self.serial}/{file_id}", length=decoder.size, source=ref, decoder=decoder
        )

    def _decoder(self, file_id: int, array: Array) -> ChunkDecoding:
        """The decoder of a chunk of ``array``: the array's, or for an inner chunk of a
        sharded Zarr v3 array, the decoding of its place in the shard."""
        inner = self.raw.inner_chunk(file_id) if isinstance(self.raw, V3AsV2) else None
        if inner is None or not isinstance(array.decoder, ChunkDecoder):
            return array.decoder
        layout, position = inner
        fill = array.meta.get("fill_value")
        key = (array.decoder.key, repr(fill), layout, position)
        found = self._shard_decoders.get(key)
        if found is None:  # the array's inner chunks share one fill value's bytes
            shared = (*key[:3], -1)
            first = self._shard_decoders.get(shared)
            if first is None:
                first = shard_decoder(array.decoder, layout, -1, fill)
                self._shard_decoders[shared] = first
            found = self._shard_decoders[key] = first.at(position)
        return found

    def file_size(self, file_id: int) -> int | None:
        key = self.key(file_id)
        if key.rpartition("/")[2] not in METADATA_NAMES:
            found = self.chunk_array(key)
            if found is not None:
                return found[1].decoder.size
            return self.raw.file_size(file_id)
        ref = self.ref(file_id)
        return len(ref.data) if ref.data is not None else ref.length

    def is_dir(self, path: str) -> bool:
        return self.raw.is_dir(path) and not self.left_out(path)

    def children(self, path: str, after: int = -1) -> Iterator[Child]:
        if self.left_out(path):
            return
        for child in self.raw.children(path, after):
            if child.file_id is None and isinstance(
                self.array_at(_join(path, child.name)), ArrayRefused
            ):
                continue
            yield child
        if after < CREATED_CURSOR:
            created = self._created_id(path)
            if created is not None:
                yield Child(ATTRIBUTES, created, CREATED_CURSOR)

    def subdirectory_count(self, path: str) -> int:
        left_out = sum(
            1
            for at, array in self._arrays.items()
            if isinstance(array, ArrayRefused) and at and at.rpartition("/")[0] == path
        )
        return self.raw.subdirectory_count(path) - left_out

    async def ensure(self, path: str, after: int = -1) -> None:
        # Metadata keys are held by every kind of set: ``array_at`` loads nothing.
        await self.measure_strings()
        await self.raw.ensure(path, after)

    def url_extent(self, url: str) -> int | None:
        return self.raw.url_extent(url)

    def protocols(self) -> set[str]:
        return self.raw.protocols()

    def target_urls(self) -> Sequence[str] | None:
        return self.raw.target_urls()

    def close(self) -> None:
        self.raw.close()

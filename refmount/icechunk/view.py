"""An Icechunk repository at one version, as a reference set.

Files: each node's ``zarr.json`` (the bytes the store holds) has ids ``0..M-1`` in sorted
key order; each array then has a block of ids, its base plus a chunk's index in its grid
(see :mod:`refmount.icechunk.keys`).  An array's chunk references are read on first use
(a lookup of one of its chunks, a listing of a directory of its chunks), in a worker
thread, into a compact :class:`~refmount.icechunk.index.ArrayIndex`; the synchronous
methods answer from what is held and raise :class:`NotLoaded` otherwise.

An array whose chunk grid refmount cannot read takes its grid from its manifests: the
extents the snapshot gives them, or, when they give none of its rank, the chunks they
hold, known once its index is read.  Such an array's block of ids is reserved after every
other's, its keys meanwhile those of an unbounded grid of its rank: what cannot be one of
its keys answers ENOENT, what can waits for its index (EIO when that cannot be read).
An array whose keys cannot be known (its ``zarr.json`` does not say them) or that has
more than the mount's file ids can number is *refused*: what might be one of its keys
(by its key encoding, on an unbounded grid of its rank) is EIO, never absent, and its
``zarr.json`` is served.  An array's index that cannot be read or used is remembered as
such for a back-off (:class:`~refmount.backoff.Backoff`): lookups meanwhile fail at once,
not by reading its manifests again.

Bytes: inline chunks are held; native chunks are the objects ``chunks/<id>`` of the
repository's storage and virtual chunks ranges of their URLs, both read by refmount's own
fetcher and cache.  A chunk the manifest does not hold does not exist.

Directory cursors: in a group or array directory, the position in its sorted entries;
chunk entries listed in an array's own directory follow with cursor ``len(entries) +
chunk index`` (or first coordinate); in a directory of chunk keys, the coordinate.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import trio

from refmount import header_text
from refmount.backoff import Backoff
from refmount.errors import FetchError
from refmount.icechunk.containers import Containers
from refmount.icechunk.index import ArrayIndex
from refmount.icechunk.keys import ChunkKeys
from refmount.icechunk.location import Location
from refmount.icechunk.manifest import INLINE, NATIVE, ManifestError
from refmount.icechunk.repository import Node, Repository, history
from refmount.malloc import bulk_allocations
from refmount.refs import release_freed_memory
from refmount.refs.chunkgrid import GridError, chunk_counts
from refmount.refs.model import Checksum, Child, Ref, RefSet

log = logging.getLogger(__name__)

#: File ids of one set stay below this (the tree's span per generation is 2**40).
MAX_FILE_IDS = 1 << 39
_FIRST_WINDOW, _MAX_WINDOW = 64, 16384  # chunk indices a listing decodes at a time
#: The longest chunk a reference may claim: longer is a corrupt or hostile manifest.
MAX_CHUNK_BYTES = 1 << 34
#: Chunk coordinates are uint32: every key of an array whose grid is not known yet
_UNBOUNDED = 1 << 32
#: An array's index that failed is read again after this back-off, doubling to the most
FIRST_RETRY, MOST_RETRY = 30.0, 300.0


class NotLoaded(LookupError):
    """A synchronous lookup in an array whose references are not held: use the async
    methods (or :meth:`IcechunkRefSet.ensure`) first."""


@dataclass
class _Array:
    node: Node
    keys: ChunkKeys
    base: int
    index: ArrayIndex | None = None
    lock: trio.Lock | None = None
    #: the entries of the array's own directory before any chunk entry
    own_entries: int = 0
    #: ``keys`` are provisional until the index gives the grid its chunks cover; the
    #: ids reserved for them
    deferred: bool = False
    span: int = 0
    #: why its chunks are not served (its keys: what might be one, all EIO)
    refused: str | None = None
    failure: Backoff = field(default_factory=lambda: Backoff(FIRST_RETRY, MOST_RETRY))


class IcechunkRefSet(RefSet):
    def __init__(
        self, repository: Repository, containers: Containers, nodes: list[Node], mtime: float
    ) -> None:
        self.mtime = mtime
        self.repository = repository
        self.containers = containers
        self.location: Location = repository.location
        self.snapshot_id = repository.snapshot_id
        metadata = {_meta_key(node.path): node.metadata for node in nodes}
        self._meta_keys = sorted(metadata)
        self._meta_ids = {key: i for i, key in enumerate(self._meta_keys)}
        self._meta_bytes = [metadata[key] for key in self._meta_keys]
        self._arrays: dict[str, _Array] = {}
        base = len(self._meta_keys)
        deferred: list[_Array] = []
        for node in sorted((n for n in nodes if n.is_array), key=lambda n: n.path):
            keys, provisional, refused = _chunk_keys(node)
            if refused is None and not provisional and base + keys.count > MAX_FILE_IDS:
                refused = f"too many chunks ({keys.count:,}) for the mount's file ids"
            array = self._arrays[node.path] = _Array(node, keys, base, deferred=provisional)
            if refused is not None:
                array.refused = f"{node.path}: {refused}: its chunks are not served"
                log.warning("%s: %s; every key it might have is EIO", self.location.name,
                            array.refused)  # fmt: skip
            elif provisional:
                deferred.append(array)
            else:
                base += keys.count
        span = (MAX_FILE_IDS - base) // max(len(deferred), 1)
        for n, array in enumerate(deferred):
            array.base, array.span = base + n * span, span
        # the array holding ids last among those of one base (the others have none)
        self._by_base = sorted(self._arrays.values(), key=lambda a: (a.base, _holds_ids(a)))
        self._bases = [array.base for array in self._by_base]
        self._dirs = self._directories(nodes)
        self._listed: dict[int, int] = {}  # see file_size

    @classmethod
    def open(cls, repository: Repository, containers: Containers) -> IcechunkRefSet:
        nodes, mtime = repository.nodes()
        return cls(repository, containers, nodes, mtime)

    def _directories(self, nodes: list[Node]) -> dict[str, list[tuple[str, int | None]]]:
        """Each group's and array's sorted entries (chunk entries excepted)."""
        entries: dict[str, list[tuple[str, int | None]]] = {}
        directories = {""}
        for node in nodes:
            path = node.path
            while path not in directories:
                directories.add(path)
                path = path.rpartition("/")[0]
        for path in directories:
            entries.setdefault(path, [])
            if path:
                parent, _, name = path.rpartition("/")
                entries.setdefault(parent, []).append((name, None))
        for key, file_id in self._meta_ids.items():
            parent, _, name = key.rpartition("/")
            entries.setdefault(parent, []).append((name, file_id))
        for path, array in self._arrays.items():
            if array.keys.top and array.keys.count:
                entries[path].append((array.keys.top, None))
        for listing in entries.values():
            listing.sort()
        for path, array in self._arrays.items():
            array.own_entries = len(entries[path])
        return entries

    # --- loading ---------------------------------------------------------------------

    def _array_of(self, path: str) -> tuple[_Array, str] | None:
        """The array a path lies in, and the path relative to the array."""
        candidate = path
        while candidate:
            array = self._arrays.get(candidate)
            if array is not None:
                return array, path[len(candidate) + 1 :]
            candidate = candidate.rpartition("/")[0]
        return None

    async def ensure(self, path: str, after: int = -1) -> None:
        """Read the chunk references of the array ``path`` lies in (with the checksums of
        its virtual chunks), when the path names one of its chunks or lists them.
        FetchError (EIO) when they cannot be read."""
        found = self._array_of(path)
        if found is None:
            return
        array, relative = found
        keys = array.keys
        if array.index is not None or relative == "zarr.json" or not keys.count:
            return
        fixed = keys.directory(relative)
        # a provisional grid's directories are known only from the index
        lists = fixed is not None and (array.deferred or keys.file_range(fixed) is not None)
        if not lists and keys.parse(relative) is None:
            return
        if array.refused is not None:
            if relative:  # its own directory is found (listing its keys there: EIO)
                raise FetchError(array.refused)
            return
        if array.lock is None:
            array.lock = trio.Lock()
        async with array.lock:
            if array.index is None:
                array.failure.check()
                try:
                    index = await trio.to_thread.run_sync(self._read_index, array)
                    if array.deferred:
                        keys = self._covered_keys(array, index.grid)
                except FetchError as exc:
                    wait = array.failure.failed(str(exc))
                    log.info("%s (tried again after %g s)", exc, wait)
                    raise
                array.keys, array.index = keys, index

    def _covered_keys(self, array: _Array, grid: tuple[int, ...]) -> ChunkKeys:
        """The keys of a deferred array on the grid its chunks cover, within its ids."""
        keys = ChunkKeys.from_metadata(array.node.document, grid)
        if keys.count > array.span:
            raise FetchError(f"{array.node.path}: its chunks span a grid of {list(grid)}, "
                             f"over the {array.span} keys one array may have: refused")  # fmt: skip
        log.info("%s: chunk grid not read: its keys are its manifests' chunks, on a grid "
                 "of %s", array.node.path, list(grid))  # fmt: skip
        return keys

    def _read_index(self, array: _Array) -> ArrayIndex:
        """The array's index; its failures as FetchError (EIO) naming the array."""
        try:
            with bulk_allocations():  # a hundred temporary arrays of 8 MiB for 1M chunks
                grid = None if array.deferred else array.keys.grid
                index = self.repository.array_index(array.node, grid)
        except FetchError:
            raise
        except ManifestError as exc:
            raise FetchError(f"{array.node.path}: its manifest is unusable: {exc}") from None
        except Exception as exc:  # icechunk's own: a corrupt or missing manifest
            message = str(exc).strip().splitlines()
            raise FetchError(
                f"{array.node.path}: cannot read its manifest: "
                f"{message[0] if message else type(exc).__name__}"
            ) from None
        release_freed_memory()  # the reading's peak must not stay resident
        kinds = ", ".join(f"{n} {k}" for k, n in index.kind_counts().items() if n)
        log.info("%s: %d chunk references (%s)", array.node.path, len(index), kinds)
        return index

    def _held(self, array: _Array) -> ArrayIndex:
        if array.refused is not None:
            raise FetchError(array.refused)
        if array.index is None:
            raise NotLoaded(f"{array.node.path}: chunk references not loaded")
        return array.index

    def _grid_known(self, array: _Array) -> bool:
        """Whether the array's keys are its grid's (not a deferred array's provisional,
        nor a refused array's possible ones)."""
        return array.refused is None and (not array.deferred or array.index is not None)

    # --- keys and file ids -----------------------------------------------------------

    async def find_file(self, key: str) -> int | None:
        await self.ensure(key)
        return self.file_id(key)

    def file_id(self, key: str) -> int | None:
        file_id = self._meta_ids.get(key)
        if file_id is not None:
            return file_id
        found = self._array_of(key)
        if found is None:
            return None
        array, relative = found
        index = array.keys.parse(relative)
        if index is None:
            return None
        return array.base + index if self._held(array).row(index) is not None else None

    def key(self, file_id: int) -> str:
        if file_id < len(self._meta_keys):
            return self._meta_keys[file_id]
        array, index = self._chunk_of(file_id)
        return f"{array.node.path}/{array.keys.name(index)}"

    def _chunk_of(self, file_id: int) -> tuple[_Array, int]:
        array = self._by_base[bisect.bisect_right(self._bases, file_id) - 1]
        return array, file_id - array.base

    def ref(self, file_id: int) -> Ref:
        if file_id < len(self._meta_keys):
            return Ref(data=self._meta_bytes[file_id])
        array, index = self._chunk_of(file_id)
        chunks = self._held(array)
        row = chunks.row(index)
        if row is None:
            raise KeyError(f"file id {file_id}: no such chunk")
        kind = int(chunks.kinds[row])
        if kind == INLINE:
            return Ref(data=chunks.inline_bytes(row))
        key = f"{array.node.path}/{array.keys.name(index)}"
        offset, length = int(chunks.offsets[row]), int(chunks.lengths[row])
        checksum = None if kind == NATIVE else chunks.checksum_of(row)
        refusal = _refusal(offset, length, checksum)
        if refusal is not None:
            raise FetchError(f"{key}: {refusal}: refused")
        if kind == NATIVE:
            return Ref(url=self.location.chunk_url(chunks.path(row)), offset=offset, length=length)
        return Ref(
            url=self.containers.target(chunks.path(row), key),
            offset=offset,
            length=length,
            checksum=checksum,
        )

    def file_size(self, file_id: int) -> int | None:
        """Asked for every entry of a listing, just after :meth:`children` gave it: the
        sizes of the window of chunks it lists last answer without a search.  A refused
        chunk that claims no bytes is 1 byte long: the kernel reads a file of size 0
        without asking, and the reader would get an empty chunk, not the read's EIO."""
        size = self._listed.get(file_id)
        if size:
            return size
        if file_id < len(self._meta_keys):
            return len(self._meta_bytes[file_id])
        array, index = self._chunk_of(file_id)
        chunks = self._held(array)
        row = chunks.row(index)
        if row is None:
            return None
        size = chunks.size(row)
        kind = int(chunks.kinds[row])
        if size == 0 and kind != INLINE:
            checksum = None if kind == NATIVE else chunks.checksum_of(row)
            if _refusal(int(chunks.offsets[row]), size, checksum) is not None:
                return 1
        return size

    # --- directories -----------------------------------------------------------------

    def is_dir(self, path: str) -> bool:
        if path in self._dirs:
            return True
        found = self._array_of(path)
        return found is not None and found[0].keys.directory(found[1]) is not None

    def children(self, path: str, after: int = -1) -> Iterator[Child]:
        entries = self._dirs.get(path)
        if entries is not None:
            for position in range(max(after + 1, 0), len(entries)):
                name, file_id = entries[position]
                yield Child(name, file_id, position)
            array = self._arrays.get(path)
            if array is None or array.keys.top:
                return
            yield from self._chunk_children(array, (), after - array.own_entries,
                                            array.own_entries)  # fmt: skip
            return
        found = self._array_of(path)
        if found is not None:
            fixed = found[0].keys.directory(found[1])
            if fixed is not None:
                yield from self._chunk_children(found[0], fixed, after, 0)

    def _chunk_children(
        self, array: _Array, fixed: tuple[int, ...], after: int, shift: int
    ) -> Iterator[Child]:
        if not self._grid_known(array):
            self._held(array)  # its grid is the index's
        keys = array.keys
        files = keys.file_range(fixed)
        if files is None:  # a directory of index directories: all of the grid's
            for i in range(max(after + 1, 0), keys.grid[len(fixed)]):
                yield Child(str(i), None, shift + i)
            return
        start, stop = files
        chunks = self._held(array)
        first = start + max(after + 1, 0)
        # Windows that start small and grow: a listing resumed for a few entries (one
        # FUSE readdir call) pays for a few names, a long listing for few windows.
        window = _FIRST_WINDOW
        new_child = tuple.__new__  # Child(...) without its Python-level __new__: per entry
        while first < stop:
            end = min(stop, first + window)
            present, sizes = chunks.present(first, end)
            names = keys.file_names(present, fixed)
            ids = (present + array.base).tolist()
            cursors = (present + (shift - start)).tolist()
            self._listed = dict(zip(ids, sizes.tolist(), strict=True))
            yield from map(new_child, repeat(Child), zip(names, ids, cursors, strict=True))
            first, window = end, min(window * 2, _MAX_WINDOW)

    def subdirectory_count(self, path: str) -> int:
        entries = self._dirs.get(path)
        if entries is not None:
            count = sum(1 for _, file_id in entries if file_id is None)
            array = self._arrays.get(path)
            if array is None or not self._grid_known(array):
                return count  # a provisional grid's directories are not counted
            if not array.keys.top and array.keys.file_range(()) is None:
                count += array.keys.grid[0]
            return count
        found = self._array_of(path)
        if found is None or not self._grid_known(found[0]):
            return 0
        keys = found[0].keys
        fixed = keys.directory(found[1])
        if fixed is None or keys.file_range(fixed) is not None:
            return 0
        return keys.grid[len(fixed)]

    # --- what the daemon asks of a set -----------------------------------------------

    def protocols(self) -> set[str]:
        return {self.location.protocol, *self.containers.protocols()}

    def target_urls(self) -> list[str]:
        """The prefixes every URL the set reads lies under: the repository's chunks and
        the virtual chunk containers a mount may read (their hosts are what flat
        ``--remote-options`` are bound to)."""
        return [self.location.chunk_url(""), *self.containers.allowed()]

    def memory_bytes(self) -> int:
        held = sum(len(data) for data in self._meta_bytes)
        return held + sum(a.index.nbytes for a in self._arrays.values() if a.index is not None)

    def source_version(self) -> dict[str, Any]:
        return {
            "snapshot": self.snapshot_id,
            "version": self.repository.version.describe(),
            "written": self.mtime,
        }

    def summary(self) -> dict[str, Any]:
        """Versions, containers, and each array's chunks by kind (as far as loaded)."""
        versions = history(self.location, self.repository.options)
        return {
            "branches": versions.branches,
            "tags": versions.tags,
            "snapshot": self.snapshot_id,
            "version": self.repository.version.describe(),
            "containers": self.containers.declared,
            "arrays": {
                path: array.index.kind_counts() if array.index is not None else {}
                for path, array in self._arrays.items()
            },
        }

    def close(self) -> None:
        self.repository.close()


def _meta_key(path: str) -> str:
    return f"{path}/zarr.json" if path else "zarr.json"


def _holds_ids(array: _Array) -> bool:
    return array.refused is None and (array.deferred or array.keys.count > 0)


def _chunk_keys(node: Node) -> tuple[ChunkKeys, bool, str | None]:
    """An array's chunk keys from its ``zarr.json`` (a regular or rectilinear grid), or
    for a grid refmount cannot read, from its manifests: keys are keys, and the raw view
    serves every one the manifests hold (their readers know the grid).  True beside
    provisional keys (every key of the array's rank): its manifests give no extents of
    its rank, and its grid is the one its chunks cover, known from its index.  An array
    whose keys cannot be known at all is refused: the reason, beside the keys it might
    have (:func:`_possible_keys`)."""
    document = node.document
    try:
        shape = [int(n) for n in document["shape"]]
        if any(s < 0 for s in shape):
            raise ValueError(f"shape {shape} has a negative extent")
        try:
            grid = chunk_counts(document["chunk_grid"], shape)
        except GridError as exc:
            grid = _extents_grid(node, len(shape), exc)
        if grid is None:
            return ChunkKeys.from_metadata(document, (_UNBOUNDED,) * len(shape)), True, None
        return ChunkKeys.from_metadata(document, grid), False, None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return _possible_keys(node), False, f"its chunk keys cannot be read ({exc})"


def _possible_keys(node: Node) -> ChunkKeys:
    """What might be a chunk key of an array whose keys cannot be known: a key of an
    unbounded grid of its rank (its ``zarr.json``'s, else the snapshot's) by its key
    encoding, or when that cannot be read either, by icechunk's own (``c/0/0``)."""
    document = node.document
    shape = document.get("shape") if isinstance(document, dict) else None
    unbounded = (_UNBOUNDED,) * (len(shape) if isinstance(shape, list) else node.rank)
    try:
        return ChunkKeys.from_metadata(document, unbounded)
    except (TypeError, ValueError, AttributeError):
        return ChunkKeys(unbounded)


def _extents_grid(node: Node, rank: int, problem: GridError) -> tuple[int, ...] | None:
    """The chunks along each dimension that the array's manifests cover (each manifest's
    ``[start, stop)`` extents); None when a manifest gives none of ``rank`` dimensions
    (then the chunks it holds tell)."""
    grid = [0] * rank
    for _, extents in node.manifests:
        if len(extents) != rank:
            log.info("%s: chunk grid not read (%s), no extents of its rank: its keys are "
                     "the chunks its manifests hold", node.path, problem)  # fmt: skip
            return None
        grid = [max(n, stop) for n, (_, stop) in zip(grid, extents, strict=True)]
    log.info("%s: chunk grid not read (%s): its keys are the manifests' %s", node.path,
             problem, grid)  # fmt: skip
    return tuple(grid)


def _refusal(offset: int, length: int, checksum: Checksum | None) -> str | None:
    """Why a manifest's reference to stored bytes (not inline) is not fetched, if it is
    not: bounds no chunk can have, or a checksum ETag no header may carry."""
    if length > MAX_CHUNK_BYTES or offset > (1 << 62):
        return (
            f"the manifest claims {length} bytes at offset {offset}, over the bound of "
            f"{MAX_CHUNK_BYTES} bytes per chunk"
        )
    if checksum is not None and checksum.etag is not None:
        problem = header_text.value_problem(checksum.etag)
        if problem is not None:
            shown = header_text.escaped(checksum.etag, 60)
            return f"the manifest's checksum ETag {shown!r} {problem}"
    return None

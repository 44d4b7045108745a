"""Parquet reference sets (fsspec's ``LazyReferenceMapper`` layout), read lazily.

Layout (see the spec's "Parquet references")::

    ROOT/.zmetadata                 {"metadata": {key: value}, "record_size": N, ...}
    ROOT/<array path>/refs.<R>.parq rows path/offset/size/raw, N per file

Opening reads only ``.zmetadata`` (``parquet.layout``: what is a file, an array, a
directory).  A record file is read when a key in it is looked up or its directory is
listed (``parquet.store``), and decoded records live in a byte-bounded LRU as a few compact
numpy / pyarrow arrays (``parquet.records``, imported with numpy and pyarrow on the first
record read, so that a mount answers before either loads).

Only the ``async`` methods (:meth:`find_file`, :meth:`file_ref`, :meth:`ensure`) load
anything, in worker threads; the synchronous ones answer from what is held and never do
I/O.  A chunk whose record is not held raises :class:`NotLoaded` from :meth:`file_id` and
:meth:`ref`, and a listing (:meth:`children`) stops before the first record it does not
hold: the caller resumes it from the last cursor after :meth:`ensure`, so a listing of a
huge grid loads its records one readdir call at a time, off the serving loop.

Tree rules beyond ``parquet.layout``'s and ``parquet.grid``'s: a chunk whose row is empty
(neither path nor raw), or whose record file is absent (and its directory's listing
agrees), does not exist and is not listed.  A row whose reference cannot be served (a
negative offset, an unusable path) is a key all the same: listed, it stats, and its
:meth:`file_ref` is a FetchError naming the key and the reason (EIO, never ENOENT: zarr
would read that as the fill value).  For ``dimension_separator: "/"`` arrays, every index directory
inside the grid exists (and is listed), whether or not any chunk below it exists: this
needs no record reads.  The chunk files in the last level are listed only when they exist.

File ids: metadata files ``0..M-1`` in sorted key order, then each array's block (see
``parquet.grid``).  Directory cursors: the position in the sorted entry list; in an array
directory, chunk entries follow with cursor ``len(metadata entries) + chunk index`` (first
index for nested arrays), and in a nested index directory the cursor is the index itself.
Resuming is a jump, never a rescan.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from refmount.errors import FetchError
from refmount.refs.model import Child, Ref, RefSet
from refmount.refs.parquet.grid import ChunkGrid, ChunkGrids
from refmount.refs.parquet.layout import ZMETADATA, Layout, consolidated_value, load_zmetadata
from refmount.refs.parquet.store import ABSENT, RecordStore
from refmount.refs.values import inline_bytes

if TYPE_CHECKING:  # numpy and pyarrow are imported on the first record read
    import numpy as np

    from refmount.refs.parquet.records import Record

#: default bytes of decoded records held at once
RECORD_CACHE_BYTES = 256 << 20
#: default decompressed bytes a record file's columns may take (inline data included)
RECORD_BYTES = 64 << 20
_FIRST_BATCH = 64
_MAX_BATCH = 8192


class NotLoaded(LookupError):
    """A synchronous lookup of a chunk whose record is not held: use the async method."""


class ParquetRefSet(RefSet):
    """A LazyReferenceMapper directory, mounted without reading its record files."""

    def __init__(
        self,
        fs: Any,
        root: str,
        layout: Layout,
        *,
        resolve: Callable[[str], str],
        mtime: float,
        record_cache_bytes: int,
        record_bytes: int,
        load_timeout: float,
    ) -> None:
        self.mtime = mtime
        self.record_size = layout.record_size
        self._root = root
        self._store = RecordStore(
            fs,
            root,
            record_size=layout.record_size,
            resolve=resolve,
            cache_bytes=record_cache_bytes,
            record_bytes=record_bytes,
            load_timeout=load_timeout,
        )
        consolidated = {k: consolidated_value(v) for k, v in layout.files.items()}
        doc = {"metadata": consolidated, "zarr_consolidated_format": 1}
        files: dict[str, bytes] = {k: inline_bytes(v, k) for k, v in layout.files.items()}
        files[ZMETADATA] = json.dumps(doc, separators=(",", ":")).encode("ascii")
        self._meta_keys = sorted(files)
        self._meta_ids = {k: i for i, k in enumerate(self._meta_keys)}
        self._meta_bytes = [files[k] for k in self._meta_keys]

        entries: dict[str, list[tuple[str, int | None]]] = {d: [] for d in layout.dirs}
        for d in layout.dirs:
            if d:
                parent, _, name = d.rpartition("/")
                entries[parent].append((name, None))
        for key, fid in self._meta_ids.items():
            parent, _, name = key.rpartition("/")
            entries[parent].append((name, fid))
        for listing in entries.values():
            listing.sort()
        self._dirs = entries
        self._grids = ChunkGrids(
            layout.arrays,
            base=len(self._meta_keys),
            meta_counts={name: len(entries[name]) for name in layout.arrays},
            root=root,
        )
        #: (array, start, resume): ensure() found no chunk in [start, resume)
        self._skip: tuple[int, int, int] | None = None

    @classmethod
    def open(
        cls,
        fs: Any,
        root: str,
        *,
        resolve: Callable[[str], str],
        mtime: float,
        record_cache_bytes: int = RECORD_CACHE_BYTES,
        record_bytes: int = RECORD_BYTES,
        load_timeout: float = 60.0,
    ) -> ParquetRefSet:
        """Read and validate ``ROOT/.zmetadata`` (and nothing else).  A record file that
        takes longer than ``load_timeout`` seconds to load, or whose columns take more than
        ``record_bytes`` decompressed, is an I/O error for its keys."""
        root = root.rstrip("/") or "/"
        return cls(
            fs,
            root,
            load_zmetadata(fs, root),
            resolve=resolve,
            mtime=mtime,
            record_cache_bytes=record_cache_bytes,
            record_bytes=record_bytes,
            load_timeout=load_timeout,
        )

    # --- keys and file ids: async entry points load, sync ones answer from memory -------

    async def find_file(self, key: str) -> int | None:
        fid = self._meta_ids.get(key)
        if fid is not None:
            return fid
        found = self._grids.parse_chunk(key)
        if found is None:
            return None
        arr, index = found
        record_no, row = divmod(index, self.record_size)
        record = await self._store.record(arr, record_no)
        return arr.base + index if record is not None and record.has(row) else None

    async def file_ref(self, file_id: int) -> Ref:
        if 0 <= file_id < len(self._meta_keys):
            return Ref(data=self._meta_bytes[file_id])
        arr, index = self._grids.chunk_of(file_id)
        record_no, row = divmod(index, self.record_size)
        return self._row_ref(arr, index, await self._store.record(arr, record_no), row)

    def file_id(self, key: str) -> int | None:
        fid = self._meta_ids.get(key)
        if fid is not None:
            return fid
        found = self._grids.parse_chunk(key)
        if found is None:
            return None
        arr, index = found
        record_no, row = divmod(index, self.record_size)
        record = self._held(arr, record_no, key)
        return arr.base + index if record is not None and record.has(row) else None

    def ref(self, file_id: int) -> Ref:
        if 0 <= file_id < len(self._meta_keys):
            return Ref(data=self._meta_bytes[file_id])
        arr, index = self._grids.chunk_of(file_id)
        record_no, row = divmod(index, self.record_size)
        return self._row_ref(arr, index, self._held(arr, record_no, file_id), row)

    def file_size(self, file_id: int) -> int | None:
        """Without building a :class:`Ref`; a row that is refused claims a size too (see
        :meth:`Record.size`): its key stats, and its read is EIO."""
        if 0 <= file_id < len(self._meta_keys):
            return len(self._meta_bytes[file_id])
        arr, index = self._grids.chunk_of(file_id)
        record_no, row = divmod(index, self.record_size)
        record = self._held(arr, record_no, file_id)
        if record is None or not record.has(row):
            raise KeyError(f"file id {file_id}: no such chunk")
        return record.size(row)

    def key(self, file_id: int) -> str:
        if 0 <= file_id < len(self._meta_keys):
            return self._meta_keys[file_id]
        arr, index = self._grids.chunk_of(file_id)
        return arr.prefix + arr.chunk_name(index)

    def _held(self, arr: ChunkGrid, record_no: int, what: object) -> Record | None:
        """A held record (None: its file is absent); NotLoaded when it is not held."""
        record = self._store.held(arr, record_no)
        if record is None:
            raise NotLoaded(f"{what!r}: record {record_no} of {arr.name!r} is not loaded")
        return None if record is ABSENT else record  # type: ignore[return-value]

    @staticmethod
    def _row_ref(arr: ChunkGrid, index: int, record: Record | None, row: int) -> Ref:
        """A row's reference; FetchError (EIO) naming the key when it is refused."""
        if record is None or not record.has(row):
            raise KeyError(f"{arr.prefix}{arr.chunk_name(index)}: no such chunk")
        try:
            return record.ref(row)
        except FetchError as exc:
            raise FetchError(f"{arr.prefix}{arr.chunk_name(index)}: {exc}") from None

    # --- directories ------------------------------------------------------------------

    def is_dir(self, path: str) -> bool:
        return path in self._dirs or self._grids.index_dir(path) is not None

    async def ensure(self, path: str, after: int = -1) -> None:
        """Load what ``children(path, after)`` needs to list at least one entry, or to
        reach the end: the records (in worker threads) up to the first with a chunk in
        the listing's range.  FetchError when one cannot be read."""
        listing = self._grids.listing_range(path, after)
        if listing is None:
            return
        arr, start, stop = listing
        first_start = start
        if start < stop:
            await self._store.list_records(arr)
        size = self.record_size
        while start < stop:
            record_no = self._store.next_record(arr, start // size, (stop - 1) // size)
            if record_no is None:
                start = stop
                break
            first = record_no * size
            start, end = max(start, first), min(stop, first + size)
            record = await self._store.record(arr, record_no)
            if record is not None and record.any_in(start - first, end - first):
                break
            start = end
        self._skip = (arr.index, first_start, start)

    def children(self, path: str, after: int = -1) -> Iterator[Child]:
        """Entries after cursor ``after``; nothing for a path that is not a directory.
        Chunks are listed from held records only (see the module docstring)."""
        entries = self._dirs.get(path)
        if entries is not None:
            for pos in range(max(after + 1, 0), len(entries)):
                name, fid = entries[pos]
                yield Child(name, fid, pos)
            arr = self._grids.by_name.get(path)
            if arr is not None:
                yield from self._array_children(arr, after - arr.meta_count)
            return
        found = self._grids.index_dir(path)
        if found is not None:
            yield from self._index_children(*found, after)

    def subdirectory_count(self, path: str) -> int:
        """Counted without listing chunks: only nested index directories are
        subdirectories of arrays, and those exist for the whole grid."""
        entries = self._dirs.get(path)
        if entries is not None:
            count = sum(1 for _, fid in entries if fid is None)
            arr = self._grids.by_name.get(path)
            if arr is not None and arr.nested and arr.ndim > 1 and arr.nchunks:
                count += arr.grid[0]
            return count
        found = self._grids.index_dir(path)
        if found is None:
            return 0
        arr, indices = found
        return arr.grid[len(indices)] if len(indices) < arr.ndim - 1 else 0

    def _array_children(self, arr: ChunkGrid, after: int) -> Iterator[Child]:
        """The chunks (or first-level index directories) of an array, after ``after``."""
        cursor0 = arr.meta_count
        if arr.nested and arr.ndim > 1:
            if arr.nchunks:
                for i in range(max(after + 1, 0), arr.grid[0]):
                    yield Child(str(i), None, cursor0 + i)
            return
        for batch in self._present(arr, max(after + 1, 0), arr.nchunks):
            for name, index in zip(arr.chunk_names(batch), batch.tolist(), strict=True):
                yield Child(name, arr.base + index, cursor0 + index)

    def _index_children(self, arr: ChunkGrid, indices: list[int], after: int) -> Iterator[Child]:
        level = len(indices)
        start = max(after + 1, 0)
        if level < arr.ndim - 1:
            for i in range(start, arr.grid[level]):
                yield Child(str(i), None, i)
            return
        lo = arr.index_dir_start(indices)
        for batch in self._present(arr, lo + start, lo + arr.grid[-1]):
            for index in batch.tolist():
                yield Child(str(index - lo), arr.base + index, index - lo)

    def _present(self, arr: ChunkGrid, start: int, stop: int) -> Iterator[np.ndarray]:
        """Indices (int64) in ``[start, stop)`` of the chunks that exist, in batches, from
        held records: it stops before the first record that is not held.

        Batches cover windows of chunk indices that start small and grow: a listing
        resumed for a few entries (one FUSE readdir call) pays for a few names, a long
        listing for few batches."""
        if self._skip is not None and self._skip[:2] == (arr.index, start):
            start = self._skip[2]
        size = self.record_size
        window = _FIRST_BATCH
        while start < stop:
            record_no = self._store.next_record(arr, start // size, (stop - 1) // size)
            if record_no is None:
                return
            record = self._store.held(arr, record_no)
            if record is None:
                return
            first = record_no * size
            start, end = max(start, first), min(stop, first + size)
            while record is not ABSENT and start < end:
                rows = record.rows_in(start - first, min(start + window, end) - first)
                start = min(start + window, end)
                window = min(window * 2, _MAX_BATCH)
                if len(rows):
                    yield rows + first
            start = end

    # --- statistics and cleanup -------------------------------------------------------

    @property
    def root(self) -> str:
        """The reference set's directory, as given to ``fs``."""
        return self._root

    @property
    def record_reads(self) -> int:
        """Record files opened so far (tests and statistics)."""
        return self._store.reads

    @property
    def cache_bytes(self) -> int:
        """Bytes of decoded records held now."""
        return self._store.cache_bytes

    @property
    def cached_records(self) -> int:
        return self._store.cached_records

    def close(self) -> None:
        self._store.close()

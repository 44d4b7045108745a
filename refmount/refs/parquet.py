"""Parquet reference sets (fsspec's ``LazyReferenceMapper`` layout), read lazily.

Layout (see the spec's "Parquet references")::

    ROOT/.zmetadata                 {"metadata": {key: value}, "record_size": N, ...}
    ROOT/<array path>/refs.<R>.parq rows path/offset/size/raw, N per file

Opening reads only ``.zmetadata``; a record file is read when a key in it is looked up or
its directory is listed, and decoded records live in a byte-bounded LRU as a few compact
numpy / pyarrow arrays, never a Python object per row (``parquet_records``, imported with
numpy and pyarrow on the first record read, so that a mount answers before either loads).

Tree rules (what refmount shows, where fsspec is silent or wrong):

* Every metadata key is a file, plus a synthesized root ``.zmetadata`` (zarr consolidated
  metadata of all metadata keys).  A metadata key named ``.zmetadata`` at the root is
  replaced by the synthesized one.
* Keys with an empty, ``.`` or ``..`` component, a leading ``/``, NUL or a component over
  255 bytes are skipped with a warning.  An array nested inside another array is skipped;
  below an array only direct metadata children whose name does not start with a digit are
  kept (others could collide with chunk keys).  A file key that is also a directory is
  skipped: the directory wins.
* Chunk keys are canonical: each index is ASCII decimal without sign or leading zeros
  (``0``, ``12``; not ``00``, ``-0``, ``+1``), one index per dimension, inside the chunk
  grid ``ceil(shape / chunks)``; a scalar array has the one chunk ``0``.  Anything else
  is not a file.  A chunk whose row is empty, invalid or in a missing record file does
  not exist and is not listed.
* For ``dimension_separator: "/"`` arrays, every index directory inside the grid exists
  (and is listed), whether or not any chunk below it exists: this needs no record reads.
  The chunk files in the last level are listed only when they exist.

File ids: metadata files ``0..M-1`` in sorted key order; then each array (sorted by
name) owns the block ``base + chunk index`` (C order).  Directory cursors: the position
in the sorted entry list; in an array directory, chunk entries follow with cursor
``len(metadata entries) + chunk index`` (first index for nested arrays), and in a nested
index directory the cursor is the index itself.  Resuming is a jump, never a rescan.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from refmount.errors import FetchError, RefsError
from refmount.refs.model import Child, Ref, RefSet
from refmount.refs.values import inline_bytes

if TYPE_CHECKING:  # numpy and pyarrow are imported on the first record read
    import numpy as np

    from refmount.refs.parquet_records import Record

log = logging.getLogger(__name__)

ZMETADATA = ".zmetadata"
#: file ids must fit comfortably in inode numbers
MAX_FILE_IDS = 1 << 48
#: rows of a record are numbered with int32
_MAX_RECORD_SIZE = (1 << 31) - 1
_INDEX_RE = re.compile(r"0|[1-9][0-9]{0,19}")
_RECORD_NAME_RE = re.compile(r"refs\.(0|[1-9][0-9]{0,19})\.parq")
#: what a remembered "this record file does not exist" costs in the LRU
_MISSING_COST = 64
_RESOLVE_CACHE_MAX = 4096
_WARN_ONCE_MAX = 10_000
_FIRST_BATCH = 64
_MAX_BATCH = 8192


@dataclass(frozen=True, slots=True)
class _Array:
    """One zarr array: its chunk grid and where its file ids and record files are."""

    name: str  # "" for an array at the root
    index: int  # position in ParquetRefSet._arrays
    grid: tuple[int, ...]  # chunks per dimension; (1,) for a scalar
    strides: tuple[int, ...]  # C-order strides over the grid
    nchunks: int
    nested: bool  # dimension_separator "/"
    base: int  # file id of chunk 0
    meta_count: int  # metadata entries listed before the chunks in its directory
    record_dir: str  # ROOT or ROOT/name

    @property
    def prefix(self) -> str:
        return f"{self.name}/" if self.name else ""

    @property
    def ndim(self) -> int:
        """Number of indices in a chunk key."""
        return len(self.grid)

    def ravel(self, parts: list[str]) -> int | None:
        """The chunk index of canonical index strings, or None when not a chunk."""
        if len(parts) != len(self.grid):
            return None
        index = 0
        for part, size, stride in zip(parts, self.grid, self.strides, strict=True):
            if not _INDEX_RE.fullmatch(part):
                return None
            i = int(part)
            if i >= size:
                return None
            index += i * stride
        return index

    def unravel(self, index: int) -> list[int]:
        out = []
        for stride in self.strides:
            i, index = divmod(index, stride)
            out.append(i)
        return out

    def chunk_name(self, index: int) -> str:
        """The key of a chunk, relative to the array directory."""
        return ("/" if self.nested else ".").join(map(str, self.unravel(index)))

    def chunk_names(self, indices: np.ndarray) -> list[str]:
        """:meth:`chunk_name` of many indices (int64: file ids stay below 2**48)."""
        import numpy as np  # loaded with the record the indices come from

        columns = [list(map(str, c.tolist())) for c in np.unravel_index(indices, self.grid)]
        return list(map(("/" if self.nested else ".").join, zip(*columns, strict=True)))


_NOT_CACHED = object()


class _RecordCache:
    """LRU of decoded records (``None``: the file does not exist), bounded by bytes.

    Thread-safe: records are loaded in worker threads and read from the event loop.
    A record larger than the whole budget is not kept.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.bytes = 0
        self._items: OrderedDict[tuple[int, int], Record | None] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _cost(record: Record | None) -> int:
        return _MISSING_COST if record is None else record.nbytes

    def get(self, key: tuple[int, int]) -> Any:
        """The cached record, ``None`` for a known-missing file, or ``_NOT_CACHED``."""
        with self._lock:
            if key not in self._items:
                return _NOT_CACHED
            self._items.move_to_end(key)
            return self._items[key]

    def __contains__(self, key: tuple[int, int]) -> bool:
        with self._lock:
            return key in self._items

    def put(self, key: tuple[int, int], record: Record | None) -> None:
        cost = self._cost(record)
        with self._lock:
            old = self._items.pop(key, _NOT_CACHED)
            if old is not _NOT_CACHED:
                self.bytes -= self._cost(old)
            if cost > self.capacity:
                return
            while self._items and self.bytes + cost > self.capacity:
                _, evicted = self._items.popitem(last=False)
                self.bytes -= self._cost(evicted)
            self._items[key] = record
            self.bytes += cost

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.bytes = 0


# --- opening: .zmetadata ------------------------------------------------------------


def _bad_key_reason(key: str) -> str | None:
    """Why a key cannot be a path in the tree, or None when it can."""
    if not key:
        return "empty key"
    if key.startswith("/"):
        return "leading '/'"
    if "\0" in key:
        return "NUL in key"
    for part in key.split("/"):
        if part in ("", ".", ".."):
            return f"component {part!r}"
        if len(part.encode("utf-8", "surrogatepass")) > 255:
            return "component longer than 255 bytes"
    return None


def _ancestors(path: str) -> Iterator[str]:
    """The proper ancestors of a path, nearest first, ending with the root ``""``."""
    while path:
        path = path.rpartition("/")[0]
        yield path


def _as_json(value: Any, key: str) -> Any:
    """A metadata value as a JSON value: strings are parsed (RefsError when not JSON)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise RefsError(f"key {key!r}: invalid JSON ({exc})") from None
    return value


def _consolidated_value(value: Any) -> Any:
    """A value for the synthesized ``.zmetadata``: JSON text becomes the object it holds."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        if isinstance(parsed, dict | list):
            return parsed
    return value


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parse_zarray(key: str, value: Any) -> tuple[tuple[int, ...], bool]:
    """Validate an array's ``.zarray``: its chunk grid and whether keys nest with ``/``."""
    meta = _as_json(value, key)
    if not isinstance(meta, dict):
        raise RefsError(f"key {key!r}: .zarray must be a JSON object")
    shape, chunks = meta.get("shape"), meta.get("chunks")
    for name, val in (("shape", shape), ("chunks", chunks)):
        if not isinstance(val, list) or not all(_is_count(v) for v in val):
            raise RefsError(f"key {key!r}: {name} must be a list of non-negative integers")
    assert isinstance(shape, list) and isinstance(chunks, list)
    if len(shape) != len(chunks):
        raise RefsError(f"key {key!r}: shape and chunks have different lengths")
    if any(c == 0 for c in chunks):
        raise RefsError(f"key {key!r}: chunks must be positive")
    separator = meta.get("dimension_separator")
    if separator not in (None, ".", "/"):
        raise RefsError(f"key {key!r}: dimension_separator must be '.' or '/'")
    grid = tuple(math.ceil(s / c) for s, c in zip(shape, chunks, strict=True)) or (1,)
    return grid, separator == "/"


def _load_zmetadata(fs: Any, root: str) -> tuple[dict[str, Any], int]:
    path = f"{root}/{ZMETADATA}"
    try:
        with fs.open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise RefsError(f"{path}: no such file") from None
    except OSError as exc:
        raise RefsError(f"{path}: cannot read ({exc})") from None
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise RefsError(f"{path}: invalid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise RefsError(f"{path}: expected a JSON object")
    metadata, record_size = doc.get("metadata"), doc.get("record_size")
    if not isinstance(metadata, dict):
        raise RefsError(f"{path}: 'metadata' must be a JSON object")
    if not _is_count(record_size) or not 0 < record_size <= _MAX_RECORD_SIZE:
        raise RefsError(
            f"{path}: 'record_size' must be an integer from 1 to {_MAX_RECORD_SIZE}, "
            f"got {record_size!r}"
        )
    return metadata, record_size


@dataclass
class _Layout:
    """What ``.zmetadata`` says: metadata files, arrays and directories."""

    files: dict[str, Any]  # kept metadata key -> value
    arrays: dict[str, tuple[tuple[int, ...], bool]]  # array name -> grid, nested
    dirs: set[str]


def _layout(metadata: dict[str, Any]) -> _Layout:
    """Apply the tree rules of the module docstring to the metadata keys."""
    values: dict[str, Any] = {}
    for key, value in metadata.items():
        reason = _bad_key_reason(key)
        if reason:
            log.warning("skipping metadata key %r: %s", key, reason)
        elif key == ZMETADATA:
            log.info("replacing the stored root .zmetadata key by the synthesized one")
        else:
            values[key] = value

    grids = {}
    for key, value in values.items():
        name, _, base = key.rpartition("/")
        if base == ".zarray":
            grids[name] = _parse_zarray(key, value)
    arrays = {}
    for name, grid in grids.items():
        if any(a in grids for a in _ancestors(name)):
            log.warning("skipping array %r: nested inside another array", name)
        else:
            arrays[name] = grid

    files = {}
    for key, value in values.items():
        parent, _, base = key.rpartition("/")
        owner = next(
            (p for p in ((parent, *_ancestors(parent)) if parent else ("",)) if p in arrays),
            None,
        )
        if owner is not None and (owner != parent or base[0].isdigit()):
            log.warning("skipping metadata key %r: inside array %r's chunk keys", key, owner)
            continue
        files[key] = value

    dirs = {""}
    for path in (*files, *(f"{a}/x" if a else "x" for a in arrays)):
        for ancestor in _ancestors(path):
            if ancestor in dirs:
                break
            dirs.add(ancestor)
    for key in [k for k in files if k in dirs]:
        log.warning("skipping metadata key %r: it is also a directory", key)
        del files[key]
    return _Layout(files, arrays, dirs)


# --- the reference set ----------------------------------------------------------------


@dataclass
class _Load:
    """One record load in flight, shared by every caller that needs it."""

    done: trio.Event = field(default_factory=trio.Event)
    error: FetchError | None = None


class ParquetRefSet(RefSet):
    """A LazyReferenceMapper directory, mounted without reading its record files."""

    def __init__(
        self,
        fs: Any,
        root: str,
        layout: _Layout,
        record_size: int,
        *,
        resolve: Callable[[str], str],
        mtime: float,
        record_cache_bytes: int,
        load_timeout: float,
    ) -> None:
        self.mtime = mtime
        self._load_timeout = load_timeout
        self.record_size = record_size
        self._fs = fs
        self._root = root
        self._resolve = resolve
        self._resolved: dict[str, str | None] = {}
        self._warned: set[str] = set()
        self._cache = _RecordCache(record_cache_bytes)
        #: array index -> record numbers whose files exist (None: the listing failed)
        self._listed: dict[int, list[int] | None] = {}
        self._inflight: dict[object, _Load] = {}
        #: record files opened so far (tests and statistics)
        self.record_reads = 0

        consolidated = {k: _consolidated_value(v) for k, v in layout.files.items()}
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

        self._arrays: list[_Array] = []
        base = len(self._meta_keys)
        for name in sorted(layout.arrays):
            grid, nested = layout.arrays[name]
            strides = tuple(math.prod(grid[i + 1 :]) for i in range(len(grid)))
            nchunks = math.prod(grid)
            if base + nchunks > MAX_FILE_IDS:
                raise RefsError(f"key {name + '/.zarray'!r}: too many chunks ({nchunks})")
            self._arrays.append(
                _Array(
                    name=name,
                    index=len(self._arrays),
                    grid=grid,
                    strides=strides,
                    nchunks=nchunks,
                    nested=nested,
                    base=base,
                    meta_count=len(entries[name]),
                    record_dir=f"{root}/{name}" if name else root,
                )
            )
            base += nchunks
        self._bases = [a.base for a in self._arrays]
        self._by_name = {a.name: a for a in self._arrays}
        self._max_nested_ndim = max((a.ndim for a in self._arrays if a.nested), default=0)

    @classmethod
    def open(
        cls,
        fs: Any,
        root: str,
        *,
        resolve: Callable[[str], str],
        mtime: float,
        record_cache_bytes: int = 256 << 20,
        load_timeout: float = 60.0,
    ) -> ParquetRefSet:
        """Read and validate ``ROOT/.zmetadata`` (and nothing else).  A record file that
        takes longer than ``load_timeout`` seconds to load is an I/O error."""
        root = root.rstrip("/") or "/"
        metadata, record_size = _load_zmetadata(fs, root)
        return cls(
            fs,
            root,
            _layout(metadata),
            record_size,
            resolve=resolve,
            mtime=mtime,
            record_cache_bytes=record_cache_bytes,
            load_timeout=load_timeout,
        )

    # --- keys and file ids ------------------------------------------------------------

    def _parse_chunk(self, key: str) -> tuple[_Array, int] | None:
        """The array and chunk index of a chunk key (its record is not consulted)."""
        parent, _, leaf = key.rpartition("/")
        arr = self._by_name.get(parent)
        if arr is not None and not arr.nested:
            index = arr.ravel(leaf.split("."))
            return None if index is None else (arr, index)
        if self._max_nested_ndim:
            parts = key.split("/")
            for n in range(1, min(len(parts), self._max_nested_ndim) + 1):
                arr = self._by_name.get("/".join(parts[:-n]))
                if arr is not None and arr.nested and arr.ndim == n:
                    index = arr.ravel(parts[-n:])
                    return None if index is None else (arr, index)
        return None

    def _index_dir(self, path: str) -> tuple[_Array, list[int]] | None:
        """A nested array's index directory: the array and the indices in ``path``."""
        parts = path.split("/")
        for n in range(1, min(len(parts), self._max_nested_ndim - 1) + 1):
            arr = self._by_name.get("/".join(parts[:-n]))
            if arr is None or not arr.nested or n >= arr.ndim or arr.nchunks == 0:
                continue
            indices = []
            for part, size in zip(parts[-n:], arr.grid, strict=False):
                if not _INDEX_RE.fullmatch(part) or int(part) >= size:
                    return None
                indices.append(int(part))
            return arr, indices
        return None

    def file_id(self, key: str) -> int | None:
        where = self._where(key)
        if where is None or isinstance(where, int):
            return where
        arr, index, record_no, row = where
        record = self._record(arr, record_no)
        return arr.base + index if record is not None and record.has(row) else None

    def _where(self, key: str) -> int | tuple[_Array, int, int, int] | None:
        """A metadata key's file id; a chunk key's array, chunk index, record number and
        row in the record; None for a key that can be neither."""
        fid = self._meta_ids.get(key)
        if fid is not None:
            return fid
        found = self._parse_chunk(key)
        if found is None:
            return None
        arr, index = found
        return arr, index, *divmod(index, self.record_size)

    def _chunk_of(self, file_id: int) -> tuple[_Array, int]:
        pos = bisect.bisect_right(self._bases, file_id) - 1
        if file_id < 0 or pos < 0:
            raise KeyError(f"unknown file id {file_id}")
        arr = self._arrays[pos]
        index = file_id - arr.base
        if index >= arr.nchunks:
            raise KeyError(f"unknown file id {file_id}")
        return arr, index

    def key(self, file_id: int) -> str:
        if 0 <= file_id < len(self._meta_keys):
            return self._meta_keys[file_id]
        arr, index = self._chunk_of(file_id)
        return arr.prefix + arr.chunk_name(index)

    def ref(self, file_id: int) -> Ref:
        if 0 <= file_id < len(self._meta_keys):
            return Ref(data=self._meta_bytes[file_id])
        arr, index = self._chunk_of(file_id)
        record_no, row = divmod(index, self.record_size)
        record = self._record(arr, record_no)
        if record is None or not record.has(row):
            raise KeyError(f"file id {file_id}: no such chunk")
        return record.ref(row)

    # --- directories ------------------------------------------------------------------

    def is_dir(self, path: str) -> bool:
        return path in self._dirs or self._index_dir(path) is not None

    def children(self, path: str, after: int = -1) -> Iterator[Child]:
        """Entries after cursor ``after``; nothing for a path that is not a directory."""
        entries = self._dirs.get(path)
        if entries is not None:
            for pos in range(max(after + 1, 0), len(entries)):
                name, fid = entries[pos]
                yield Child(name, fid, pos)
            arr = self._by_name.get(path)
            if arr is not None:
                yield from self._array_children(arr, after - arr.meta_count)
            return
        found = self._index_dir(path)
        if found is not None:
            yield from self._index_children(*found, after)

    def subdirectory_count(self, path: str) -> int:
        """Counted without listing chunks: only nested index directories are
        subdirectories of arrays, and those exist for the whole grid."""
        entries = self._dirs.get(path)
        if entries is not None:
            count = sum(1 for _, fid in entries if fid is None)
            arr = self._by_name.get(path)
            if arr is not None and arr.nested and arr.ndim > 1 and arr.nchunks:
                count += arr.grid[0]
            return count
        found = self._index_dir(path)
        if found is None:
            return 0
        arr, indices = found
        return arr.grid[len(indices)] if len(indices) < arr.ndim - 1 else 0

    def _array_children(self, arr: _Array, after: int) -> Iterator[Child]:
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

    def _index_children(self, arr: _Array, indices: list[int], after: int) -> Iterator[Child]:
        level = len(indices)
        start = max(after + 1, 0)
        if level < arr.ndim - 1:
            for i in range(start, arr.grid[level]):
                yield Child(str(i), None, i)
            return
        lo = sum(i * s for i, s in zip(indices, arr.strides, strict=False))
        for batch in self._present(arr, lo + start, lo + arr.grid[-1]):
            for index in batch.tolist():
                yield Child(str(index - lo), arr.base + index, index - lo)

    def _listing_range(self, path: str, after: int) -> tuple[_Array, int, int] | None:
        """The array and chunk index range ``[start, stop)`` a listing will read."""
        arr = self._by_name.get(path)
        if arr is not None:
            if arr.nested and arr.ndim > 1:
                return None
            return arr, max(after + 1 - arr.meta_count, 0), arr.nchunks
        found = self._index_dir(path)
        if found is None:
            return None
        arr, indices = found
        if len(indices) < arr.ndim - 1:
            return None
        lo = sum(i * s for i, s in zip(indices, arr.strides, strict=False))
        return arr, lo + max(after + 1, 0), lo + arr.grid[-1]

    def _present(self, arr: _Array, start: int, stop: int) -> Iterator[np.ndarray]:
        """Indices (int64) in ``[start, stop)`` of the chunks that exist, in batches.

        Batches cover windows of chunk indices that start small and grow: a listing
        resumed for a few entries (one FUSE readdir call) pays for a few names, a long
        listing for few batches."""
        size = self.record_size
        window = _FIRST_BATCH
        while start < stop:
            record_no = self._next_record(arr, start // size, (stop - 1) // size)
            if record_no is None:
                return
            first = record_no * size
            start, end = max(start, first), min(stop, first + size)
            record = self._record(arr, record_no)
            while record is not None and start < end:
                rows = record.rows_in(start - first, min(start + window, end) - first)
                start = min(start + window, end)
                window = min(window * 2, _MAX_BATCH)
                if len(rows):
                    yield rows + first
            start = end

    def _next_record(self, arr: _Array, record_no: int, last: int) -> int | None:
        """The first record number from ``record_no`` up to ``last`` whose file exists
        (as far as a directory listing of the record files tells)."""
        listed = self._listed_records(arr)
        if listed is not None:
            pos = bisect.bisect_left(listed, record_no)
            if pos == len(listed):
                return None
            record_no = listed[pos]
        return record_no if record_no <= last else None

    def _listed_records(self, arr: _Array) -> list[int] | None:
        """Record numbers whose files exist, from one listing of the array's directory;
        None when the directory cannot be listed (every record is then tried)."""
        if arr.index not in self._listed:
            self._listed[arr.index] = self._list_records(arr)
        return self._listed[arr.index]

    def _list_records(self, arr: _Array) -> list[int] | None:
        try:
            names = self._fs.ls(arr.record_dir, detail=False)
        except FileNotFoundError:
            # No such directory, or a store that cannot list (HTTP): try every record;
            # a missing record file still means missing chunks.
            return None
        except OSError as exc:
            self._warn_once(f"ls:{arr.record_dir}", "cannot list %s: %s", arr.record_dir, exc)
            return None
        nrecords = -(-arr.nchunks // self.record_size)
        numbers = []
        for name in names:
            match = _RECORD_NAME_RE.fullmatch(str(name).rstrip("/").rpartition("/")[2])
            if match and int(match[1]) < nrecords:
                numbers.append(int(match[1]))
        return sorted(numbers)

    # --- records ----------------------------------------------------------------------

    def _record(self, arr: _Array, record_no: int) -> Record | None:
        """A decoded record (loading it on a miss), or None when it has no file."""
        key = (arr.index, record_no)
        hit = self._cache.get(key)
        if hit is not _NOT_CACHED:
            return hit
        if self._known_missing(arr, record_no):
            return None
        record = self._read_record(arr, record_no)
        self._cache.put(key, record)
        return record

    def _known_missing(self, arr: _Array, record_no: int) -> bool:
        """Whether a listing of the array's directory showed no file for the record."""
        listed = self._listed.get(arr.index)
        if listed is None:
            return False
        pos = bisect.bisect_left(listed, record_no)
        return pos == len(listed) or listed[pos] != record_no

    def _read_record(self, arr: _Array, record_no: int) -> Record | None:
        path = f"{arr.record_dir}/refs.{record_no}.parq"
        self.record_reads += 1
        try:
            with self._fs.open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise FetchError(f"reading {path}: {exc}") from exc
        from refmount.refs.parquet_records import DECODE_ERRORS, decode

        try:
            return decode(data, path, self._resolve_one, self._warn_once)
        except DECODE_ERRORS as exc:
            self._warn_once(
                path, "unreadable record file %s (%s): its chunks are treated as missing", path, exc
            )
            return None

    def _resolve_one(self, target: str | None, record_path: str) -> str | None:
        """A row path as a full URL, or None (logged once) when it cannot be used."""
        if not target:
            return None
        known = self._resolved.get(target, _NOT_CACHED)
        if known is not _NOT_CACHED:
            return known  # type: ignore[return-value]
        try:
            url: str | None = self._resolve(target)
        except (RefsError, ValueError) as exc:
            self._warn_once(f"url:{target}", "%s: unusable path %r: %s", record_path, target, exc)
            url = None
        if len(self._resolved) >= _RESOLVE_CACHE_MAX:
            self._resolved.clear()
        self._resolved[target] = url
        return url

    def _warn_once(self, tag: str, message: str, *args: object) -> None:
        if tag in self._warned:
            return
        if len(self._warned) < _WARN_ONCE_MAX:
            self._warned.add(tag)
        log.warning(message, *args)

    # --- loading from trio ------------------------------------------------------------

    async def ensure(self, path: str, after: int = -1) -> None:
        """Load, in a worker thread, what ``file_id(path)``/``ref`` or
        ``children(path, after)`` will need first; concurrent callers share one load.

        A listing that runs past the loaded record loads the next one synchronously.
        """
        found = None if path in self._meta_ids else self._parse_chunk(path)
        if found is not None:
            arr, index = found
            await self._ensure_record(arr, index // self.record_size)
            return
        listing = self._listing_range(path, after)
        if listing is None:
            return
        arr, start, stop = listing
        if start >= stop:
            return
        if arr.index not in self._listed:
            await self._shared_load(("ls", arr.index), self._listed_records, arr)
        record_no = self._next_record(
            arr, start // self.record_size, (stop - 1) // self.record_size
        )
        if record_no is not None:
            await self._ensure_record(arr, record_no)

    async def find_file(self, key: str) -> int | None:
        """:meth:`file_id`, loading the record it needs first (the key is parsed once)."""
        where = self._where(key)
        if where is None or isinstance(where, int):
            return where
        arr, index, record_no, row = where
        record = await self._loaded_record(arr, record_no)
        return arr.base + index if record is not None and record.has(row) else None

    async def file_ref(self, file_id: int) -> Ref:
        """:meth:`ref`, loading the record it needs first (no key is built)."""
        if 0 <= file_id < len(self._meta_keys):
            return Ref(data=self._meta_bytes[file_id])
        arr, index = self._chunk_of(file_id)
        record_no, row = divmod(index, self.record_size)
        record = await self._loaded_record(arr, record_no)
        if record is None or not record.has(row):
            raise KeyError(f"file id {file_id}: no such chunk")
        return record.ref(row)

    async def _loaded_record(self, arr: _Array, record_no: int) -> Record | None:
        """A record, loaded in a worker thread on a miss."""
        hit = self._cache.get((arr.index, record_no))
        if hit is not _NOT_CACHED:
            return hit
        await self._ensure_record(arr, record_no)
        return self._record(arr, record_no)

    async def _ensure_record(self, arr: _Array, record_no: int) -> None:
        if (arr.index, record_no) not in self._cache and not self._known_missing(arr, record_no):
            await self._shared_load((arr.index, record_no), self._record, arr, record_no)

    async def _shared_load(self, tag: object, fn: Callable[..., object], *args: Any) -> None:
        """Run one load in a worker thread, with a deadline; concurrent callers wait for
        it and share its outcome (a stalled store fails them all, none retries it on the
        event loop)."""
        load = self._inflight.get(tag)
        if load is None:
            load = self._inflight[tag] = _Load()
            try:
                with trio.fail_after(self._load_timeout):
                    await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)
            except trio.TooSlowError:
                load.error = FetchError(
                    f"{self._root}: a record file did not load within {self._load_timeout:g} s"
                )
            finally:
                del self._inflight[tag]
                load.done.set()
        else:
            await load.done.wait()
        if load.error is not None:
            raise load.error

    # --- statistics and cleanup -------------------------------------------------------

    @property
    def root(self) -> str:
        """The reference set's directory, as given to ``fs``."""
        return self._root

    @property
    def cache_bytes(self) -> int:
        """Bytes of decoded records held now."""
        return self._cache.bytes

    @property
    def cached_records(self) -> int:
        return len(self._cache)

    def close(self) -> None:
        self._cache.clear()
        self._listed.clear()

"""A reference set held in memory as sorted, compact columns (JSON sets of any size).

Keys are sorted by their UTF-8 bytes, so every directory is one contiguous run of rows
(all keys under ``p/`` lie between ``p/`` and ``p0``, ``0`` being the byte after ``/``):
lookups are binary searches and listings are scans that skip whole subdirectories, and
nothing per directory or per key is built beyond the columns themselves.  A file's id is
its row.
"""

from __future__ import annotations

import bisect
import logging
from collections import Counter
from collections.abc import Iterator
from itertools import repeat

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fsspec.core import split_protocol

from refmount.refs import arrays
from refmount.refs.jsonrefs import WHOLE_FILE
from refmount.refs.model import Child, Ref, RefSet

log = logging.getLogger(__name__)

MAX_WARNINGS = 100  # odd keys reported one by one; past this, a count
MAX_NAME_BYTES = 255
_LISTING_BATCH = 1024  # keys decoded at a time by a listing
_BAD_KEY = r"(^$)|(^/)|(/$)|(//)|((^|/)\.\.?(/|$))|\x00"


class _SortedKeys:
    """Binary search over a sorted Arrow string column without a Python object per key."""

    def __init__(self, keys: pa.LargeStringArray) -> None:
        self._array = keys
        data = keys.buffers()[2]
        self._offsets = memoryview(arrays.offsets(keys))
        self._data = memoryview(data) if data is not None else memoryview(b"")

    def __len__(self) -> int:
        return len(self._array)

    @property
    def nbytes(self) -> int:
        return int(self._array.nbytes)

    def __getitem__(self, i: int) -> bytes:
        return bytes(self._data[self._offsets[i] : self._offsets[i + 1]])

    def texts(self, start: int, stop: int) -> list[str]:
        """The keys of rows ``[start, stop)``, decoded in one go."""
        return self._array.slice(start, stop - start).to_pylist()

    def text(self, i: int) -> str:
        return str(self._data[self._offsets[i] : self._offsets[i + 1]], "utf-8")

    def find(self, key: bytes) -> int:
        """The first row whose key is >= ``key``."""
        return bisect.bisect_left(self, key)


class TableRefSet(RefSet):
    def __init__(
        self,
        table: pa.Table,
        urls: list[str],
        *,
        mtime: float,
        name: str,
    ) -> None:
        """``table`` has the columns of :meth:`Columns.table`, in file order."""
        self.mtime = mtime
        self.urls = urls
        table, directories = _index(_rank0_chunk_keys(table), name)
        self._subdirectories = Counter(d.rpartition("/")[0] for d in directories)
        self._keys = _SortedKeys(table.column("key").combine_chunks())
        # memoryviews: indexing one gives a Python int, indexing NumPy a NumPy scalar
        self._url_index = memoryview(arrays.view(table.column("url"), np.int32))
        self._offsets = memoryview(arrays.view(table.column("offset"), np.int64))
        self._lengths = memoryview(arrays.view(table.column("length"), np.int64))
        self._inline = table.column("inline").combine_chunks()
        self._extents = _url_extents(table, self.urls)

    def __len__(self) -> int:
        return len(self._keys)

    def memory_bytes(self) -> int:
        columns = (self._url_index, self._offsets, self._lengths)
        held = self._keys.nbytes + self._inline.nbytes + sum(c.nbytes for c in columns)
        return held + sum(len(url) + 50 for url in self.urls)  # a str object's overhead

    def file_id(self, key: str) -> int | None:
        encoded = key.encode("utf-8", "surrogatepass")
        row = self._keys.find(encoded)
        if row < len(self._keys) and self._keys[row] == encoded:
            return row
        return None

    def key(self, file_id: int) -> str:
        return self._keys.text(file_id)

    def ref(self, file_id: int) -> Ref:
        url_id = self._url_index[file_id]
        if url_id < 0:
            return Ref(data=self._inline[file_id].as_py())
        length = self._lengths[file_id]
        return Ref(
            url=self.urls[url_id],
            offset=self._offsets[file_id],
            length=None if length == WHOLE_FILE else length,
        )

    def file_size(self, file_id: int) -> int | None:
        length = self._lengths[file_id]  # inline rows hold their data's length
        return None if length == WHOLE_FILE else length

    def is_dir(self, path: str) -> bool:
        if not path:
            return True
        prefix = path.encode("utf-8", "surrogatepass") + b"/"
        row = self._keys.find(prefix)
        return row < len(self._keys) and self._keys[row].startswith(prefix)

    def children(self, path: str, after: int = -1) -> Iterator[Child]:
        keys = self._keys
        prefix = path.encode("utf-8", "surrogatepass") + b"/" if path else b""
        end = keys.find(prefix[:-1] + b"0") if prefix else len(keys)
        row = max(keys.find(prefix), after + 1)
        chars = len(path) + 1 if path else 0
        new_child = tuple.__new__  # Child(...) without its Python-level __new__: per entry
        while row < end:
            # Keys are decoded a batch at a time, in bulk: a listing of a million chunks
            # must not cost a million slices and decodes in Python.
            stop = min(end, row + _LISTING_BATCH)
            names = [key[chars:] for key in keys.texts(row, stop)]
            if "/" not in "".join(names):  # files only, the usual batch: no loop in Python
                ids = range(row, stop)
                yield from map(new_child, repeat(Child), zip(names, ids, ids, strict=True))
                row = stop
                continue
            for rest in names:
                if "/" not in rest:
                    yield new_child(Child, (rest, row, row))
                    row += 1
                    continue
                name = rest.partition("/")[0]
                subtree_end = keys.find(prefix + name.encode("utf-8", "surrogatepass") + b"0")
                # The cursor is the subtree's last row, so resuming skips all of it.
                yield Child(name, None, subtree_end - 1)
                row = subtree_end
                break  # the batch ran into a subtree: decode afresh after it

    def subdirectory_count(self, path: str) -> int:
        return self._subdirectories.get(path, 0)

    def url_extent(self, url: str) -> int | None:
        return self._extents.get(url)

    def protocols(self) -> set[str]:
        return {split_protocol(url)[0] or "file" for url in self.urls}

    def target_urls(self) -> list[str]:
        return self.urls


def _rank0_chunk_keys(table: pa.Table) -> pa.Table:
    """VirtualiZarr's chunk key of a rank-0 Zarr v2 array, ``name/``, as ``name/0``: the
    key zarr asks for.  A key ending in ``/`` cannot be a path (fsspec never serves it
    either), so zarr would read the fill value in its place.  Only where ``name/.zarray``
    is a key, so that no other key ending in ``/`` (a directory marker) becomes a file,
    and ``name/0`` is not: the key zarr asks for wins over its stand-in, in whatever
    order the two come (the stand-in is then skipped as unusable, and logged).  Before
    the keys are checked; a set without such keys costs one pass over its keys."""
    column = table.schema.get_field_index("key")
    keys = table.column(column)
    rows = np.flatnonzero(arrays.mask(pc.ends_with(keys, "/")))
    if not len(rows):
        return table
    names = [keys[int(row)].as_py()[:-1] for row in rows]
    every_key = keys.combine_chunks()
    metadata = arrays.strings([f"{name}/.zarray" for name in names])
    arrays_ = arrays.mask(pc.is_in(metadata, value_set=every_key))
    explicit = arrays.mask(pc.is_in(arrays.strings([f"{n}/0" for n in names]), every_key))
    chosen = np.zeros(len(keys), bool)
    for row, name, is_array, has_zero in zip(rows.tolist(), names, arrays_, explicit, strict=True):
        chosen[row] = is_array and not has_zero and bool(name) and not name.endswith("/")
    if not chosen.any():
        return table
    zero = pa.scalar("0", keys.type)
    renamed = pc.binary_join_element_wise(keys, zero, pa.scalar("", keys.type))
    keys = pc.if_else(pa.array(chosen), renamed, keys)
    return table.set_column(column, "key", keys)


def _index(table: pa.Table, name: str) -> tuple[pa.Table, list[str]]:
    """The rows sorted by key, where a key repeats only its last row, without the keys
    that cannot be paths or are files shadowed by a directory; and the directories.

    Rule: a key with an empty, ``.`` or ``..`` component, a leading or trailing ``/``, a
    NUL, a component over 255 bytes or invalid UTF-8 is skipped; a key that is both a file
    and the prefix of other keys (``a`` and ``a/b``) is a directory, and its own value is
    skipped.  Each skipped key is logged once.  The checks run on the sorted keys alone;
    the whole table is gathered once, at the end.
    """
    pool = arrays.POOL
    table = table.combine_chunks(pool)  # a take from one chunk is many times faster
    # stable: the rows of a key stay in file order
    order = pc.sort_indices(table.column("key"), memory_pool=pool)
    keys = pc.take(table.column("key").combine_chunks(pool), order, memory_pool=pool)
    keep = np.ones(len(keys), bool)
    if len(keys) > 1:
        repeated = arrays.mask(pc.equal(keys.slice(0, len(keys) - 1), keys.slice(1)))
        keep[:-1] &= ~repeated
    warnings = _Warnings(name)
    bad = _unusable(keys) & keep
    if bad.any():
        warnings.keys(keys, bad, _UNUSABLE)
        keep &= ~bad
    directories = _directories(keys, keep)
    shadowed = pc.is_in(keys, value_set=arrays.strings(directories), memory_pool=pool)
    shadowed = arrays.mask(shadowed) & keep
    if shadowed.any():
        warnings.keys(keys, shadowed, "is also a directory of other keys; the directory is kept")
        keep &= ~shadowed
    warnings.summary()
    rows = arrays.view(order, np.uint64)[keep]
    return pc.take(table, arrays.numbers(rows, pa.uint64()), memory_pool=pool), directories


_UNUSABLE = (
    "not a usable path: empty, '.' or '..' component, leading or trailing '/', NUL, "
    "a component over 255 bytes, or invalid UTF-8"
)


def _unusable(keys: pa.Array) -> np.ndarray:
    bad = arrays.mask(pc.match_substring_regex(keys, _BAD_KEY, memory_pool=arrays.POOL))
    bad |= arrays.mask(pc.match_substring(keys, "\ufffd", memory_pool=arrays.POOL))
    long = np.flatnonzero(np.diff(arrays.offsets(keys)) > MAX_NAME_BYTES)
    for row in long[~bad[long]].tolist():
        bad[row] = _has_long_component(keys[row].as_py())
    return bad


def _directories(keys: pa.Array, keep: np.ndarray) -> list[str]:
    """Every directory the kept (sorted) keys imply: their parents and the ancestors.

    No Python work per key: the length of each key's parent comes from NumPy, and a run of
    rows with parents of one length has one parent when its first and last rows do (the
    keys are sorted, so all between share that prefix); other runs are halved until so.
    """
    if not len(keys):
        return []
    offsets = arrays.offsets(keys)
    data = keys.buffers()[2]
    slashes = np.flatnonzero(np.frombuffer(data or b"", np.uint8) == ord("/"))
    parent_length = np.full(len(keys), -1, np.int64)
    if len(slashes):
        before_end = np.searchsorted(slashes, offsets[1:]) - 1  # the last slash before
        last = slashes[np.maximum(before_end, 0)]  # each key's end, if that is in the key
        nested = keep & (before_end >= 0) & (last >= offsets[:-1])
        parent_length[nested] = (last - offsets[:-1])[nested]
    edges = np.flatnonzero(np.diff(parent_length)) + 1
    runs = list(zip([0, *edges.tolist()], [*edges.tolist(), len(keys)], strict=True))
    parents: set[bytes] = set()
    while runs:
        first, end = runs.pop()
        size = int(parent_length[first])
        if size < 0:
            continue
        start = int(offsets[first])
        parent = data[start : start + size].to_pybytes()
        last_start = int(offsets[end - 1])
        if data[last_start : last_start + size].to_pybytes() == parent:
            parents.add(parent)
        else:
            middle = (first + end) // 2
            runs += [(first, middle), (middle, end)]
    directories: set[str] = set()
    for parent_bytes in parents:
        parent = parent_bytes.decode("utf-8", "surrogatepass")
        while parent and parent not in directories:
            directories.add(parent)
            parent = parent.rpartition("/")[0]
    return sorted(directories)


class _Warnings:
    """One warning per skipped key, up to a bound, then a count."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0

    def keys(self, key: pa.Array, mask: np.ndarray, reason: str) -> None:
        rows = np.flatnonzero(mask)
        for row in rows[: max(0, MAX_WARNINGS - self.count)].tolist():
            log.warning("%s: skipping key %r: %s", self.name, key[row].as_py(), reason)
        self.count += len(rows)

    def summary(self) -> None:
        if self.count > MAX_WARNINGS:
            log.warning("%s: skipped %d more keys", self.name, self.count - MAX_WARNINGS)


def _has_long_component(key: str) -> bool:
    return any(
        len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES for part in key.split("/")
    )


def _url_extents(table: pa.Table, urls: list[str]) -> dict[str, int]:
    """For each URL that only ranges point into, the end of its furthest referenced byte."""
    url = arrays.view(table.column("url"), np.int32)
    remote = url >= 0
    url, offset = url[remote], arrays.view(table.column("offset"), np.int64)[remote]
    length = arrays.view(table.column("length"), np.int64)[remote]
    ends = np.full(len(urls), -1, np.int64)
    np.maximum.at(ends, url, offset + length)
    whole = np.zeros(len(urls), bool)
    whole[url[length == WHOLE_FILE]] = True
    return {
        urls[url_id]: end
        for url_id, end in enumerate(ends.tolist())
        if end >= 0 and not whole[url_id]
    }
